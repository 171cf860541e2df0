"""Workloads as YAML: an SPMD program of compute and collective ops, expanded per rank.

Each op is written once and runs on every rank of the workload (``ranks:``, default all GPUs of
the topology). Collectives run over groups carved out of those ranks by ``group: {size, stride}``
(Megatron-style: stride 1 gives contiguous groups such as tensor-parallel groups, stride = TP
size gives data-parallel groups); the default group is all ranks. A dependency on another op
means the instance of that op on the same rank (or the group containing the rank). Example::

    name: dp-step
    ops:
      - {id: fwd, type: compute, flops: 2.4e12, bytes: 3 GB}
      - {id: bwd, type: compute, flops: 4.8e12, bytes: 6 GB, deps: [fwd]}
      - {id: grads, type: allreduce, size: 1 GiB, deps: [bwd], stream: comm}
      - {id: step, type: compute, bytes: 8 GB, deps: [grads]}

Fields of an op: ``id`` (unique), ``type`` (compute, delay, allreduce, allgather, reducescatter,
alltoall, broadcast), ``deps`` (ids), ``stream`` (default compute / comm), ``category``,
compute: ``flops``, ``bytes``, ``dtype``, ``duration`` (fixed time); delay: ``duration``;
collectives: ``size`` (nccl-tests convention), ``group``, ``algo``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from simulator.collectives import KINDS
from simulator.errors import SpecError
from simulator.fileio import builtin_names, read_spec_mapping
from simulator.validation import Fields
from simulator.workload import Workload

__all__ = ["load_workload", "build_workload", "builtin_workload_names", "rank_groups"]

_COLL = tuple(k for k in KINDS if k != "sendrecv")


def builtin_workload_names() -> list[str]:
    return builtin_names("simulator.workloads")


def rank_groups(n: int, size: int, stride: int = 1) -> list[list[int]]:
    """Partition ranks 0..n−1 into groups of ``size`` members spaced ``stride`` apart.

    >>> rank_groups(8, 2, 1)
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> rank_groups(8, 4, 2)
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    if size < 1 or stride < 1 or n % (size * stride):
        raise SpecError(f"cannot split {n} ranks into groups of {size} with stride {stride}",
                        field="group", fix=f"use a size × stride that divides {n}")
    groups = []
    for base in range(0, n, size * stride):
        for off in range(stride):
            groups.append([base + off + j * stride for j in range(size)])
    return groups


def load_workload(ref: str | Path, *, num_gpus: int) -> Workload:
    """Load a workload YAML by path or built-in name and expand it over ``num_gpus`` ranks."""
    doc, source = read_spec_mapping(ref, package="simulator.workloads", what="workload",
                                    fix="start with 'name:' and 'ops:'")
    return build_workload(doc, num_gpus=num_gpus, source=source)


def build_workload(doc: Mapping[str, Any], *, num_gpus: int, source: str = "<mapping>") -> Workload:
    """Expand an SPMD workload mapping into a per-rank :class:`Workload`."""
    f = Fields(doc, source)
    f.check_keys({"name", "description", "ranks", "ops", "kind"})
    n = f.int("ranks", num_gpus, minimum=1)
    if n > num_gpus:
        raise f.err("ranks", f"{n} ranks but the topology has {num_gpus} GPUs",
                    "lower ranks or use a bigger topology (--gpus)")
    ops = doc.get("ops")
    if not isinstance(ops, list) or not ops:
        raise f.err("ops", "expected a non-empty list of ops", "add '- {id: fwd, type: compute, flops: 1e12}'")
    w = Workload(name=f.str("name", "workload"))
    # per op id: for each rank, the op id it became
    inst: dict[str, dict[int, int]] = {}
    for i, raw in enumerate(ops):
        if not isinstance(raw, Mapping):
            raise f.err(f"ops[{i}]", f"expected a mapping, got {raw!r}", "write {id: x, type: compute}")
        of = Fields(raw, source, f.path(f"ops[{i}]"))
        of.check_keys({"id", "type", "deps", "stream", "category", "flops", "bytes", "dtype",
                       "duration", "size", "group", "algo", "name"})
        oid = of.str("id", required=True)
        if oid in inst:
            raise of.err("id", f"duplicate op id {oid!r}", "give every op a unique id")
        typ = of.str("type", required=True, choices=("compute", "delay") + _COLL)
        deps = raw.get("deps") or []
        if not isinstance(deps, list):
            raise of.err("deps", f"expected a list of op ids, got {deps!r}", "write deps: [fwd]")
        for d in deps:
            if not isinstance(d, str) or d not in inst:
                raise of.err("deps", f"unknown or later op {d!r}", "depend only on ops listed above")
        name = of.str("name", oid)
        cat = of.str("category", typ if typ in ("compute", "delay") else "comm")
        inst[oid] = {}
        if typ in ("compute", "delay"):
            stream = of.str("stream", "compute")
            flops = of.float("flops", 0.0, maximum=1e24)
            nbytes = of.bytes("bytes", 0)
            dur = of.time("duration", None, required=typ == "delay")
            dtype = of.str("dtype", "bf16")
            for r in range(n):
                inst[oid][r] = w.compute(r, name, flops=flops, bytes_moved=nbytes, dtype=dtype,
                                         stream=stream, duration_s=dur, category=cat,
                                         deps=[inst[d][r] for d in deps])
        else:
            stream = of.str("stream", "comm")
            size = of.bytes("size", required=True)
            gf = of.sub("group")
            gf.check_keys({"size", "stride"})
            gsize = gf.int("size", n, minimum=1)
            stride = gf.int("stride", 1, minimum=1)
            try:
                groups = rank_groups(n, gsize, stride)
            except SpecError as e:
                raise of.err("group", e.message, e.fix or "") from None
            algo = of.str("algo", "auto")
            for g in groups:
                dep_ids = sorted({inst[d][r] for d in deps for r in g})
                op = w.collective(typ, g, size, name=name, stream=stream, algo=algo,
                                  deps=dep_ids, category=cat)
                for r in g:
                    inst[oid][r] = op
    return w
