"""Chrome / Perfetto trace JSON of a simulation (opens in ui.perfetto.dev and chrome://tracing).

One process per rank (``pid`` = global rank), one thread per stream on it (``tid`` 0 = compute,
then one per communication stream in order of first use), complete events (``ph: X``) with
``ts``/``dur`` in microseconds; overlapping work is on separate tracks, so Perfetto's rule that
slices on one track nest is kept. Collectives appear on every member rank's stream track with
``args`` {bytes, algorithm, group size}; a straggler's compute slices carry ``slowdown`` and its
process is labelled with its factor; link faults are global instant events at their time. Only the first ``max_ranks`` ranks are written, to keep
traces of 16k-GPU runs openable.
"""

from __future__ import annotations

import json

from simulator.fileio import atomic_write_text

__all__ = ["chrome_trace", "write_chrome_trace"]


def chrome_trace(result, *, max_ranks: int = 64) -> dict:
    """Build the trace dict from a :class:`~simulator.result.SimResult`."""
    ops = result.workload.ops
    df = result.ops
    events: list[dict] = []
    tids: dict[tuple[int, str], int] = {}
    shown: set[int] = set()
    names = result.device_names
    slow = getattr(result, "slowdown", {}) or {}

    def tid(rank: int, stream: str) -> int:
        key = (rank, stream)
        if key not in tids:
            per_rank = [s for (r, s) in tids if r == rank]
            tids[key] = 0 if stream == "compute" else len(per_rank) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[key],
                           "args": {"name": stream}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank,
                           "tid": tids[key], "args": {"sort_index": tids[key]}})
        return tids[key]

    starts = df.start_s.to_numpy()
    durs = df.duration_s.to_numpy()
    algos = df.algorithm.tolist()
    for op in ops:
        members = [r for r in op.ranks if r < max_ranks]
        cat = {"compute": "compute", "delay": "compute", "collective": "comm",
               "sendrecv": "p2p"}[op.kind]
        args = {"op": op.id, "category": op.category}
        if op.kind == "compute":
            args.update(flops=op.flops, bytes=op.bytes_moved, dtype=op.dtype)
            if op.ranks[0] in slow:
                args["slowdown"] = slow[op.ranks[0]]
        else:
            args.update(bytes=op.bytes_moved, algorithm=algos[op.id], group_size=len(op.ranks))
        for r in members:
            if r not in shown:
                shown.add(r)
                label = f"rank {r} ({names[r]})" if names else f"rank {r}"
                if r in slow:
                    label += f" straggler ×{slow[r]:g}"
                events.append({"ph": "M", "name": "process_name", "pid": r,
                               "args": {"name": label}})
                events.append({"ph": "M", "name": "process_sort_index", "pid": r,
                               "args": {"sort_index": r}})
            events.append({"ph": "X", "name": op.name, "cat": cat, "pid": r,
                           "tid": tid(r, op.stream), "ts": starts[op.id] * 1e6,
                           "dur": durs[op.id] * 1e6, "args": args})
    for fault in getattr(result, "link_faults", ()) or ():
        events.append({"ph": "i", "s": "g", "name": f"link fault {fault.label}", "pid": 0,
                       "tid": 0, "ts": fault.at_s * 1e6,
                       "args": {"links": len(fault.links), "capacity_factor": fault.factor}})
    return {"displayTimeUnit": "ns", "traceEvents": events,
            "otherData": {"producer": "clusterplan", "topology": result.topology,
                          "mode": result.mode, "step_time_s": result.step_time_s,
                          "ranks_shown": len(shown)}}


def write_chrome_trace(result, path, *, max_ranks: int = 64) -> None:
    """Write the trace atomically (nothing half-written if anything fails)."""
    atomic_write_text(path, json.dumps(chrome_trace(result, max_ranks=max_ranks)), field="--trace")
