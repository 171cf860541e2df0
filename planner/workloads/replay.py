"""Real traces into the simulator's op graph: PyTorch profiler (Kineto/Chrome) traces.

A replay keeps what was measured and simulates what the network does: every rank's compute
between two communication calls becomes one op of the measured duration, every collective and
point-to-point message becomes a simulator op of the traced size on its group, so the simulated
step can be compared with the real one rank by rank and op kind by op kind.

**Kineto / Chrome traces** (``torch.profiler`` ``export_chrome_trace``, one file per rank, CPU
and gloo; CUDA traces are read alike from their host side). On the thread that issued them,
``c10d::*`` ops are the communication calls: kind from the name, bytes from ``Input Dims`` and
``Input type`` (the full buffer of an all-gather or reduce-scatter, nccl-tests' convention), the
peer of ``send``/``recv_`` from ``Concrete Inputs``. Gloo records no process group, so the group
is read from an enclosing ``record_function`` label carrying ``ranks=[...]`` (what
``planner.measure.validate`` writes), else from ``distributedInfo.pg_config`` when the trace has one
group, else the whole world. A blocking call ends when its ``gloo:*`` work event ends (or when
the issuing thread resumes). Compute between calls is measured wall time on the issuing thread.

:mod:`planner.workloads.chakra` reads Chakra execution traces the same way.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from simulator.errors import SpecError
from simulator.fileio import MAX_TRACE_BYTES, parse_json, read_text
from simulator.workload import Workload

__all__ = ["TraceCall", "RankTrace", "read_kineto", "kineto_workload"]

_DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2,
                "bfloat16": 2, "long int": 8, "int": 4, "short int": 2, "signed char": 1,
                "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1}
#: c10d op name (without ``c10d::`` and trailing ``_``) → simulator collective kind
_C10D = {"allreduce": "allreduce", "allgather_base": "allgather", "allgather": "allgather",
         "allgather_into_tensor_coalesced": "allgather", "reduce_scatter_base": "reducescatter",
         "reduce_scatter": "reducescatter", "reduce_scatter_tensor_coalesced": "reducescatter",
         "alltoall_base": "alltoall", "alltoall": "alltoall", "broadcast": "broadcast",
         "barrier": "barrier", "send": "send", "recv": "recv"}
_RANKS_LABEL = re.compile(r"ranks=\[([0-9,\s]*)\]")


@dataclass
class TraceCall:
    """One communication call on one rank, and the compute time before it."""

    kind: str                      # allreduce, allgather, ..., send, recv, barrier
    bytes: float
    group: tuple[int, ...]         # global ranks (for send/recv: (src, dst))
    compute_before_s: float        # wall time on the issuing thread since the previous call ended
    measured_s: float              # from the call to its completion
    label: str = ""


@dataclass
class RankTrace:
    rank: int
    calls: list[TraceCall] = field(default_factory=list)
    tail_compute_s: float = 0.0    # after the last call
    span_s: float = 0.0            # first to last event of the issuing thread
    source: str = ""


def _load(path: Path) -> dict:
    doc = parse_json(read_text(path, max_bytes=MAX_TRACE_BYTES), source=str(path),
                     fix="pass the file torch.profiler's export_chrome_trace wrote")
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SpecError("no traceEvents list", source=str(path), field="traceEvents",
                        fix="pass a Chrome/Kineto trace (one per rank)")
    return doc


def _num(x: Any, path: Path, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise SpecError(f"event without a numeric {what}: {x!r}", source=str(path), field=what,
                        fix="pass an unmodified profiler trace")
    return float(x)


def _call_bytes(args: dict, kind: str = "") -> float:
    """Bytes of the call's buffer; all-gather and reduce-scatter count the full (larger) one."""
    if kind in ("allgather", "reducescatter"):
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        return max([_call_bytes({"Input Dims": [d], "Input type": types[i:i + 1] + types[1:]})
                    for i, d in enumerate(dims[:2])] or [0.0])
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    first = dims[0] if dims else []
    # a TensorList argument is a list of shapes; a tensor, one shape
    shapes = first if first and isinstance(first[0], list) else [first]
    if types and types[0] == "TensorList":
        dt = "float"
        for t in types[1:]:
            if t in _DTYPE_BYTES:
                dt = t
                break
        elem = _DTYPE_BYTES.get(args.get("dtype", dt), 4)
    else:
        elem = _DTYPE_BYTES.get(types[0] if types else "float", 4)
    total = 0
    for s in shapes:
        n = 1
        for d in s or []:
            n *= int(d)
        total += n if s else 0
    return float(total * elem)


def read_kineto(paths: Sequence[str | Path]) -> list[RankTrace]:
    """Per-rank communication calls and compute gaps from profiler traces (one file per rank,
    any order; the rank is the file's ``distributedInfo.rank``, else its position)."""
    out = []
    for i, p in enumerate(paths):
        path = Path(p)
        doc = _load(path)
        info = doc.get("distributedInfo") or {}
        rank = int(info.get("rank", i))
        world = int(info.get("world_size", len(paths)))
        pgs = info.get("pg_config") or []
        default = tuple(range(world))
        if len(pgs) == 1 and isinstance(pgs[0].get("ranks"), list):
            default = tuple(int(r) for r in pgs[0]["ranks"])
        evs = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
               and e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
        calls_ev = [e for e in evs if e.get("cat") == "cpu_op"
                    and str(e.get("name", "")).startswith("c10d::")]
        if not calls_ev and not evs:
            raise SpecError("no profiler events", source=str(path), field="traceEvents",
                            fix="profile with torch.profiler (activities=[CPU]) and export")
        tid = calls_ev[0].get("tid") if calls_ev else evs[0].get("tid")
        main = sorted((e for e in evs if e.get("tid") == tid),
                      key=lambda e: _num(e.get("ts"), path, "ts"))
        works = sorted((e for e in evs if str(e.get("name", "")).startswith(("gloo:", "nccl:"))
                        and e.get("cat") == "user_annotation"),
                       key=lambda e: _num(e.get("ts"), path, "ts"))
        labels = [e for e in evs if e.get("cat") == "user_annotation"
                  and _RANKS_LABEL.search(str(e.get("name", "")))]
        rt = RankTrace(rank=rank, source=str(path))
        t_first = _num(main[0]["ts"], path, "ts")
        t_last = max(_num(e["ts"], path, "ts") + _num(e.get("dur", 0), path, "dur")
                     for e in main)
        rt.span_s = (t_last - t_first) * 1e-6
        cursor = t_first
        wi = 0
        for e in sorted(calls_ev, key=lambda e: e["ts"]):
            if e.get("tid") != tid:
                continue
            name = str(e["name"])[len("c10d::"):].strip("_")
            kind = _C10D.get(name)
            if kind is None:
                continue
            ts, dur = _num(e["ts"], path, "ts"), _num(e.get("dur", 0), path, "dur")
            args = e.get("args") or {}
            end = ts + dur
            # the work event the call started (first gloo:/nccl: event beginning at or after it)
            while wi < len(works) and works[wi]["ts"] < ts:
                wi += 1
            if wi < len(works) and works[wi]["ts"] < ts + max(dur, 1.0) + 1e3:
                w = works[wi]
                end = max(end, w["ts"] + w.get("dur", 0))
                wi += 1
            label = ""
            group = default
            for lab in labels:
                if lab["ts"] <= ts and lab["ts"] + lab.get("dur", 0) >= ts + dur:
                    label = str(lab["name"])
                    m = _RANKS_LABEL.search(label)
                    group = tuple(int(x) for x in m.group(1).split(",") if x.strip())
            if kind in ("send", "recv"):
                ci = args.get("Concrete Inputs") or []
                try:
                    peer = int(ci[2])
                except (IndexError, ValueError, TypeError):
                    raise SpecError(f"{e['name']} without its peer rank", source=str(path),
                                    field="Concrete Inputs",
                                    fix="profile with record_shapes=True") from None
                group = (rank, peer) if kind == "send" else (peer, rank)
            rt.calls.append(TraceCall(kind=kind, bytes=_call_bytes(args, kind), group=group,
                                      compute_before_s=max(0.0, ts - cursor) * 1e-6,
                                      measured_s=(end - ts) * 1e-6, label=label))
            cursor = end
        rt.tail_compute_s = max(0.0, t_last - cursor) * 1e-6
        out.append(rt)
    ranks = sorted(r.rank for r in out)
    if ranks != list(range(len(out))):
        raise SpecError(f"traces of ranks {ranks}: every rank 0..{len(out) - 1} once",
                        field="TRACE", fix="pass one trace per rank of the run")
    return sorted(out, key=lambda r: r.rank)


def kineto_workload(ranks: Sequence[RankTrace]) -> Workload:
    """The replay op graph: measured compute gaps as fixed-duration ops, calls as simulator
    collectives and messages, matched across ranks by order on each group."""
    w = Workload(name="kineto-replay")
    ptr = [0] * len(ranks)
    last: list[int | None] = [None] * len(ranks)
    seen: dict[tuple, int] = defaultdict(int)       # calls issued so far per (rank, key)
    pending: dict[tuple, dict[int, int]] = defaultdict(dict)   # op key → rank → call index

    def key_of(r: int, c: TraceCall) -> tuple:
        k = ("p2p", c.group) if c.kind in ("send", "recv") else ("coll", c.kind, c.group)
        return k + (seen[(r, k)],)

    progressed = True
    while progressed:
        progressed = False
        for r, rt in enumerate(ranks):
            while ptr[r] < len(rt.calls):
                c = rt.calls[ptr[r]]
                k = key_of(r, c)
                if r in pending[k]:
                    break                            # waiting for the peers of this call
                pending[k][r] = ptr[r]
                members = c.group
                if not set(members) <= set(pending[k]):
                    break
                deps = []
                for m in members:
                    mc = ranks[m].calls[pending[k][m]]
                    gap = w.delay(m, f"compute before {mc.kind}", mc.compute_before_s,
                                  deps=[last[m]] if last[m] is not None else None,
                                  category="compute")
                    deps.append(gap)
                if c.kind in ("send", "recv"):
                    op = w.sendrecv(members[0], members[1], c.bytes, deps=deps,
                                    name=f"p2p {members[0]}->{members[1]}")
                elif c.kind == "barrier":
                    op = w.collective("allreduce", members, 0.0, deps=deps, name="barrier")
                else:
                    op = w.collective(c.kind, members, c.bytes, deps=deps,
                                      name=c.label or c.kind)
                for m in members:
                    last[m] = op
                    mk = ("p2p", c.group) if c.kind in ("send", "recv") else ("coll", c.kind,
                                                                              c.group)
                    seen[(m, mk)] += 1
                    ptr[m] = pending[k][m] + 1
                del pending[k]
                progressed = True
    stuck = [r for r, rt in enumerate(ranks) if ptr[r] < len(rt.calls)]
    if stuck:
        r = stuck[0]
        c = ranks[r].calls[ptr[r]]
        raise SpecError(f"rank {r}'s call #{ptr[r]} ({c.kind} on ranks {list(c.group)}) has no "
                        "matching call on every member", source=ranks[r].source,
                        field="traceEvents",
                        fix="pass traces of the same steps from every rank of the run")
    for r, rt in enumerate(ranks):
        w.delay(r, "compute after the last call", rt.tail_compute_s,
                deps=[last[r]] if last[r] is not None else None, category="compute")
    return w


# -- Chakra ---------------------------------------------------------------------------------
