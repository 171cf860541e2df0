"""The MLPerf DLRM-DCNv2 model's step on one GPU, without all-to-alls: ``step.csv`` of
``python -m planner.measure.tables.gpu_dlrm`` (see that module for the model, the lookups and
the timing). Each step's phases (lookup forward, dense forward+backward, lookup backward and
update, dense optimizer) are timed with CUDA events; times are seconds.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from planner.measure.compute.gpu_timing import CsvRows, torch_module
from planner.measure.tables.gpu_fused import FusedTables, lookup_kernels

__all__ = ["MLPERF_DCNV2_TABLES", "dcnv2_dense_model", "measure_step", "mlp", "step_tables"]

#: (rows, multi-hot size) of MLPerf DLRM-DCNv2's 26 tables (planner/examples/mlperf-dcnv2.yaml)
MLPERF_DCNV2_TABLES = [
    (40_000_000, 3), (39_060, 2), (17_295, 1), (7_424, 2), (20_265, 6), (3, 1), (7_122, 1),
    (1_543, 1), (63, 1), (40_000_000, 7), (3_067_956, 3), (405_282, 8), (10, 1), (2_209, 6),
    (11_938, 9), (155, 5), (4, 1), (976, 1), (14, 1), (40_000_000, 12), (40_000_000, 100),
    (40_000_000, 27), (590_152, 10), (12_973, 3), (108, 1), (36, 1)]


def mlp(sizes, last_act: bool = True):
    """``nn.Linear`` layers through ``sizes``, each followed by a ReLU (the last one only with
    ``last_act``)."""
    nn = torch_module().nn
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dcnv2_dense_model(dev):
    """The model's dense part (fp32 weights) on ``dev``."""
    torch = torch_module()
    nn = torch.nn

    class Dense(nn.Module):
        """Bottom MLP, DCNv2 low-rank cross layers over [bottom output, 26 pooled embeddings],
        top MLP, logit."""

        def __init__(self):
            super().__init__()
            d = 27 * 128
            self.bottom = mlp([13, 512, 256, 128])
            self.v = nn.ModuleList(nn.Linear(d, 512, bias=False) for _ in range(3))
            self.u = nn.ModuleList(nn.Linear(512, d) for _ in range(3))
            self.top = mlp([d, 1024, 1024, 512, 256, 1], last_act=False)

        def forward(self, dense, pooled):                 # pooled: (batch, 26 * 128)
            x0 = torch.cat([self.bottom(dense), pooled], dim=1)
            x = x0
            for v, u in zip(self.v, self.u):
                x = x0 * u(v(x)) + x
            return self.top(x).squeeze(1)

    return Dense().to(dev)


def step_tables(max_table_bytes: float, quick: bool) -> list[tuple[int, int]]:
    """(rows, pooling) of the step's 26 tables: the large ones cut to ``max_table_bytes``
    together (fp32, dim 128) when they would not fit, all cut to 1,000 rows with ``quick``."""
    big = [r for r, _ in MLPERF_DCNV2_TABLES if r >= 1_000_000]
    cap = max(big)
    if sum(big) * 128 * 4 > max_table_bytes:
        cap = max(1, int(max_table_bytes / (128 * 4 * len(big))))
    if quick:
        cap = 1000
    return [(min(r, cap), p) for r, p in MLPERF_DCNV2_TABLES]


def measure_step(dev, *, quick: bool, samples: int, out: Path, deadline: float,
                 max_table_bytes: float, kernel: str = "torch") -> int:
    """The one-GPU DLRM-DCNv2 step (see the module docstring), phases timed with CUDA events."""
    torch = torch_module()
    import torch.nn.functional as F
    rows, n = CsvRows(out / "step.csv"), 0
    tables = step_tables(max_table_bytes, quick)
    batches = (64,) if quick else (2_048, 8_192, 16_384, 32_768)
    steps = 3 if quick else max(samples, 8)
    for dist in ("uniform", "zipf1.05"):
        ft = None
        for batch in batches:
            if time.monotonic() > deadline:
                print(f"step: budget spent after {n} rows", flush=True)
                rows.close()
                return n
            ft = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            ft = FusedTables(tables, 128, batch, "fp32", dist, dev, seed=1)
            lk = lookup_kernels(ft, kernel, max(p for _, p in tables))
            model = dcnv2_dense_model(dev)
            opt = torch.optim.Adagrad(model.parameters(), lr=0.01, foreach=True)
            dense = torch.randn(batch, 13, device=dev)
            label = (torch.rand(batch, device=dev) < 0.25).float()
            phases = ("lookup_fwd", "dense_fwd_bwd", "lookup_bwd", "dense_opt")
            times = {p: [] for p in phases + ("step",)}

            def one_step(record):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)] if record else []

                def mark(i):
                    if ev:
                        ev[i].record()
                mark(0)
                pooled = lk.forward().view(len(tables), batch, 128).transpose(0, 1) \
                    .reshape(batch, -1).detach().requires_grad_(True)
                mark(1)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                    logit = model(dense, pooled)
                loss = F.binary_cross_entropy_with_logits(logit.float(), label)
                loss.backward()
                mark(2)
                grad = pooled.grad.view(batch, len(tables), 128).transpose(0, 1).reshape(-1, 128)
                lk.backward(grad)
                mark(3)
                opt.step()
                opt.zero_grad(set_to_none=True)
                mark(4)
                return ev

            for _ in range(3):
                one_step(False)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            for _ in range(steps):
                if dev.type != "cuda":
                    t0 = time.perf_counter()
                    one_step(False)
                    times["step"].append(time.perf_counter() - t0)
                    continue
                ev = one_step(True)
                ev[4].synchronize()
                for i, p in enumerate(phases):
                    times[p].append(ev[i].elapsed_time(ev[i + 1]) / 1e3)
                times["step"].append(ev[0].elapsed_time(ev[4]) / 1e3)
            med = {f"{p}_s": (statistics.median(v) if v else float("nan"))
                   for p, v in times.items()}
            q = statistics.quantiles(times["step"], n=4) if len(times["step"]) >= 4 else None
            rows.add(dict(kernel=kernel, batch=batch, ids=dist, tables=len(tables), table_rows=sum(
                r for r, _ in tables), lookups=ft.ids.numel(), distinct=ft.distinct, **med,
                step_iqr_rel=((q[2] - q[0]) / med["step_s"]) if q else float("nan"),
                steps=steps))
            n += 1
            model = opt = lk = None
        ft = None
    rows.close()
    return n
