"""Measure a CUDA GPU's DLRM parts with PyTorch: fused lookups, their backward, dense layers and
a whole one-GPU step (no all-to-all), for the GPU DLRM step model.

Run on the GPU machine (needs only torch and the standard library)::

    python -m planner.measure.tables.gpu_dlrm --out DIR [--quick] [--only step,tbe,gemm,memory]

FBGEMM's fused table-batched embedding (TBE) is not on the GPU machines this project borrows, so the
lookups are PyTorch's own kernels arranged the way a TBE works: every table's rows in one weight,
all tables' bags in one ``F.embedding_bag`` call (one kernel for all tables, as TBE launches one),
and a backward that does what TBE's fused backward does, step by step: sort the ids
(``torch.unique``), sum each distinct row's gradient (``index_add_``), apply row-wise Adagrad to the
distinct rows only. ``--kernel triton`` times the same lookups with fused Triton kernels shaped like
FBGEMM's (:mod:`planner.measure.tables.gpu_tbe_triton`; checked against the PyTorch ops first, the
result in ``meta.json``). Ids are uniform over the rows or Zipf-distributed (rank ``k`` drawn with
probability ∝ ``k^-a``, ranks scattered over the table by a multiplicative hash, so hot rows are not
neighbours).

It writes, in ``DIR`` (each CSV row as soon as it is measured, so a run cut short keeps its rows):

``tbe.csv``
    One fused lookup per row: ``tables`` tables of ``rows`` rows each, ``dim``, ``pooling`` ids per
    bag, ``batch`` bags per table, weight ``dtype``, id distribution ``ids``; ``distinct`` rows
    touched; ``forward_s`` (pooled gather), ``backward_s`` (sort, gradient sum, row-wise Adagrad
    update of the distinct rows).
``parts.csv``
    The backward's parts alone on the same inputs (``sort_s``, ``reduce_s``, ``update_s``), so a
    model can charge each by its own bytes.
``gemm.csv``
    ``nn.Linear`` layers of DLRM shapes (bottom/top MLP, DCNv2 low-rank cross layers) at batches
    1k–64k, bf16 / tf32 / fp32, forward and forward+backward, replayed from CUDA graphs (GPU time
    only), with FLOPs.
``step.csv``
    The MLPerf DLRM-DCNv2 model on one GPU (26 tables of dim 128 with its multi-hot sizes, bottom
    MLP 512-256-128, 3 low-rank DCNv2 layers, top MLP 1024-1024-512-256-1, bf16 autocast, fp32
    tables with row-wise Adagrad, dense Adagrad), eager, per per-GPU batch and id distribution:
    the phases of a step (lookup forward, dense forward+backward, lookup backward+update, dense
    optimizer) from CUDA events, and the whole step.
``memory.csv``
    Activation memory of Llama-style blocks (bf16, flash attention, micro-batch 1) at long
    sequences: bytes kept for backward per layer and the peak over forward and backward.
``meta.json``
    GPU, driver, torch, CUDA, date, command, wall time per part, and the table rows used.

Timing: CUDA events; the time is the median of ``--samples`` samples (each the mean of enough
back-to-back calls to last ~20 ms); ``iqr_rel`` the samples' inter-quartile range over the median.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from pathlib import Path

from planner.measure.compute.driver import check_driver_args, driver_parser
from planner.measure.compute.gpu_timing import auto_time, run_meta
from planner.measure.tables.gpu_fused import _DTYPES, FusedTables, check_triton, lookup_kernels

__all__ = ["main", "MLPERF_DCNV2_TABLES"]

#: the parts ``--only`` may name
_PARTS = ("step", "tbe", "gemm", "memory")

#: (rows, multi-hot size) of MLPerf DLRM-DCNv2's 26 tables (planner/examples/mlperf-dcnv2.yaml)
MLPERF_DCNV2_TABLES = [
    (40_000_000, 3), (39_060, 2), (17_295, 1), (7_424, 2), (20_265, 6), (3, 1), (7_122, 1),
    (1_543, 1), (63, 1), (40_000_000, 7), (3_067_956, 3), (405_282, 8), (10, 1), (2_209, 6),
    (11_938, 9), (155, 5), (4, 1), (976, 1), (14, 1), (40_000_000, 12), (40_000_000, 100),
    (40_000_000, 27), (590_152, 10), (12_973, 3), (108, 1), (36, 1)]


class _Rows:
    """A CSV file written one row at a time (flushed), header from the first row."""

    def __init__(self, path: Path):
        self.path, self.fh, self.w = path, None, None

    def add(self, row: dict) -> None:
        if self.w is None:
            self.fh = self.path.open("w", newline="")
            self.w = csv.DictWriter(self.fh, fieldnames=list(row))
            self.w.writeheader()
        self.w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _torch():
    import torch
    return torch


# -- parts ---------------------------------------------------------------------------------------
def _tbe_configs(quick: bool) -> list[tuple]:
    """(tables, rows per table, dim, pooling, batch, dtype, ids)."""
    if quick:
        return [(2, 1000, 16, 4, 64, "fp32", "uniform"), (2, 1000, 16, 4, 64, "fp32", "zipf1.1")]
    out = []
    for dist in ("uniform", "zipf1.05", "zipf1.2"):
        for dim in (32, 64, 128, 256):
            for pool in (1, 8, 32):
                out.append((8, 4_000_000, dim, pool, 16_384, "fp32", dist))
    for rows in (10_000, 100_000, 1_000_000, 10_000_000, 40_000_000):
        for dist in ("uniform", "zipf1.05"):
            out.append((4, rows, 128, 16, 16_384, "fp32", dist))
    for batch in (2_048, 8_192, 65_536):
        out.append((8, 4_000_000, 128, 16, batch, "fp32", "uniform"))
    for dim in (64, 128):
        for dist in ("uniform", "zipf1.05"):
            out.append((8, 4_000_000, dim, 16, 16_384, "fp16", dist))
    return out


def _time_parts(ft, lk, grad, dev, samples: int) -> dict:
    """Seconds of the backward's parts: the sort, the gradient sum (NaN where the kernel fuses
    it into the update) and the row update."""
    if lk is ft:
        uniq, inv = ft.sort()
        acc = ft.reduce(grad, uniq, inv)
        ts, _ = auto_time(ft.sort, dev, samples=samples)
        tr, _ = auto_time(lambda: ft.reduce(grad, uniq, inv), dev, samples=samples)
        tu, _ = auto_time(lambda: ft.update(uniq, acc.clone()), dev, samples=samples)
        tc, _ = auto_time(lambda: acc.clone(), dev, samples=samples)
        return dict(sort_s=ts, reduce_s=tr, update_s=max(tu - tc, 0.0))
    runs = lk.sort()
    ts, _ = auto_time(lk.sort, dev, samples=samples)
    tu, _ = auto_time(lambda: lk.update(grad, *runs), dev, samples=samples)
    return dict(sort_s=ts, reduce_s=float("nan"), update_s=tu)


def measure_tbe(dev, *, quick: bool, samples: int, out: Path, deadline: float,
                kernel: str = "torch") -> int:
    torch = _torch()
    main_rows, part_rows, n = _Rows(out / "tbe.csv"), _Rows(out / "parts.csv"), 0
    for (tables, rows, dim, pool, batch, dtype, dist) in _tbe_configs(quick):
        if time.monotonic() > deadline:
            print(f"tbe: budget spent after {n} rows", flush=True)
            break
        ft = FusedTables([(rows, pool)] * tables, dim, batch, dtype, dist, dev)
        lk = lookup_kernels(ft, kernel, pool)
        grad = torch.randn(ft.bags, dim, device=dev, dtype=ft.weight.dtype)
        tf, iqr_f = auto_time(lk.forward, dev, samples=samples)
        tb, iqr_b = auto_time(lambda: lk.backward(grad), dev, samples=samples)
        key = dict(kernel=kernel, tables=tables, rows=rows, dim=dim, pooling=pool, batch=batch,
                   dtype=dtype, ids=dist, lookups=ft.ids.numel(), distinct=ft.distinct)
        main_rows.add(key | dict(forward_s=tf, backward_s=tb, iqr_rel_fwd=iqr_f,
                                 iqr_rel_bwd=iqr_b))
        part_rows.add(key | _time_parts(ft, lk, grad, dev, samples))
        n += 1
        ft = lk = grad = None                   # free the GPU memory now
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    main_rows.close()
    part_rows.close()
    return n


def _gemm_layers() -> list[tuple[str, int, int]]:
    """(name, in features, out features) of the MLPerf DLRM-DCNv2 dense part."""
    return [("bottom0", 13, 512), ("bottom1", 512, 256), ("bottom2", 256, 128),
            ("dcn_v", 3456, 512), ("dcn_u", 512, 3456), ("top0", 3456, 1024),
            ("top1", 1024, 1024), ("top2", 1024, 512), ("top3", 512, 256), ("top4", 256, 1)]


def measure_gemm(dev, *, quick: bool, samples: int, out: Path, deadline: float) -> int:
    torch = _torch()
    rows, n = _Rows(out / "gemm.csv"), 0
    batches = (64,) if quick else (1_024, 4_096, 8_192, 16_384, 65_536)
    dtypes = ("fp32",) if quick else ("bf16", "tf32", "fp32")
    graph = dev.type == "cuda"
    for dtype in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        tdt = torch.float32 if dtype in ("tf32", "fp32") else getattr(torch, _DTYPES[dtype])
        for batch in batches:
            for name, k, m in _gemm_layers():
                if time.monotonic() > deadline:
                    print(f"gemm: budget spent after {n} rows", flush=True)
                    rows.close()
                    return n
                lin = torch.nn.Linear(k, m, device=dev, dtype=tdt)
                x = torch.randn(batch, k, device=dev, dtype=tdt, requires_grad=True)
                g = torch.randn(batch, m, device=dev, dtype=tdt)

                def fb():
                    lin(x).backward(g)
                tf, iqr_f = auto_time(lambda: lin(x), dev, samples=samples, graph=graph)
                try:
                    tfb, iqr_fb = auto_time(fb, dev, samples=samples, graph=graph)
                    mode = "graph" if graph else "eager"
                except RuntimeError:                # a backward that cannot be captured
                    tfb, iqr_fb = auto_time(fb, dev, samples=samples)
                    mode = "eager"
                rows.add(dict(layer=name, batch=batch, in_features=k, out_features=m,
                              dtype=dtype, forward_flops=2.0 * batch * k * m, forward_s=tf,
                              forward_backward_s=tfb, backward_mode=mode, iqr_rel_fwd=iqr_f,
                              iqr_rel_fb=iqr_fb))
                n += 1
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.close()
    return n


def _dcnv2_model(dev):
    torch = _torch()
    nn = torch.nn

    def mlp(sizes, last_act=True):
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if last_act or i < len(sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

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


def measure_step(dev, *, quick: bool, samples: int, out: Path, deadline: float,
                 max_table_bytes: float, kernel: str = "torch") -> int:
    """The one-GPU DLRM-DCNv2 step (see the module docstring), phases timed with CUDA events."""
    torch = _torch()
    import torch.nn.functional as F
    rows, n = _Rows(out / "step.csv"), 0
    big = [r for r, _ in MLPERF_DCNV2_TABLES if r >= 1_000_000]
    cap = max(big)
    if sum(big) * 128 * 4 > max_table_bytes:           # the large tables cut to fit the GPU
        cap = max(1, int(max_table_bytes / (128 * 4 * len(big))))
    tables = [(min(r, cap), p) for r, p in MLPERF_DCNV2_TABLES]
    if quick:
        tables = [(min(r, 1000), p) for r, p in MLPERF_DCNV2_TABLES]
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
            model = _dcnv2_model(dev)
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


#: (hidden, ffn, heads, kv heads, seq, layers) of the activation-memory probe
MEMORY_BLOCKS = [(4096, 14336, 32, 8, s, 2) for s in (4096, 16384, 32768, 65536)] + \
    [(8192, 28672, 64, 8, s, 1) for s in (8192, 32768)]


def measure_memory(dev, *, quick: bool, samples: int, out: Path, deadline: float) -> int:
    """Bytes a Llama-style block (bf16, flash SDPA, micro-batch 1) keeps for backward: memory
    allocated after the forward minus before, per layer, and the peak over forward+backward."""
    from planner.measure.compute.gpu_blocks import block_class
    from planner.measure.compute.gpu_timing import flash_ctx
    del samples
    torch = _torch()
    Block = block_class()
    rows, n = _Rows(out / "memory.csv"), 0
    configs = [(256, 512, 4, 2, 128, 2)] if quick else MEMORY_BLOCKS
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for (h, f, heads, kv, seq, layers) in configs:
        if time.monotonic() > deadline:
            break
        blocks = torch.nn.Sequential(*[Block(h, f, heads, kv) for _ in range(layers)]) \
            .to(dev, dt)
        x = torch.randn(1, seq, h, device=dev, dtype=dt, requires_grad=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
        with flash_ctx()():
            y = blocks(x)
            kept = (torch.cuda.memory_allocated(dev) - before) if dev.type == "cuda" else 0
            y.sum().backward()
        peak = (torch.cuda.max_memory_allocated(dev) - before) if dev.type == "cuda" else 0
        rows.add(dict(hidden=h, ffn=f, heads=heads, kv_heads=kv, seq=seq, micro_batch=1,
                      layers=layers, dtype=str(dt).removeprefix("torch."),
                      kept_bytes_per_layer=kept / layers, peak_bytes=peak,
                      param_bytes=sum(p.numel() * p.element_size() for p in blocks.parameters())))
        n += 1
        del blocks, x, y
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    rows.close()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = driver_parser("planner.measure.tables.gpu_dlrm", __doc__, samples=5, budget_s=400.0)
    ap.add_argument("--only", default="step,tbe,gemm", help="comma-separated parts, in order")
    ap.add_argument("--max-table-gib", type=float, default=None,
                    help="cap on the step's large tables together (default: 72%% of GPU memory)")
    ap.add_argument("--kernel", default="torch", choices=("torch", "triton"),
                    help="lookups by PyTorch ops (default) or the fused Triton kernels")
    args = ap.parse_args(argv)
    args.attention_backend = "n/a"
    unknown = [p for p in args.only.split(",") if p not in _PARTS]
    if unknown:
        ap.error(f"--only: unknown part {unknown[0]!r}; use {', '.join(_PARTS)}")
    check_driver_args(ap, args, ("--max-table-gib", args.max_table_gib or 1.0))
    torch = _torch()
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = run_meta(dev, args, " ".join(
        ["python", "-m", "planner.measure.tables.gpu_dlrm", *(argv if argv is not None
                                                              else sys.argv[1:])]))
    mem = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else 2**30
    max_table = args.max_table_gib * 2**30 if args.max_table_gib else 0.72 * mem
    if args.kernel == "triton":
        try:
            meta["triton_check"] = check_triton(dev)
        except Exception as exc:                    # a kernel that does not compile here
            meta["triton_check"] = f"failed: {exc!r}"[:400]
        print(f"triton check: {meta['triton_check']}", flush=True)
        if meta["triton_check"] != "ok":
            (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            return 1
    parts = args.only.split(",")
    share = {"step": 0.3, "tbe": 0.4, "gemm": 0.3, "memory": 0.05}
    start = time.monotonic()
    for i, part in enumerate(parts):
        t0 = time.monotonic()
        left = max(0.0, args.budget_s - (t0 - start))
        weight = sum(share.get(p, 0.3) for p in parts[i:])
        deadline = t0 + left * share.get(part, 0.3) / weight
        kw = dict(quick=args.quick, samples=args.samples, out=args.out, deadline=deadline)
        try:
            if part == "step":
                n = measure_step(dev, max_table_bytes=max_table, kernel=args.kernel, **kw)
            elif part == "tbe":
                n = measure_tbe(dev, kernel=args.kernel, **kw)
            elif part == "gemm":
                n = measure_gemm(dev, **kw)
            elif part == "memory":
                n = measure_memory(dev, **kw)
            else:
                raise AssertionError(part)          # checked with the arguments
        except Exception as exc:                    # keep the other parts' rows
            meta[f"{part}_error"] = repr(exc)[:400]
            print(f"{part}: failed: {exc!r}", flush=True)
            n = -1
        meta[f"{part}_wall_s"] = round(time.monotonic() - t0, 1)
        meta[f"{part}_rows"] = n
        print(f"{part}: {n} rows in {meta[f'{part}_wall_s']} s", flush=True)
        if dev.type == "cuda":
            meta[f"{part}_max_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            torch.cuda.empty_cache()
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    meta["wall_s"] = round(time.monotonic() - start, 1)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
