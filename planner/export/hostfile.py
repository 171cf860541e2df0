"""Rank placement: host list, rank → host/GPU map, MPI rankfile and torchrun per-host settings.

NCCL numbers nodes by first appearance scanning ranks 0..n-1 (formats.md §6.3), so the launcher
must put each global rank exactly where the plan placed it. torchrun gives global rank
``node_rank * nproc_per_node + local_rank`` and local rank i the i-th entry of
``CUDA_VISIBLE_DEVICES``; that works when every host holds one contiguous block of ranks. The
OpenMPI rankfile expresses any placement.
"""

from __future__ import annotations

import json
import shlex
from typing import Mapping

from simulator.errors import SpecError

from planner.export import _plan

__all__ = ["export_hostfile", "validate_hostfile", "HOSTFILE", "RANK_MAP", "RANKFILE",
           "TORCHRUN_FILE", "placement_from_files"]

HOSTFILE = "hostfile"
RANK_MAP = "rank_map.json"
RANKFILE = "rankfile"
TORCHRUN_FILE = "torchrun_hosts.txt"


def export_hostfile(plan: dict) -> dict[str, str]:
    """Plan → hostfile, rank_map.json, rankfile and (when expressible) torchrun_hosts.txt."""
    _plan.check_plan(plan)
    ranks = sorted(plan["ranks"], key=lambda e: e["rank"])
    order = _plan.hosts_in_order(plan)
    names: dict[int, str] = {}
    for e in ranks:
        names.setdefault(e["host"], _plan.host_name(e))
    if len(set(names.values())) != len(names):
        names = {h: f"host{h}" for h in names}
    on_host: dict[int, list[dict]] = {h: [] for h in order}
    for e in ranks:
        on_host[e["host"]].append(e)
    slots = {h: len(v) for h, v in on_host.items()}
    nproc = slots[order[0]]
    contiguous = all(slots[h] == nproc for h in order) and all(
        [e["rank"] for e in on_host[h]] == list(range(k * nproc, (k + 1) * nproc))
        for k, h in enumerate(order))
    node_rank = {h: k for k, h in enumerate(order)}
    hosts = [{"name": names[h], "host_id": h, "node_rank": node_rank[h], "slots": slots[h],
              "building": on_host[h][0].get("building", 0),
              "cuda_visible_devices": [e["gpu"] for e in on_host[h]]} for h in order]
    rank_map = {
        "format": "clusterplan.rank-map", "schema_version": 1,
        "model": plan.get("model"), "topology": plan.get("topology"),
        "world_size": len(ranks), "gpus_per_host": max(slots.values()),
        "torchrun_compatible": contiguous,
        "hosts": hosts,
        "ranks": [{"rank": e["rank"], "host": names[e["host"]], "local_gpu": e["gpu"],
                   "local_rank": on_host[e["host"]].index(e), "node_rank": node_rank[e["host"]],
                   "building": e.get("building", 0), "device": e.get("device"),
                   **{ax: e[ax] for ax in ("tp", "cp", "dp", "pp")}} for e in ranks],
    }
    files = {
        HOSTFILE: "".join(f"{names[h]} slots={slots[h]}\n" for h in order),
        RANK_MAP: json.dumps(rank_map, indent=1) + "\n",
        RANKFILE: "".join(f"rank {e['rank']}={names[e['host']]} slot={e['gpu']}\n"
                          for e in ranks),
    }
    if contiguous:
        files[TORCHRUN_FILE] = (
            f"# torchrun --nnodes {len(order)} --nproc-per-node {nproc} "
            f"--master-addr {names[order[0]]}: on each host set\n" + "".join(
                " ".join(shlex.quote(t) for t in (
                    names[h], f"NODE_RANK={node_rank[h]}", f"NPROC_PER_NODE={nproc}",
                    "CUDA_VISIBLE_DEVICES=" + ",".join(str(e["gpu"]) for e in on_host[h])))
                + "\n" for h in order))
    validate_hostfile(files, plan)
    return files


def placement_from_files(files: Mapping[str, str]) -> dict[int, tuple[str, int]]:
    """What a launcher would do: global rank → (host name, GPU index), from the files alone."""
    out: dict[int, tuple[str, int]] = {}
    if TORCHRUN_FILE in files:
        for line in files[TORCHRUN_FILE].splitlines():
            toks = shlex.split(line, comments=True)
            if not toks:
                continue
            env = dict(t.split("=", 1) for t in toks[1:])
            n, k = int(env["NPROC_PER_NODE"]), int(env["NODE_RANK"])
            gpus = [int(g) for g in env["CUDA_VISIBLE_DEVICES"].split(",")]
            for local, g in enumerate(gpus):
                out[k * n + local] = (toks[0], g)
    else:
        for line in files[RANKFILE].splitlines():
            left, _, right = line.partition("=")
            host, _, slot = right.partition(" slot=")
            out[int(left.split()[1])] = (host, int(slot))
    return out


def validate_hostfile(files: Mapping[str, str], plan: Mapping | None = None) -> dict:
    """Re-parse every file; each launcher path must reproduce the rank map."""
    rank_map = json.loads(files[RANK_MAP])
    want = {r["rank"]: (r["host"], r["local_gpu"]) for r in rank_map["ranks"]}
    host_lines = [shlex.split(x) for x in files[HOSTFILE].splitlines() if x.strip()]
    if [h[0] for h in host_lines] != [h["name"] for h in rank_map["hosts"]]:
        raise SpecError("host order differs from the rank map", source=HOSTFILE,
                        fix="report this exporter bug")
    mpi = placement_from_files({RANKFILE: files[RANKFILE]})
    if mpi != want:
        raise SpecError("rankfile does not reproduce the rank map", source=RANKFILE,
                        fix="report this exporter bug")
    if TORCHRUN_FILE in files and placement_from_files(files) != want:
        raise SpecError("torchrun settings do not reproduce the rank map", source=TORCHRUN_FILE,
                        fix="report this exporter bug")
    if plan is not None:
        names = {h["host_id"]: h["name"] for h in rank_map["hosts"]}
        if want != {e["rank"]: (names[e["host"]], e["gpu"]) for e in plan["ranks"]}:
            raise SpecError("rank map differs from the plan", source=RANK_MAP,
                            fix="report this exporter bug")
    return rank_map
