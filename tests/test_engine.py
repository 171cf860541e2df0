"""The SimPy engine: streams, overlap from dependencies, concurrency, results and traces."""

import json

import pytest

from simulator.engine import simulate
from simulator.errors import SimulationError, SpecError
from simulator.topology import load_topology
from simulator.workload import Workload
from simulator.workload_spec import build_workload, load_workload, rank_groups

GiB = 2**30


def test_same_stream_serialises_and_other_streams_overlap(star8):
    w = Workload()
    a = w.compute(0, "a", duration_s=1e-3)
    w.compute(0, "b", duration_s=1e-3)                     # same stream: after a
    w.compute(0, "c", duration_s=1e-3, stream="aux")       # other stream: alongside a
    res = simulate(star8, w)
    df = res.ops.set_index("name")
    assert df.loc["b", "start_s"] == pytest.approx(1e-3)
    assert df.loc["c", "start_s"] == 0.0
    assert res.step_time_s == pytest.approx(2e-3)
    assert a == 0


def test_communication_overlaps_compute_only_as_dependencies_allow(star8):
    comm_alone = simulate(star8, _ar_only()).step_time_s
    w = Workload()
    for r in range(8):
        w.compute(r, "bwd1", duration_s=5e-3)
    ar = w.collective("allreduce", range(8), GiB, deps=range(8))
    for r in range(8):
        w.compute(r, "bwd2", duration_s=5e-3)              # overlaps the all-reduce
    for r in range(8):
        w.compute(r, "step", duration_s=1e-3, deps=[ar])   # waits for it
    res = simulate(star8, w)
    expected = 5e-3 + max(5e-3, comm_alone) + 1e-3
    assert res.step_time_s == pytest.approx(expected, rel=1e-6)


def _ar_only():
    w = Workload()
    w.collective("allreduce", range(8), GiB)
    return w


def test_concurrent_collectives_share_links(star8):
    one = simulate(star8, _ar_only()).step_time_s
    w = Workload()
    w.collective("allreduce", range(8), GiB, stream="comm:a")
    w.collective("allreduce", range(8), GiB, stream="comm:b")
    two = simulate(star8, w).step_time_s
    bw_part = 2 * 7 / 8 * GiB / 100e9
    assert two == pytest.approx(one + bw_part, rel=0.01)


def test_straggler_slowdown_moves_the_critical_path(star8):
    w = Workload()
    outs = [w.compute(r, "fwd", duration_s=1e-3) for r in range(8)]
    w.collective("allreduce", range(8), 2**20, deps=outs)
    base = simulate(star8, w).step_time_s
    slow = simulate(star8, w, slowdown={3: 1.1}).step_time_s
    assert slow - base == pytest.approx(0.1e-3, rel=1e-6)


def test_deadlock_is_reported():
    t = load_topology("dgx-a100")
    w = Workload()
    # rank 0 issues A then B, rank 1 issues B then A on the same stream: NCCL would hang
    w.collective("allreduce", [0, 1], 1e6, name="A")
    w.collective("allreduce", [1, 2], 1e6, name="B")
    w.collective("allreduce", [2, 0], 1e6, name="C", deps=[1])
    w.ops[0] = w.ops[0].__class__(**{**{f: getattr(w.ops[0], f) for f in w.ops[0].__slots__},
                                      "deps": (2,)})
    with pytest.raises(SimulationError, match="deadlock"):
        simulate(t, w)


def test_results_frame_and_trace(tmp_path):
    t = load_topology("dgx-a100:nodes=2")
    w = load_workload("dp-step", num_gpus=t.num_gpus)
    res = simulate(t, w)
    cols = {"op", "name", "kind", "stream", "start_s", "end_s", "bytes", "flops"}
    assert cols <= set(res.ops.columns)
    assert (res.ops.end_s >= res.ops.start_s).all()
    per = res.per_device(ranks=[0, 9])
    assert set(per["rank"]) == {0, 9} and set(per.device) == {"n0/gpu0", "n1/gpu1"}
    assert len(per[per["rank"] == 9]) == len([o for o in w.ops if 9 in o.ranks])
    path = tmp_path / "t.json"
    res.write_chrome_trace(path, max_ranks=4)
    trace = json.loads(path.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {0, 1, 2, 3}
    # Perfetto: slices on one (pid, tid) track must nest; ours never overlap
    by_track = {}
    for e in xs:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-6
    # compute and communication sit on different tracks of rank 0
    names = {e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert names == {"compute", "comm"}
    # the DP all-reduces overlap backward compute: comm starts before compute ends
    r0 = res.ops[res.ops.first_rank == 0]
    assert r0[r0.kind == "collective"].start_s.min() < r0[r0.kind == "compute"].end_s.max()


def test_rank_groups_megatron_order():
    assert rank_groups(16, 4, 1)[1] == [4, 5, 6, 7]
    assert rank_groups(16, 4, 4)[1] == [1, 5, 9, 13]
    with pytest.raises(SpecError):
        rank_groups(10, 4, 1)


def test_workload_errors_name_the_field():
    with pytest.raises(SpecError, match=r"ops\[1\].deps"):
        build_workload({"ops": [{"id": "a", "type": "compute"},
                                {"id": "b", "type": "compute", "deps": ["zz"]}]}, num_gpus=2)
    with pytest.raises(SpecError, match="ranks"):
        build_workload({"ranks": 99, "ops": [{"id": "a", "type": "compute"}]}, num_gpus=8)


def test_rank_out_of_range_is_a_spec_error():
    w = Workload()
    w.compute(99, "x", duration_s=1.0)
    with pytest.raises(SpecError, match="rank 99"):
        simulate(load_topology("dgx-a100"), w)


def test_same_inputs_same_result():
    t = load_topology("h100-ib:nodes=4")
    w = load_workload("dp-step", num_gpus=t.num_gpus)
    a, b = simulate(t, w), simulate(t, w)
    assert a.ops.equals(b.ops)
