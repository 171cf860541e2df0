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
result in ``meta.json``); ``--kernel triton-nosync`` with a backward that never waits for the
host, as FBGEMM's (:mod:`planner.measure.tables.gpu_tbe_nosync`). Ids are uniform over the rows or
Zipf-distributed (rank ``k`` drawn with probability ∝ ``k^-a``, ranks scattered over the table by
a multiplicative hash, so hot rows are not neighbours).

It writes, in ``DIR`` (each CSV row as soon as it is measured, so a run cut short keeps its rows):

``tbe.csv``
    One fused lookup per row: ``tables`` tables of ``rows`` rows each, ``dim``, ``pooling`` ids per
    bag, ``batch`` bags per table, weight ``dtype``, id distribution ``ids``; ``distinct`` rows
    touched; ``forward_s`` (pooled gather), ``backward_s`` (sort, gradient sum, row-wise Adagrad
    update of the distinct rows), calls issued back to back from the host; with
    ``--kernel triton-nosync`` also ``forward_graph_s`` / ``backward_graph_s``, the same calls
    replayed from a CUDA graph (the GPU's time alone).
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
``dense.csv``
    The DCNv2 dense part's forward and backward per trainer mode (eager or compiled with CUDA
    graphs) and precision (autocast or pure bf16): :mod:`planner.measure.tables.gpu_dense`.
``interaction.csv``
    The dot interaction's batched GEMMs (aligned and not), the first top layer at 479 / 480
    inputs, and the pair gather's backward: :mod:`planner.measure.tables.gpu_interaction`.
``step_graphs.csv``, ``step_graphs_dot.csv``
    The same step (``graphstep``) and the dot-interaction DLRM's on Criteo's tables
    (``graphstep-dot``) as a compiled trainer runs them, captured in one CUDA graph:
    :mod:`planner.measure.tables.gpu_graph_step`.
``memory.csv``
    Activation memory of Llama-style blocks (bf16, flash attention, micro-batch 1) at long
    sequences: bytes kept for backward per layer and the peak over forward and backward.
``meta.json``
    GPU, driver, torch, CUDA, date, command, wall time per part, and the table rows used.

Timing: CUDA events; the time is the median of ``--samples`` samples (each the mean of enough
back-to-back calls to last ~20 ms); ``iqr_rel`` the samples' inter-quartile range over the median.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from planner.measure.compute.driver import check_driver_args, driver_parser
from planner.measure.compute.gpu_memory import measure_memory
from planner.measure.compute.gpu_timing import CsvRows, auto_time, run_meta
from planner.measure.tables.gpu_dense import measure_dense
from planner.measure.tables.gpu_dlrm_step import measure_step
from planner.measure.tables.gpu_fused import _DTYPES, FusedTables, check_triton, lookup_kernels
from planner.measure.tables.gpu_graph_step import measure_graph_step
from planner.measure.tables.gpu_interaction import measure_interaction

__all__ = ["main"]

#: the parts ``--only`` may name
_PARTS = ("step", "tbe", "gemm", "memory", "dense", "graphstep", "graphstep-dot",
          "interaction")


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
    for pool in (64, 100, 128):                 # MLPerf DCNv2's cat_20 looks up 100 ids a bag
        for dist in ("uniform", "zipf1.05"):
            out.append((8, 4_000_000, 128, pool, 8_192, "fp32", dist))
    for batch in (256, 512, 1_024):             # calls short enough for the fixed cost to show
        out.append((8, 4_000_000, 128, 16, batch, "fp32", "uniform"))
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
    main_rows, part_rows, n = CsvRows(out / "tbe.csv"), CsvRows(out / "parts.csv"), 0
    for (tables, rows, dim, pool, batch, dtype, dist) in _tbe_configs(quick):
        if time.monotonic() > deadline:
            print(f"tbe: budget spent after {n} rows", flush=True)
            break
        ft = FusedTables([(rows, pool)] * tables, dim, batch, dtype, dist, dev)
        lk = lookup_kernels(ft, kernel, pool)
        grad = torch.randn(ft.bags, dim, device=dev, dtype=ft.weight.dtype)
        tf, iqr_f = auto_time(lk.forward, dev, samples=samples)
        tb, iqr_b = auto_time(lambda: lk.backward(grad), dev, samples=samples)
        gf = gb = float("nan")
        if kernel == "triton-nosync" and dev.type == "cuda":    # the GPU's time alone
            try:
                gf, _ = auto_time(lk.forward, dev, samples=samples, graph=True)
                gb, _ = auto_time(lambda: lk.backward(grad), dev, samples=samples, graph=True)
            except RuntimeError as exc:             # not capturable: keep the eager times
                print(f"tbe: no CUDA graph: {exc!r}"[:200], flush=True)
        key = dict(kernel=kernel, tables=tables, rows=rows, dim=dim, pooling=pool, batch=batch,
                   dtype=dtype, ids=dist, lookups=ft.ids.numel(), distinct=ft.distinct)
        main_rows.add(key | dict(forward_s=tf, backward_s=tb, iqr_rel_fwd=iqr_f,
                                 iqr_rel_bwd=iqr_b, forward_graph_s=gf, backward_graph_s=gb))
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
    rows, n = CsvRows(out / "gemm.csv"), 0
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


def main(argv: list[str] | None = None) -> int:
    ap = driver_parser("planner.measure.tables.gpu_dlrm", __doc__, samples=5, budget_s=400.0)
    ap.add_argument("--only", default="step,tbe,gemm", help="comma-separated parts, in order")
    ap.add_argument("--max-table-gib", type=float, default=None,
                    help="cap on the step's large tables together (default: 72%% of GPU memory)")
    ap.add_argument("--kernel", default="torch", choices=("torch", "triton", "triton-nosync"),
                    help="lookups by PyTorch ops (default), the fused Triton kernels, or those "
                         "with FBGEMM's host-free backward")
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
    if args.kernel != "torch":
        try:
            meta["triton_check"] = check_triton(dev, args.kernel)
        except Exception as exc:                    # a kernel that does not compile here
            meta["triton_check"] = f"failed: {exc!r}"[:400]
        print(f"triton check: {meta['triton_check']}", flush=True)
        if not meta["triton_check"].startswith("ok"):
            (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            return 1
    parts = args.only.split(",")
    share = {"step": 0.3, "tbe": 0.4, "gemm": 0.3, "memory": 0.05, "dense": 0.4,
             "graphstep": 0.5, "graphstep-dot": 0.5}
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
            elif part == "dense":
                n = measure_dense(dev, **kw)
            elif part == "interaction":
                n = measure_interaction(dev, **kw)
            elif part in ("graphstep", "graphstep-dot"):
                n = measure_graph_step(dev, max_table_bytes=max_table, kernel=args.kernel,
                                       dot=part == "graphstep-dot", **kw)
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
