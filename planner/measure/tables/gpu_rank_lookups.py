"""Measure on one CUDA GPU the lookups that one rank of a multi-GPU DLRM plan runs (its tables,
whole, at the global batch, all-to-all-free), by TorchRec's path and by PyTorch's
sparse-gradient path, and the bottom MLP that DeepLearningExamples' PyTorch DLRM runs on rank 0
over the global batch. Each rank of an 8-GPU plan fits one GPU, so an 8-GPU step's per-rank
compute can be timed on a single GPU, shape for shape.

Run on the GPU machine (needs only torch, Triton for the fused path)::

    python -m planner.measure.tables.gpu_rank_lookups --cases CASES.json --out DIR

``CASES.json`` is a list of ranks, ``{"case", "rank", "batch", "dim", "tables": [[rows,
pooling], ...]}`` (``traces/measured/h200/rank-lookups/make_cases.py`` writes it from this
project's plans). Each rank is measured with uniform and Zipf 1.05 ids (``--ids``).

It writes, in ``DIR`` (each row as soon as it is measured):

``ranks.csv``
    One rank, path and id distribution per row: ``path`` ``fused`` (every table in one weight,
    the host-free fused Triton kernels of :mod:`.gpu_tbe_nosync`, replayed from a CUDA graph:
    ``forward_s`` and ``backward_s`` with row-wise Adagrad) or ``sparse_grad``
    (DeepLearningExamples' distributed PyTorch DLRM under ``--amp``: an fp32 joint table,
    ``F.embedding`` / ``F.embedding_bag`` with ``sparse=True``, its output cast to fp16;
    ``forward_s`` the lookup and
    the cast, ``backward_s`` autograd's backward to a COO gradient of one row per id,
    ``unscale_s`` GradScaler's unscale of its values, ``optimizer_s`` ``torch.optim.SGD``'s step,
    ``step_s`` all four in one call, eager); ``ids_total``, ``distinct`` rows, ``nnz`` of the
    sparse gradient and whether it came out coalesced.
``bottom.csv``
    The bottom MLP 13-512-256-128 (ReLU) at each batch in fp32 (TF32 off), TF32 and fp16
    autocast: forward, and forward + backward, eager and replayed from a CUDA graph.
``meta.json``
    GPU, driver, torch, CUDA, date, command, wall time, the cases file's contents.

Timing: CUDA events; the median of ``--samples`` samples, each the mean of enough back-to-back
calls to last ~20 ms (:func:`~planner.measure.compute.gpu_timing.auto_time`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from planner.measure.compute.driver import check_driver_args, driver_parser, start_driver
from planner.measure.compute.gpu_timing import CsvRows, auto_time
from planner.measure.tables.gpu_fused import FusedTables, lookup_kernels, table_bags

__all__ = ["main", "SparseGradRank"]

_MODULE = "planner.measure.tables.gpu_rank_lookups"


def _torch():
    import torch
    return torch


class SparseGradRank:
    """One rank's tables on PyTorch's sparse-gradient path (module docstring): a joint fp32
    weight, ``batch`` bags per table, ids ``dist``; ``forward`` returns the fp16 output."""

    def __init__(self, tables: list[tuple[int, int]], dim: int, batch: int, dist: str, dev,
                 seed: int = 0):
        torch = _torch()
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        total = sum(r for r, _ in tables)
        w = torch.empty(total, dim, device=dev, dtype=torch.float32)
        w.uniform_(-0.01, 0.01, generator=gen)
        self.weight = torch.nn.Parameter(w)
        self.ids, lengths, self.offsets = table_bags(tables, batch, dist, dev, gen)
        self.one_hot = bool((lengths == 1).all())
        self.bags = lengths.numel()
        self.distinct = int(torch.unique(self.ids).numel())
        self.opt = torch.optim.SGD([self.weight], lr=0.01)
        self.inv_scale = torch.full((1,), 1.0 / 1024, device=dev)
        self.found_inf = torch.zeros(1, device=dev)

    def forward(self):
        import torch.nn.functional as F
        if self.one_hot:
            out = F.embedding(self.ids, self.weight, sparse=True)
        else:
            out = F.embedding_bag(self.ids, self.weight, self.offsets, mode="sum", sparse=True)
        return out.half()

    def unscale(self):
        torch = _torch()
        torch._amp_foreach_non_finite_check_and_unscale_(
            [self.weight.grad._values()], self.found_inf, self.inv_scale)

    def step(self, grad):
        self.forward().backward(grad)
        self.unscale()
        self.opt.step()
        self.weight.grad = None


def _sparse_row(sg: SparseGradRank, dev, samples: int) -> dict:
    torch = _torch()
    g = torch.randn(sg.bags, sg.weight.shape[1], device=dev, dtype=torch.float16)
    out = sg.forward()
    fwd, _ = auto_time(sg.forward, dev, samples=samples)
    bwd, _ = auto_time(lambda: torch.autograd.grad(out, sg.weight, g, retain_graph=True),
                       dev, samples=samples)
    sg.weight.grad = torch.autograd.grad(out, sg.weight, g, retain_graph=True)[0]
    nnz, coalesced = int(sg.weight.grad._nnz()), bool(sg.weight.grad.is_coalesced())
    uns, _ = auto_time(sg.unscale, dev, samples=samples)
    opt, _ = auto_time(sg.opt.step, dev, samples=samples)
    sg.weight.grad = None
    step, iqr = auto_time(lambda: sg.step(g), dev, samples=samples)
    return {"forward_s": fwd, "backward_s": bwd, "unscale_s": uns, "optimizer_s": opt,
            "step_s": step, "step_iqr_rel": iqr, "nnz": nnz, "coalesced": coalesced}


def _fused_row(tables, dim, batch, dist, dev, samples: int) -> tuple[dict, int]:
    torch = _torch()
    ft = FusedTables(tables, dim, batch, "fp32", dist, dev)
    lk = lookup_kernels(ft, "triton-nosync", max(p for _, p in tables))
    g = torch.randn(ft.bags, dim, device=dev)
    fwd, _ = auto_time(lk.forward, dev, samples=samples, graph=dev.type == "cuda")
    bwd, iqr = auto_time(lambda: lk.backward(g), dev, samples=samples, graph=dev.type == "cuda")
    nan = float("nan")
    return {"forward_s": fwd, "backward_s": bwd, "unscale_s": nan, "optimizer_s": nan,
            "step_s": fwd + bwd, "step_iqr_rel": iqr, "nnz": "", "coalesced": ""}, ft.distinct


def measure_ranks(dev, cases: list[dict], *, dists: list[str], paths: list[str], samples: int,
                  out: Path, deadline: float, quick: bool) -> int:
    torch = _torch()
    rows = CsvRows(out / "ranks.csv")
    n = 0
    for case in cases:
        tables = [(int(r), int(p)) for r, p in case["tables"]]
        batch, dim = int(case["batch"]), int(case["dim"])
        if quick:
            tables, batch, dim = [(min(r, 5000), p) for r, p in tables], min(batch, 512), 16
        for dist in dists:
            for path in paths:
                if time.monotonic() > deadline:
                    rows.close()
                    return n
                if path == "fused" and dev.type != "cuda":
                    continue                         # Triton kernels: GPU only
                base = {"case": case["case"], "rank": case["rank"], "path": path, "ids": dist,
                        "batch": batch, "dim": dim, "tables": len(tables),
                        "rows_total": sum(r for r, _ in tables),
                        "ids_total": batch * sum(p for _, p in tables),
                        "pooling_max": max(p for _, p in tables)}
                if path == "fused":
                    r, distinct = _fused_row(tables, dim, batch, dist, dev, samples)
                else:
                    sg = SparseGradRank(tables, dim, batch, dist, dev)
                    r, distinct = _sparse_row(sg, dev, samples), sg.distinct
                    del sg
                rows.add(base | {"distinct": distinct} | r)
                n += 1
                print(f"{case['case']} rank {case['rank']} {path} {dist}: "
                      f"{r['step_s'] * 1e3:.3f} ms", flush=True)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    rows.close()
    return n


def measure_bottom(dev, *, batches: list[int], samples: int, out: Path, deadline: float) -> int:
    torch = _torch()
    nn = torch.nn
    rows = CsvRows(out / "bottom.csv")
    n = 0
    for batch in batches:
        for prec in ("fp32", "tf32", "fp16-autocast"):
            if time.monotonic() > deadline:
                break
            torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
            mlp = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                nn.Linear(256, 128), nn.ReLU()).to(dev)
            x = torch.randn(batch, 13, device=dev)
            g = torch.randn(batch, 128, device=dev)
            ac = prec == "fp16-autocast" and dev.type == "cuda"

            def fwd():
                with torch.autocast(dev.type, dtype=torch.float16, enabled=ac):
                    return mlp(x)

            def fb():
                fwd().backward(g)

            row = {"batch": batch, "precision": prec}
            for name, fn in (("forward", fwd), ("forward_backward", fb)):
                row[f"{name}_s"] = auto_time(fn, dev, samples=samples)[0]
                if dev.type == "cuda":
                    row[f"{name}_graph_s"] = auto_time(fn, dev, samples=samples, graph=True)[0]
            rows.add(row)
            n += 1
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.close()
    return n


_FIX_CASES = "write it with traces/measured/h200/rank-lookups/make_cases.py"


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _case_problem(cases, path: str) -> tuple[str, str, str] | None:
    """(where, what, fix) of the first malformed entry of the cases list read from ``path``,
    or None."""
    if not isinstance(cases, list) or not cases:
        return f"--cases {path}", "expected a non-empty JSON list of ranks", _FIX_CASES
    for i, c in enumerate(cases):
        where = f"--cases {path} [{i}]"
        if not isinstance(c, dict):
            return where, "expected an object {case, rank, batch, dim, tables}", _FIX_CASES
        for key in ("case", "rank", "batch", "dim", "tables"):
            if key not in c:
                return f"{where}.{key}", "missing", _FIX_CASES
        for key in ("batch", "dim"):
            if not _positive_int(c[key]):
                return f"{where}.{key}", f"{c[key]!r} is not a positive integer", _FIX_CASES
        t = c["tables"]
        if not isinstance(t, list) or not t or not all(
                isinstance(x, list) and len(x) == 2 and all(map(_positive_int, x)) for x in t):
            return f"{where}.tables", "expected [[rows, pooling], ...] of positive integers", \
                _FIX_CASES
    return None


def _list_problem(args) -> tuple[str, str, str] | None:
    """(flag, what, fix) of a malformed ``--ids``, ``--paths`` or ``--bottom-batches``."""
    for d in args.ids.split(","):
        try:
            ok = d == "uniform" or (d.startswith("zipf") and float(d[4:]) > 0)
        except ValueError:
            ok = False
        if not ok:
            return "--ids", f"unknown distribution {d!r}", "use uniform or zipfA, e.g. zipf1.05"
    bad = [p for p in args.paths.split(",") if p not in ("fused", "sparse_grad")]
    if bad:
        return "--paths", f"unknown path {bad[0]!r}", "use fused and/or sparse_grad"
    if not all(b.isdigit() and int(b) > 0 for b in args.bottom_batches.split(",")):
        return ("--bottom-batches", f"{args.bottom_batches!r} is not a list of batches",
                "give positive integers, e.g. 65536,8192")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = driver_parser(_MODULE, __doc__, samples=5, budget_s=300.0)
    ap.add_argument("--cases", required=True, type=Path, help="JSON list of ranks (docstring)")
    ap.add_argument("--ids", default="uniform,zipf1.05", help="id distributions, comma-separated")
    ap.add_argument("--paths", default="fused,sparse_grad", help="lookup paths, comma-separated")
    ap.add_argument("--bottom-batches", default="65536,8192", help="bottom MLP batches")
    args = ap.parse_args(argv)
    args.attention_backend = "n/a"
    try:
        cases = json.loads(args.cases.read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--cases {args.cases}: cannot read a JSON list of ranks ({e}); "
                 f"fix: {_FIX_CASES}")
    problem = _case_problem(cases, str(args.cases)) or _list_problem(args)
    if problem:
        ap.error(f"{problem[0]}: {problem[1]}; fix: {problem[2]}")
    check_driver_args(ap, args)                     # creates --out: after every other check
    dev, meta = start_driver(_MODULE, args, argv)
    meta["cases"] = cases
    start = time.monotonic()
    n = measure_ranks(dev, cases, dists=args.ids.split(","), paths=args.paths.split(","),
                      samples=args.samples, out=args.out, quick=args.quick,
                      deadline=start + 0.85 * args.budget_s)
    meta["ranks_rows"] = n
    batches = [min(int(b), 1024) if args.quick else int(b) for b in args.bottom_batches.split(",")]
    meta["bottom_rows"] = measure_bottom(dev, batches=batches, samples=args.samples,
                                         out=args.out, deadline=start + args.budget_s)
    meta["wall_s"] = round(time.monotonic() - start, 1)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"ranks: {n} rows, bottom: {meta['bottom_rows']} rows in {meta['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
