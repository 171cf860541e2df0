"""A DLRM step on one GPU as a compiled trainer runs it: ``step_graphs.csv`` (MLPerf
DLRM-DCNv2) of ``python -m planner.measure.tables.gpu_dlrm --only graphstep``, and
``step_graphs_dot.csv`` (the original DLRM on Criteo's 26 one-hot tables, dot interaction,
``criteo-dlrm``) of ``--only graphstep-dot``.

``step.csv`` (:mod:`planner.measure.tables.gpu_dlrm_step`) is the eager trainer: every op
launched by the host, the dense part under autocast. Here the same model and tables run as a
trainer with ``dispatch: graphs`` and ``fusion: fused`` does: the dense part through
``torch.compile`` (Inductor fuses its elementwise ops), the fused lookups with a backward that
never waits for the host (``--kernel triton-nosync``), the dense Adagrad as multi-tensor ops, and
the whole step (lookups forward, dense forward and backward, lookups backward with row-wise
Adagrad, dense Adagrad) captured in one CUDA graph and replayed. Each row is one precision
(``autocast``: fp32 parameters, bf16 GEMMs; ``pure``: bf16 parameters and activations, the
pooled embeddings cast to bf16 inside the compiled part; ``tf32``: fp32 with TF32 GEMMs), per-GPU
batch and id distribution:
``graph_s`` (median seconds per replayed step), ``eager_s`` (the same step launched op by op:
the compiled kernels without the graph), their IQRs, and ``compile_s``.
"""

from __future__ import annotations

import time
from pathlib import Path

from planner.measure.compute.gpu_timing import CsvRows, auto_time, first_call_s, torch_module
from planner.measure.tables.gpu_dense import dot_dense_model
from planner.measure.tables.gpu_dlrm_step import dcnv2_dense_model, step_tables
from planner.measure.tables.gpu_fused import FusedTables, lookup_kernels

__all__ = ["measure_graph_step", "criteo_tables"]

#: the built-in spec whose table sizes the dot model's step uses
_CRITEO = Path(__file__).resolve().parents[2] / "examples" / "criteo-dlrm.yaml"

#: (precision, ids, per-GPU batch) measured, in order
CASES = (("autocast", "uniform", 8_192), ("pure", "uniform", 8_192),
         ("autocast", "uniform", 32_768), ("pure", "uniform", 32_768),
         ("pure", "uniform", 16_384), ("pure", "zipf1.05", 32_768),
         ("pure", "uniform", 2_048), ("autocast", "uniform", 16_384))
#: the same for the dot model
DOT_CASES = (("autocast", "uniform", 8_192), ("pure", "uniform", 8_192),
             ("autocast", "uniform", 32_768), ("pure", "uniform", 32_768),
             ("tf32", "uniform", 32_768), ("tf32", "uniform", 8_192))


def criteo_tables(quick: bool) -> list[tuple[int, int]]:
    """(rows, pooling 1) of ``criteo-dlrm``'s 26 tables (1,000 rows at most with ``quick``)."""
    import yaml
    doc = yaml.safe_load(_CRITEO.read_text(encoding="utf-8"))
    cap = 1000 if quick else None
    return [(min(t["num_embeddings"], cap or t["num_embeddings"]), 1) for t in doc["tables"]]


def _one_step(ft, lk, precision: str, dev, model_fn):
    """A function running one whole step (see the module docstring) on ``ft``'s batch with the
    dense part ``model_fn(dev)``."""
    torch = torch_module()
    import torch.nn.functional as F
    model = model_fn(dev)
    dtype = torch.bfloat16 if precision == "pure" else torch.float32
    model = model.to(dtype)
    tables, batch, dim = ft.bags // ft.batch, ft.batch, ft.dim

    def dense_part(dense, pooled):
        return model(dense, pooled.to(dtype))
    compiled = torch.compile(dense_part) if dev.type == "cuda" else dense_part
    params = list(model.parameters())
    sums = [torch.zeros_like(p) for p in params]
    dense = torch.randn(batch, 13, device=dev, dtype=dtype)
    label = (torch.rand(batch, device=dev) < 0.25).float()
    amp = precision == "autocast" and dev.type == "cuda"

    def step():
        pooled = lk.forward().view(tables, batch, dim).transpose(0, 1).reshape(batch, -1) \
            .detach().requires_grad_(True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logit = compiled(dense, pooled)
        loss = F.binary_cross_entropy_with_logits(logit.float(), label)
        gp, *grads = torch.autograd.grad(loss, [pooled, *params])
        lk.backward(gp.view(batch, tables, dim).transpose(0, 1).reshape(-1, dim))
        with torch.no_grad():
            torch._foreach_addcmul_(sums, grads, grads)
            std = torch._foreach_sqrt(sums)
            torch._foreach_add_(std, 1e-10)
            torch._foreach_addcdiv_(params, grads, std, value=-0.01)
    return step


def measure_graph_step(dev, *, quick: bool, samples: int, out: Path, deadline: float,
                       max_table_bytes: float, kernel: str = "triton-nosync",
                       dot: bool = False) -> int:
    """Times each of :data:`CASES` (``dot``: :data:`DOT_CASES` of the dot model; one tiny eager
    case with ``quick``); returns rows written. Only a ``kernel`` whose backward never waits for
    the host can be captured (others leave ``graph_s`` empty)."""
    torch = torch_module()
    rows, n = CsvRows(out / ("step_graphs_dot.csv" if dot else "step_graphs.csv")), 0
    tables = criteo_tables(quick) if dot else step_tables(max_table_bytes, quick)
    model_fn = dot_dense_model if dot else dcnv2_dense_model
    cases = (("autocast", "uniform", 64),) if quick else (DOT_CASES if dot else CASES)
    for precision, dist, batch in cases:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        if time.monotonic() > deadline:
            print(f"graphstep: budget spent after {n} rows", flush=True)
            break
        torch._dynamo.reset()
        ft = FusedTables(tables, 128, batch, "fp32", dist, dev, seed=1)
        step = _one_step(ft, lookup_kernels(ft, kernel, max(p for _, p in tables)), precision,
                         dev, model_fn)
        compile_s = first_call_s(step, dev)
        te, iqr_e = auto_time(step, dev, samples=samples)
        tg = iqr_g = float("nan")
        if dev.type == "cuda":
            try:
                tg, iqr_g = auto_time(step, dev, samples=samples, graph=True)
            except RuntimeError as exc:                 # a part that cannot be captured
                print(f"graphstep: no CUDA graph: {exc!r}"[:300], flush=True)
        rows.add(dict(kernel=kernel, precision=precision, batch=batch, ids=dist,
                      tables=len(tables), table_rows=sum(r for r, _ in tables),
                      lookups=ft.ids.numel(), distinct=ft.distinct, graph_s=tg, eager_s=te,
                      iqr_rel_graph=iqr_g, iqr_rel_eager=iqr_e, compile_s=round(compile_s, 2)))
        n += 1
        ft = step = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.close()
    return n
