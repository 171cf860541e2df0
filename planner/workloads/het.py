"""Parameter-server training with per-worker embedding caches (HET, papers.md §9) as simulator
workloads: the spec (``kind: het``), the cache run over an access stream
(:mod:`planner.model.tables.het_cache`), and one op graph per iteration whose PS traffic shares
the topology's links.

Spec (YAML or JSON)::

    kind: het
    embedding: {rows: 10000000, dim: 64}       # one embedding space, fp32 rows
    batch_size: 4096                           # samples per worker and iteration
    lookups_per_sample: 26                     # ids per sample, all tables
    access: {zipf: 1.05}                       # or {dlrm_datasets: "2021"}
    workers: 8                                 # ranks 0..workers-1 of the topology
    servers: 2                                 # PS shards, on ranks spread over the topology
    cache: {ratio: 0.05, policy: lru, pull_bound: 10, push_bound: 10}
    dense: {flops_per_sample: 2.0e7, params: 5.0e6}
    iterations: 10
    seed: 0

The summary covers every iteration and, under ``steady``, the second half (the caches filled).
Per iteration and worker: pulls from each server (the rows its cache missed or found stale),
the dense forward and backward, pushes to each server (the rows whose un-pushed updates passed
the bound, or were evicted), and the dense gradients' all-reduce over the workers. A worker
whose server sits on its own GPU reads and writes it locally. ``dlrm_datasets`` access draws
Zipf ids with the exponent that gives the file set's accesses per distinct row in one batch
(planner/model/tables/access.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from simulator.engine import simulate
from simulator.result import SimResult
from simulator.errors import SpecError
from simulator.fileio import read_spec_mapping
from simulator.topology import Topology
from simulator.validation import Fields
from simulator.workload import Workload

from planner.model.tables.access import load_locality_stats, zipf_reuse
from planner.model.tables.het_cache import POLICIES, CacheStats, simulate_caches, zipf_stream

__all__ = ["HetSpec", "load_het_spec", "parse_het", "run_het", "iteration_workload"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HetSpec:
    rows: int
    dim: int
    batch_size: int
    lookups_per_sample: int
    zipf: float
    access: str
    workers: int
    servers: int
    cache_ratio: float
    policy: str
    pull_bound: int
    push_bound: int
    flops_per_sample: float
    dense_params: float
    iterations: int
    seed: int
    source: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("source")
        return d


def load_het_spec(ref: str) -> HetSpec:
    doc, source = read_spec_mapping(ref, package="planner.models", what="het spec",
                                    fix="write kind: het with embedding:, workers: ...")
    return parse_het(doc, source=source)


def parse_het(doc, *, source: str) -> HetSpec:
    f = Fields(doc, source)
    f.check_keys({"kind", "embedding", "batch_size", "lookups_per_sample", "access", "workers",
                  "servers", "cache", "dense", "iterations", "seed", "description"})
    e, a, c, d = f.sub("embedding", required=True), f.sub("access"), f.sub("cache"), f.sub("dense")
    e.check_keys({"rows", "dim"})
    a.check_keys({"zipf", "dlrm_datasets"})
    c.check_keys({"ratio", "policy", "pull_bound", "push_bound"})
    d.check_keys({"flops_per_sample", "params"})
    rows = e.int("rows", required=True, minimum=1, maximum=2**31 - 1)
    batch = f.int("batch_size", 4096, minimum=1, maximum=2**24)
    lookups = f.int("lookups_per_sample", 26, minimum=1, maximum=10**5)
    if a.has("zipf") and a.has("dlrm_datasets"):
        raise a.err("zipf", "both zipf and dlrm_datasets given", "give one access model")
    if a.has("dlrm_datasets"):
        name = a.str("dlrm_datasets", choices=("2021", "2022"))
        zipf, access = _zipf_for_locality(name, rows, batch * lookups), f"dlrm_datasets {name}"
    else:
        zipf = a.float("zipf", 1.05, minimum=0.0, maximum=4.0)
        access = f"zipf {zipf:g}"
    return HetSpec(
        rows=rows, dim=e.int("dim", 64, minimum=1, maximum=65536), batch_size=batch,
        lookups_per_sample=lookups, zipf=zipf, access=access,
        workers=f.int("workers", 8, minimum=1, maximum=4096),
        servers=f.int("servers", 1, minimum=1, maximum=4096),
        cache_ratio=c.float("ratio", 0.05, minimum=0.0, maximum=1.0),
        policy=c.str("policy", "lru", choices=POLICIES),
        pull_bound=c.int("pull_bound", 0, minimum=0), push_bound=c.int("push_bound", 0, minimum=0),
        flops_per_sample=d.float("flops_per_sample", 2.0e7),
        dense_params=d.float("params", 5.0e6), iterations=f.int("iterations", 10, minimum=1,
                                                                  maximum=10000),
        seed=f.int("seed", 0), source=source)


def _zipf_for_locality(name: str, rows: int, accesses: int) -> float:
    """The Zipf exponent whose batches of ``accesses`` ids over ``rows`` rows touch each
    distinct row as often, on average, as the dlrm_datasets file set's batches do."""
    target = load_locality_stats(name).accesses_per_row
    lo, hi = 0.0, 3.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if zipf_reuse(round(mid, 6), rows, float(accesses))[1] < target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def _server_ranks(spec: HetSpec, topo: Topology) -> list[int]:
    return [j * topo.num_gpus // spec.servers for j in range(spec.servers)]


def iteration_workload(spec: HetSpec, stats: CacheStats, it: int, topo: Topology) -> Workload:
    """The op graph of iteration ``it``: pulls, dense compute, pushes, dense all-reduce."""
    w = Workload(name=f"het iteration {it}")
    srv = _server_ranks(spec, topo)
    workers = list(range(spec.workers))
    ends = []
    for r in workers:
        pulls = [w.sendrecv(srv[j], r, n * stats.row_bytes, name=f"pull s{j}", stream=f"ps{j}",
                            category="ps pull")
                 for j, n in enumerate(stats.pulls_by_server[it, r]) if n and srv[j] != r]
        comp = w.compute(r, "dense fwd+bwd", flops=spec.flops_per_sample * spec.batch_size,
                         bytes_moved=0.0, deps=pulls, dtype="bf16", category="compute")
        ends += [w.sendrecv(r, srv[j], n * stats.row_bytes, name=f"push s{j}", stream=f"ps{j}",
                            deps=[comp], category="ps push")
                 for j, n in enumerate(stats.pushes_by_server[it, r]) if n and srv[j] != r]
        ends.append(comp)
    if spec.workers > 1:
        w.collective("allreduce", workers, spec.dense_params * 4, name="dense grads",
                     deps=ends, category="dp")
    return w


def run_het(spec: HetSpec, topo: Topology) -> dict:
    """Run the caches over the access stream and simulate every iteration; the summary, and
    the last iteration's simulation (``"last"``) for its timeline."""
    if spec.workers > topo.num_gpus:
        raise SpecError(f"{spec.workers} workers on a topology of {topo.num_gpus} GPUs",
                        source=spec.source, field="workers",
                        fix=f"use at most {topo.num_gpus} workers or a larger topology")
    stream = zipf_stream(rows=spec.rows, exponent=spec.zipf,
                         lookups=spec.batch_size * spec.lookups_per_sample,
                         workers=spec.workers, iterations=spec.iterations, seed=spec.seed)
    stats = simulate_caches(stream, rows=spec.rows, capacity=int(spec.cache_ratio * spec.rows),
                            servers=spec.servers, policy=spec.policy,
                            pull_bound=spec.pull_bound, push_bound=spec.push_bound, dim=spec.dim)
    sims: list[SimResult] = [simulate(topo, iteration_workload(spec, stats, it, topo))
                             for it in range(spec.iterations)]
    pulled, pushed = stats.bytes_per_iteration()
    steps = np.array([s.step_time_s for s in sims])
    load = stats.server_rows * stats.row_bytes
    warm = slice(spec.iterations // 2, None)       # the caches have filled: the steady state
    lookups = stats.hits[warm].sum() + stats.pulls[warm].sum()
    return {"last": sims[-1], "summary": {
        "spec": spec.to_dict(), "hit_rate": stats.hit_rate,
        "stale_refresh_rate": float(stats.stale.sum() / max(1, stats.pulls.sum())),
        "pulled_bytes_per_iteration": float(pulled.mean()),
        "pushed_bytes_per_iteration": float(pushed.mean()),
        "server_bytes_per_iteration": [float(x) for x in load.mean(0)],
        "step_time_mean_s": float(steps.mean()), "step_time_max_s": float(steps.max()),
        "step_times_s": [float(x) for x in steps],
        "samples_per_s": spec.workers * spec.batch_size / float(steps.mean()),
        "steady": {"iterations": f"{warm.start + 1}..{spec.iterations}",
                   "hit_rate": float(stats.hits[warm].sum() / max(1, lookups)),
                   "pulled_bytes_per_iteration": float(pulled[warm].mean()),
                   "pushed_bytes_per_iteration": float(pushed[warm].mean()),
                   "step_time_mean_s": float(steps[warm].mean())}}}
