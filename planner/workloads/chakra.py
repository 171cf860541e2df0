"""Chakra execution traces into the simulator's op graph, as
:mod:`planner.workloads.replay` does for PyTorch profiler traces: measured compute kept,
communication simulated on its group.

**Chakra ET, JSON view** (``chakra_jsonizer`` output: concatenated JSON messages, the first the
``GlobalMetadata``; ``../shared/reference/formats.md`` §7): ``COMP_NODE`` with
``durationMicros`` (or ``num_ops`` / ``tensor_size`` for the roofline), ``COMM_COLL_NODE`` with
``comm_type``, ``comm_size`` (bytes of this rank's input buffer) and ``pg_name`` (groups from a
``{"1": [0, 1, ...]}`` file), ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with ``comm_src``,
``comm_dst``, ``comm_tag``; ``dataDeps`` and ``ctrlDeps`` become dependencies. The n-th call on a
group (or the n-th message between two ranks with a tag) on every rank is the same op.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from simulator.errors import SpecError
from simulator.fileio import MAX_TRACE_BYTES, read_text
from simulator.workload import Workload

__all__ = ["read_chakra_json", "chakra_workload", "CHAKRA_COLLECTIVES"]

#: Chakra CollectiveCommType → simulator kind (``formats.md`` §7.1)
CHAKRA_COLLECTIVES = {0: "allreduce", 2: "allgather", 5: "broadcast", 6: "alltoall",
                      7: "reducescatter", 8: "reducescatter", 9: "barrier"}


def _chakra_messages(path: Path) -> list[dict]:
    text = read_text(path, max_bytes=MAX_TRACE_BYTES)
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise SpecError(f"not a Chakra JSON view: {str(exc)[:120]}", source=str(path),
                            fix="write it with chakra_jsonizer (concatenated JSON messages)"
                            ) from None
        out.extend(obj if isinstance(obj, list) else [obj])
    if not out:
        raise SpecError("empty trace", source=str(path), fix="pass a Chakra JSON view")
    return out


def _attrs(node: dict) -> dict:
    out = {}
    for a in node.get("attr") or []:
        if not isinstance(a, dict) or "name" not in a:
            continue
        vals = [v for k, v in a.items() if k.endswith("Val") or k.endswith("_val")]
        out[a["name"]] = vals[0] if vals else None
    return out


def _int(x: Any, path: Path, fld: str) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        raise SpecError(f"expected an integer, got {x!r}", source=str(path), field=fld,
                        fix="pass an unmodified Chakra JSON view") from None


def read_chakra_json(paths: Sequence[str | Path]) -> list[list[dict]]:
    """Each rank's nodes (``<prefix>.<rank>.json`` files in rank order), metadata dropped."""
    ranks = []
    for p in paths:
        msgs = _chakra_messages(Path(p))
        ranks.append([m for m in msgs if "type" in m or "dataDeps" in m or "ctrlDeps" in m
                      or ("name" in m and "version" not in m)])
    return ranks


def _compute_op(w: Workload, r: int, n: dict, t: str, name: str, deps: list[int],
                path: Path) -> int:
    """A compute (or memory, metadata) node of rank ``r`` as an op: its measured
    ``durationMicros`` when it has one, else its FLOPs and bytes (``num_ops``,
    ``tensor_size``), else nothing."""
    a = _attrs(n)
    dur = n.get("durationMicros")
    if dur is not None and t != "METADATA_NODE":
        return w.compute(r, name, duration_s=_int(dur, path, "durationMicros") * 1e-6,
                         deps=deps)
    return w.compute(r, name, flops=float(_int(a.get("num_ops", 0) or 0, path, "num_ops")),
                     bytes_moved=float(_int(a.get("tensor_size", 0) or 0, path, "tensor_size")),
                     deps=deps, duration_s=None if a.get("num_ops") or a.get("tensor_size")
                     else 0.0)


def _comm_call(n: dict, t: str, nid: int, r: int, world: int, groups: dict[str, list[int]],
               path: Path) -> tuple[tuple, tuple, str, float]:
    """A communication node of rank ``r``: the key that matches it with its peers' nodes,
    its members, its kind (a collective's, or ``p2p``) and its size (bytes, the simulator's
    convention: an all-gather's full output)."""
    a = _attrs(n)

    def size() -> float:
        return float(_int(a.get("comm_size", 0) or 0, path, "comm_size"))
    if t != "COMM_COLL_NODE":                      # send / recv
        src = _int(a.get("comm_src"), path, f"node {nid}.comm_src")
        dst = _int(a.get("comm_dst"), path, f"node {nid}.comm_dst")
        return ("p2p", src, dst, a.get("comm_tag", 0)), (src, dst), "p2p", size()
    ctype = _int(a.get("comm_type"), path, f"node {nid}.comm_type")
    kind = CHAKRA_COLLECTIVES.get(ctype)
    if kind is None:
        raise SpecError(f"node {nid}: collective type {ctype} is not simulated",
                        source=str(path), field="comm_type",
                        fix="use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, "
                            "ALL_TO_ALL, BROADCAST or BARRIER")
    pg = str(a.get("pg_name") or "")
    members = tuple(range(world)) if pg in ("", "0") and pg not in groups \
        else tuple(groups.get(pg, ()))
    if not members:
        raise SpecError(f"node {nid}: process group {pg!r} is not in the comm "
                        "groups", source=str(path), field="pg_name",
                        fix="pass --comm-groups FILE ({\"1\": [0, 1, ...]})")
    if r not in members:
        raise SpecError(f"node {nid}: rank {r} is not in process group {pg!r} "
                        f"(ranks {list(members)})", source=str(path), field="pg_name",
                        fix="check the comm groups file against the traces")
    # the simulator's all-gather size is the full output buffer
    return (("coll", kind, members), members, kind,
            size() * (len(members) if kind == "allgather" else 1))


def chakra_workload(paths: Sequence[str | Path], *, groups: dict[str, list[int]] | None = None
                    ) -> Workload:
    """The op graph of per-rank Chakra JSON views (``groups``: ``pg_name`` → ranks)."""
    ranks = read_chakra_json(paths)
    world = len(ranks)
    groups = {str(k): [int(r) for r in v] for k, v in (groups or {}).items()}
    w = Workload(name="chakra-replay")
    done: dict[tuple[int, int], int] = {}          # (rank, node id) → op id
    seen: dict[tuple, int] = defaultdict(int)
    waiting: dict[tuple, dict[int, tuple[dict, list[int]]]] = defaultdict(dict)
    order = [[n for n in nodes] for nodes in ranks]
    ptr = [0] * world
    progressed = True
    while progressed:
        progressed = False
        for r in range(world):
            path = Path(paths[r])
            while ptr[r] < len(order[r]):
                n = order[r][ptr[r]]
                nid = _int(n.get("id", 0), path, "id")
                deps_ids = [_int(d, path, "dataDeps") for d in
                            list(n.get("dataDeps") or []) + list(n.get("ctrlDeps") or [])]
                if any((r, d) not in done for d in deps_ids):
                    if any(all(_int(x.get("id", 0), path, "id") != d for x in order[r])
                           for d in deps_ids):
                        raise SpecError(f"node {nid} depends on a node not in the trace",
                                        source=str(path), field="dataDeps",
                                        fix="pass complete per-rank traces")
                    break
                deps = [done[(r, d)] for d in deps_ids]
                t = n.get("type", "COMP_NODE")
                t = {4: "COMP_NODE", 5: "COMM_SEND_NODE", 6: "COMM_RECV_NODE",
                     7: "COMM_COLL_NODE", 1: "METADATA_NODE"}.get(t, t)
                name = str(n.get("name", f"node{nid}"))
                if t in ("COMP_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "METADATA_NODE",
                         "INVALID_NODE"):
                    done[(r, nid)] = _compute_op(w, r, n, t, name, deps, path)
                    ptr[r] += 1
                    progressed = True
                    continue
                key, members, kind, size = _comm_call(n, t, nid, r, world, groups, path)
                k = key + (seen[(r, key)],)
                if r not in waiting[k]:
                    waiting[k][r] = (n, deps)
                if not set(members) <= set(waiting[k]):
                    break
                all_deps = sorted({d for m in members for d in waiting[k][m][1]})
                if kind == "p2p":
                    op = w.sendrecv(members[0], members[1], size, deps=all_deps, name=name)
                elif kind == "barrier":
                    op = w.collective("allreduce", members, 0.0, deps=all_deps, name=name)
                else:
                    op = w.collective(kind, members, size, deps=all_deps, name=name)
                for m in members:
                    mn = waiting[k][m][0]
                    done[(m, _int(mn.get("id", 0), Path(paths[m]), "id"))] = op
                    seen[(m, key)] += 1
                    ptr[m] += 1
                del waiting[k]
                progressed = True
    stuck = [r for r in range(world) if ptr[r] < len(order[r])]
    if stuck:
        r = stuck[0]
        n = order[r][ptr[r]]
        raise SpecError(f"rank {r}'s node {n.get('id', 0)} ({n.get('name', '')}) waits for a "
                        "matching call on another rank that never comes", source=str(paths[r]),
                        field="nodes", fix="pass every rank's trace of the same run")
    return w
