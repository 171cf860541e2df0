"""Per-worker embedding caches with bounded staleness (HET, issue 26 item 4): the simulated
cache against a direct replay through cachetools (exact for LRU), staleness and LFU on hand-
worked streams, bytes conserved into the simulated PS traffic, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from simulator.topology import load_topology

from planner.model.tables.het_cache import _first_use_order, simulate_caches, zipf_stream
from planner.workloads.het import iteration_workload, parse_het, run_het

cachetools = pytest.importorskip("cachetools")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("capacity", [0, 50, 2000, 20000])
def test_lru_hits_equal_a_direct_replay_through_cachetools(capacity):
    rows, workers, iters = 50000, 3, 6
    stream = zipf_stream(rows=rows, exponent=1.1, lookups=5000, workers=workers,
                         iterations=iters, seed=capacity)
    s = simulate_caches(stream, rows=rows, capacity=capacity, servers=2, policy="lru",
                        pull_bound=10**9, push_bound=10**9, dim=16)
    want = np.zeros((iters, workers), dtype=int)
    for w in range(workers):
        cache = cachetools.LRUCache(maxsize=max(capacity, 1))
        for it in range(iters):
            for k in _first_use_order(stream[it][w]):
                if capacity and k in cache:
                    want[it, w] += 1
                    cache[k]                      # a hit refreshes its recency
                elif capacity:
                    cache[k] = True
    np.testing.assert_array_equal(s.hits, want)
    np.testing.assert_array_equal(s.hits + s.pulls, [[len(_first_use_order(x)) for x in row]
                                                     for row in stream])


def test_staleness_bounds_on_a_hand_worked_stream():
    """Two workers both use row 7 every iteration. With push bound 0 each pushes its update at
    once, so the server clock moves by 2 per iteration while each copy moves by its own 1: with
    pull bound 0 every later lookup is a stale refresh; with pull bound 1 the copy is 1 behind
    after one iteration (a hit) and 2 behind after two (a refresh), and so on."""
    stream = [[np.array([7]), np.array([7])] for _ in range(4)]
    tight = simulate_caches(stream, rows=10, capacity=4, servers=1, policy="lru",
                            pull_bound=0, push_bound=0, dim=8)
    assert tight.pulls.tolist() == [[1, 1]] + [[1, 1]] * 3       # first miss, then stale
    assert tight.stale.tolist() == [[0, 0]] + [[1, 1]] * 3
    assert tight.pushes.tolist() == [[1, 1]] * 4
    loose = simulate_caches(stream, rows=10, capacity=4, servers=1, policy="lru",
                            pull_bound=1, push_bound=0, dim=8)
    assert loose.hits.tolist() == [[0, 0], [1, 1], [0, 0], [1, 1]]
    lazy = simulate_caches(stream, rows=10, capacity=4, servers=1, policy="lru",
                           pull_bound=100, push_bound=2, dim=8)
    assert lazy.pushes.sum(1).tolist() == [0, 0, 2, 0]           # the 3rd update goes out


def test_lfu_keeps_the_frequent_row_lru_does_not():
    # row 1 used 3 times, then 2, 3 once each, then 4: LRU evicts 1 (least recent), LFU keeps it
    stream = [[np.array([k])] for k in (1, 1, 1, 2, 3, 4, 1)]
    lru = simulate_caches(stream, rows=10, capacity=3, servers=1, policy="lru",
                          pull_bound=10, push_bound=10, dim=4)
    lfu = simulate_caches(stream, rows=10, capacity=3, servers=1, policy="lfu",
                          pull_bound=10, push_bound=10, dim=4)
    assert lru.hits[-1, 0] == 0 and lfu.hits[-1, 0] == 1


def _spec(**kw):
    doc = {"kind": "het", "embedding": {"rows": 200000, "dim": 32}, "batch_size": 512,
           "lookups_per_sample": 8, "workers": 4, "servers": 2, "iterations": 3,
           "cache": {"ratio": 0.05, "pull_bound": 4, "push_bound": 4}}
    return replace(parse_het(doc, source="het.yaml"), **kw)


def test_simulated_ps_traffic_carries_the_cache_bytes():
    spec = _spec()
    topo = load_topology("dgx-h100:nodes=2")
    out = run_het(spec, topo)
    s = out["summary"]
    assert 0.0 < s["hit_rate"] < 1.0
    sim = out["last"]
    t = sim.table
    moved = sum(b for b, c in zip(t["bytes"], t["category"]) if c in ("ps pull", "ps push"))
    # what the caches pulled and pushed, less the rows of servers on the worker's own GPU
    stream = zipf_stream(rows=spec.rows, exponent=spec.zipf, lookups=512 * 8, workers=4,
                         iterations=3, seed=0)
    stats = simulate_caches(stream, rows=spec.rows, capacity=int(0.05 * spec.rows), servers=2,
                            policy="lru", pull_bound=4, push_bound=4, dim=32)
    w = iteration_workload(spec, stats, 2, topo)
    assert moved == pytest.approx(sum(o.bytes_moved for o in w.ops if o.kind == "sendrecv"))
    local = stats.pulls_by_server[2, 0, 0] + stats.pushes_by_server[2, 0, 0]   # rank 0 serves
    assert moved == pytest.approx((stats.pulls[2].sum() + stats.pushes[2].sum() - local)
                                  * stats.row_bytes)
    # a bigger cache moves fewer bytes and is not slower
    small = run_het(replace(spec, cache_ratio=0.002), topo)["summary"]
    assert small["pulled_bytes_per_iteration"] > s["pulled_bytes_per_iteration"]
    big = run_het(replace(spec, cache_ratio=0.5), topo)["summary"]
    assert big["pulled_bytes_per_iteration"] <= s["pulled_bytes_per_iteration"]
    assert s["step_time_mean_s"] <= small["step_time_mean_s"] * 1.001


def test_dlrm_datasets_access_matches_the_file_sets_reuse():
    doc = {"kind": "het", "embedding": {"rows": 1000000, "dim": 16}, "batch_size": 4096,
           "lookups_per_sample": 26, "access": {"dlrm_datasets": "2021"}}
    spec = parse_het(doc, source="het.yaml")
    ids = zipf_stream(rows=spec.rows, exponent=spec.zipf, lookups=4096 * 26, workers=1,
                      iterations=1, seed=3)[0][0]
    per_row = ids.size / np.unique(ids).size
    assert per_row == pytest.approx(6.9, rel=0.1)      # the 2021 set's accesses per row


def test_cli_prints_json_writes_the_timeline_and_refuses_bad_bounds(tmp_path):
    doc = {"kind": "het", "embedding": {"rows": 100000, "dim": 16}, "batch_size": 256,
           "workers": 4, "servers": 2, "iterations": 2,
           "cache": {"ratio": 0.1, "policy": "lfu", "pull_bound": 2, "push_bound": 2}}
    path = tmp_path / "het.json"
    path.write_text(json.dumps(doc))
    cmd = [sys.executable, "-m", "planner.cli", "simulate", str(path), "--topology",
           "dgx-h100", "--json", "--trace", str(tmp_path / "t.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["server_bytes_per_iteration"]) == 2 and len(d["step_times_s"]) == 2
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("pull") for e in events)
    for field, bad in (("push_bound", -1), ("ratio", 1.5), ("policy", "fifo")):
        doc["cache"] = {field: bad}
        path.write_text(json.dumps(doc))
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 2 and f"cache.{field}" in r.stderr


def test_doctest():
    import doctest

    from planner.model.tables import het_cache
    res = doctest.testmod(het_cache)
    assert res.failed == 0 and res.attempted > 0
