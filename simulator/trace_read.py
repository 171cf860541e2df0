"""Per-rank busy time from Chrome/Perfetto traces: this simulator's, or PyTorch profiler (Kineto)
traces of a real run, one file per rank, for straggler diagnosis.

Busy time is the union of the rank's compute intervals (nested slices counted once):

* clusterplan traces (``otherData.producer == "clusterplan"``): ``pid`` is the rank, compute
  slices have ``cat == "compute"``.
* Kineto traces: the rank is ``distributedInfo.rank`` (else the file's position in the list);
  compute is GPU ``kernel`` slices when there are any, else ``cpu_op`` slices (a CPU run), in
  both cases without communication (names with nccl, gloo, c10d, all_reduce, all_gather,
  reduce_scatter, all_to_all, broadcast, send, recv, barrier) and without ``ProfilerStep``.
"""

from __future__ import annotations

import re
from pathlib import Path

from simulator.errors import SpecError
from simulator.fileio import MAX_TRACE_BYTES, parse_json, read_text

__all__ = ["busy_by_rank", "union_seconds"]

_COMM = re.compile(r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                   r"broadcast|\bsend\b|\brecv\b|barrier|ProfilerStep", re.IGNORECASE)


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (same unit in, same unit out)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _load(path: str | Path) -> dict:
    doc = parse_json(read_text(path, max_bytes=MAX_TRACE_BYTES), source=str(path),
                     fix="pass a Chrome/Perfetto trace JSON (clusterplan --trace or "
                         "torch.profiler export_chrome_trace)")
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SpecError("no traceEvents list", source=str(path), field="traceEvents",
                        fix="pass a Chrome/Perfetto trace JSON")
    return doc


def busy_by_rank(paths: list[str | Path]) -> dict[int, float]:
    """Seconds of compute per rank over all given trace files."""
    out: dict[int, list[tuple[float, float]]] = {}
    for k, path in enumerate(paths):
        doc = _load(path)
        events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
        ours = (doc.get("otherData") or {}).get("producer") == "clusterplan"
        if ours:
            for e in events:
                if e.get("cat") == "compute":
                    out.setdefault(int(e["pid"]), []).append(_span(e, path))
            continue
        info = doc.get("distributedInfo") or {}
        rank = int(info.get("rank", k)) if isinstance(info, dict) else k
        kernels = [e for e in events if e.get("cat") == "kernel"]
        pool = kernels or [e for e in events if e.get("cat") == "cpu_op"]
        spans = out.setdefault(rank, [])
        spans += [_span(e, path) for e in pool if not _COMM.search(str(e.get("name", "")))]
    return {r: union_seconds(iv) / 1e6 for r, iv in sorted(out.items())}


def _span(e: dict, path) -> tuple[float, float]:
    try:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        raise SpecError(f"event {str(e)[:80]} has no numeric ts/dur", source=str(path),
                        field="traceEvents", fix="pass an unmodified trace") from None
    return ts, ts + max(dur, 0.0)
