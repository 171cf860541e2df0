"""The incremental flow engine against a from-scratch reference, and symmetric against explicit.

The engine re-solves max-min fairness only over the batches linked to a change and advances a
batch only when its rates change. The reference below does what the definition says, with no
shortcut: at every arrival or completion it re-solves every flow in flight over the whole
fabric. Both must give the same completion time for every batch.
"""

import numpy as np
import pytest
import simpy

from simulator.collectives import plan_collective, run_plan
from simulator.network import FlowNetwork, route
from simulator.network.maxmin import maxmin_rates
from simulator.topology import load_topology


def _reference(topo, arrivals):
    """Completion time of each batch ``(start_s, routes, nbytes)``: global max-min re-solved
    at every arrival and every completion, time advanced event to event."""
    cap = topo.effective_capacity_Bps()
    pending = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    flows = []      # [batch, links, fracs, remaining, size]
    done_at = [None] * len(arrivals)
    t = 0.0
    while pending or flows:
        if flows:
            f_idx = np.concatenate([np.full(len(f[1]), k) for k, f in enumerate(flows)])
            rates = maxmin_rates(f_idx, np.concatenate([f[1] for f in flows]),
                                 np.concatenate([f[2] for f in flows]), cap, len(flows))
            left = np.array([f[3] for f in flows]) / rates
            t_done = t + left.min()
        else:
            rates, t_done = None, np.inf
        t_arr = arrivals[pending[0]][0] if pending else np.inf
        t_next = min(t_done, t_arr)
        for k, f in enumerate(flows):
            f[3] -= rates[k] * (t_next - t)
        t = t_next
        flows = [f for f in flows if f[3] > 1e-9 * f[4]]
        for b in set(range(len(arrivals))) - {f[0] for f in flows} - set(pending):
            if done_at[b] is None:
                done_at[b] = t
        while pending and arrivals[pending[0]][0] <= t:
            b = pending.pop(0)
            _, rt, nbytes = arrivals[b]
            for i in range(rt.n_flows):
                sel = rt.flow == i
                flows.append([b, rt.link[sel], rt.frac[sel], float(nbytes[i]), float(nbytes[i])])
    return np.array(done_at)


def _engine(topo, arrivals, mode="explicit"):
    env = simpy.Environment()
    net = FlowNetwork(env, topo, mode=mode)
    done = [None] * len(arrivals)

    def start(i):
        t0, rt, nbytes = arrivals[i]
        yield env.timeout(t0)
        yield net.transfer(rt, nbytes)
        done[i] = env.now

    for i in range(len(arrivals)):
        env.process(start(i))
    env.run()
    return np.array(done), net


def _random_batches(topo, seed, n_batches=24):
    rng = np.random.default_rng(seed)
    n = topo.num_gpus
    arrivals = []
    for _ in range(n_batches):
        k = int(rng.integers(1, 6))
        src = rng.integers(0, n, size=k)
        dst = (src + rng.integers(1, n, size=k)) % n
        nbytes = rng.uniform(1e6, 5e8, size=k)
        arrivals.append((float(rng.uniform(0, 0.01)), route(topo, src, dst), nbytes))
    return arrivals


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_engine_equals_global_resolve(seed):
    topo = load_topology("llama3-h100-24k", gpus=64)
    arrivals = _random_batches(topo, seed)
    ref = _reference(topo, arrivals)
    got, _ = _engine(topo, arrivals)
    assert got == pytest.approx(ref, rel=1e-6)


def test_lone_batches_take_no_solve():
    topo = load_topology("llama3-h100-24k", gpus=64)
    # eight point-to-point sends inside eight different nodes: nothing is shared
    arrivals = [(0.0, route(topo, [8 * i], [8 * i + 1]), np.array([1e8])) for i in range(8)]
    got, net = _engine(topo, arrivals)
    assert net.stats.solves == 0
    assert got == pytest.approx(_reference(topo, arrivals), rel=1e-9)


def test_symmetric_equals_explicit_on_concurrent_rings():
    """Four DP rings on different rails, started at different times, sharing the spine: the
    symmetric reduction (with its cached reductions reused for the repeated phase) agrees
    with the explicit flows."""
    topo = load_topology("llama3-h100-24k", gpus=256)
    plans = [plan_collective(topo, "allreduce", list(range(r, 256, 8)), 2**28, algo="ring")
             for r in range(4)]
    times = {}
    for mode in ("explicit", "symmetric"):
        env = simpy.Environment()
        net = FlowNetwork(env, topo, mode=mode)
        ends = []

        def go(p, delay):
            yield env.timeout(delay)
            for _ in range(2):                  # the same phase twice: a cache hit
                yield from run_plan(env, net, p)
            ends.append(env.now)

        for k, p in enumerate(plans):
            env.process(go(p, 1e-4 * k))
        env.run()
        times[mode] = sorted(ends)
    assert times["symmetric"] == pytest.approx(times["explicit"], rel=1e-3)


def test_batches_of_one_shape_share_an_analysis_and_keep_their_own_links():
    """The DP rings of eight rails have one shape over different links: reduced in turn in one
    space they share one analysis, and each gives exactly the rows a reduction from scratch
    gives (same classes, coefficients and multiplicities), on its own links' classes."""
    from simulator.network.symmetric import ClassSpace, symmetric_reduce
    topo = load_topology("llama3-h100-24k", gpus=256)
    batches = [plan_collective(topo, "allreduce", list(range(r, 256, 8)), 2**28,
                               algo="ring").phases[0] for r in range(8)]
    shared, fresh = ClassSpace(topo), ClassSpace(topo)
    links = []
    for ph in batches:
        nbytes = np.broadcast_to(np.asarray(ph.nbytes, float), (ph.routes.n_flows,))
        got = symmetric_reduce(ph.routes, nbytes, shared)
        fresh.shapes.clear()
        want = symmetric_reduce(ph.routes, nbytes, fresh)
        for f in ("n_flows", "flow", "link", "frac", "latency_s"):
            assert np.array_equal(getattr(got[0], f), getattr(want[0], f)), f
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
        assert got[2].sum() == ph.routes.n_flows          # every flow stands in a row
        links.append(frozenset(got[0].link.tolist()))
    assert len(shared.shapes) == 1
    assert len(set(links)) == len(batches)                 # no two rails share a class row
