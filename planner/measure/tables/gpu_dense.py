"""The dense parts of MLPerf DLRM-DCNv2 and of the original DLRM (dot interaction, Criteo's 26
features) on one GPU, forward and backward, as each trainer runs them: ``dense.csv`` of
``python -m planner.measure.tables.gpu_dlrm --only dense``.

The GPU step model prices the dense part by a trainer's ``dispatch`` (eager ops or CUDA graphs),
``fusion`` (one kernel per elementwise op, or fused into the GEMMs and each other) and
``mixed_precision`` (PyTorch autocast, or pure bf16). ``step.csv`` measured only the eager,
unfused, autocast case; this part times the others the way a PyTorch trainer gets them:

``eager``
    the module as written (one kernel per op, each launched by the host);
``graphs``
    ``torch.compile(mode="reduce-overhead")``: Inductor fuses the elementwise ops into each other
    and into their neighbours, and the whole forward and backward replay from CUDA graphs;

each under ``autocast`` (fp32 weights and inputs, bf16 GEMMs), ``pure`` (bf16 weights and
inputs; the loss in fp32) and, for the dot model, ``tf32`` (fp32 throughout, TF32 GEMMs). Shapes
are static per batch (a trainer's fixed batch). Columns: ``model`` (``mlperf-dcnv2-dense`` or
``dlrm-dot-dense``), ``mode``, ``precision``, ``batch``, ``fwd_bwd_s`` (forward, loss and
backward, median seconds per step over ``--samples`` samples of back-to-back steps),
``iqr_rel`` and ``compile_s`` (the first call's wall seconds, compilation included).
"""

from __future__ import annotations

import time
from pathlib import Path

from planner.measure.compute.gpu_timing import CsvRows, auto_time, first_call_s, torch_module
from planner.measure.tables.gpu_dlrm_step import dcnv2_dense_model, mlp

__all__ = ["measure_dense"]

#: (model, mode, precision), in the order they are measured
CASES = tuple(("mlperf-dcnv2-dense", m, p) for m, p in (
    ("graphs", "autocast"), ("graphs", "pure"), ("eager", "pure"), ("eager", "autocast"))) + tuple(
    ("dlrm-dot-dense", m, p) for m in ("graphs", "eager") for p in ("autocast", "pure", "tf32"))


def dot_dense_model(dev):
    """The original DLRM's dense part (``criteo-dlrm``): bottom MLP 13-512-256-128, the dot
    interaction of its output with 26 pooled embeddings of 128 (the 351 pairs below the
    diagonal, beside the bottom output: 479 columns), top MLP 1024-1024-512-256-1."""
    torch = torch_module()
    nn = torch.nn

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.bottom = mlp([13, 512, 256, 128])
            self.top = mlp([479, 1024, 1024, 512, 256, 1], last_act=False)
            li, lj = torch.tril_indices(27, 27, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)

        def forward(self, dense, pooled):                 # pooled: (batch, 26 * 128)
            x = self.bottom(dense)
            t = torch.cat([x.unsqueeze(1), pooled.view(x.shape[0], 26, 128)], dim=1)
            z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
            return self.top(torch.cat([x, z], dim=1)).squeeze(1)

    return Dense().to(dev)


_MODELS = {"mlperf-dcnv2-dense": dcnv2_dense_model, "dlrm-dot-dense": dot_dense_model}


def _step_fn(model, mode: str, precision: str, batch: int, dev):
    """A function running one forward, loss and backward of ``model`` on fresh-shaped inputs."""
    torch = torch_module()
    import torch.nn.functional as F
    dtype = torch.bfloat16 if precision == "pure" else torch.float32
    if precision == "pure":
        model = model.to(torch.bfloat16)
    dense = torch.randn(batch, 13, device=dev, dtype=dtype)
    pooled = torch.randn(batch, 26 * 128, device=dev, dtype=dtype, requires_grad=True)
    label = (torch.rand(batch, device=dev) < 0.25).float()
    fwd = torch.compile(model, mode="reduce-overhead") if mode == "graphs" else model
    params = list(model.parameters())
    amp = precision == "autocast" and dev.type == "cuda"

    def step():
        if mode == "graphs":
            torch.compiler.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        pooled.grad = None
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logit = fwd(dense, pooled)
        F.binary_cross_entropy_with_logits(logit.float(), label).backward()
    return step


def measure_dense(dev, *, quick: bool, samples: int, out: Path, deadline: float) -> int:
    """Times each (model, mode, precision) of :data:`CASES` at per-GPU batches 8k–32k (64 with
    ``quick``, eager only: CPU Inductor is not what a GPU trainer runs); returns rows written."""
    torch = torch_module()
    torch._dynamo.config.automatic_dynamic_shapes = False      # a fixed batch: static kernels
    rows, n = CsvRows(out / "dense.csv"), 0
    batches = (64,) if quick else (8_192, 32_768)
    cases = [c for c in CASES if c[1] == "eager"] if quick else CASES
    for name, mode, precision in cases:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        for batch in batches:
            if time.monotonic() > deadline:
                print(f"dense: budget spent after {n} rows", flush=True)
                rows.close()
                return n
            torch._dynamo.reset()
            step = _step_fn(_MODELS[name](dev), mode, precision, batch, dev)
            compile_s = first_call_s(step, dev)
            t, iqr = auto_time(step, dev, samples=samples)
            rows.add(dict(model=name, mode=mode, precision=precision,
                          batch=batch, fwd_bwd_s=t, iqr_rel=iqr, compile_s=round(compile_s, 2)))
            n += 1
            step = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.close()
    return n
