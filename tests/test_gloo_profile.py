"""The measured gloo profile (simulator/gloo_profile.py) and how the engine uses it: per-size
collective tables, the wake-up cost after compute, communication taking turns with compute on
each rank's core, host time added to kernel time on a CPU; closed forms, and bad input."""

from __future__ import annotations

import math

import pytest

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.gloo_profile import CommTable, gloo_profile_from_dict
from simulator.topology import load_topology
from simulator.workload import Workload


def profile_doc(**over) -> dict:
    doc = {
        "format": "clusterplan.gloo-profile", "version": 1, "shared_core": True,
        "comm": {"allreduce@2": [[4, 100e-6], [1024, 200e-6], [1048576, 1.2e-3]],
                 "sendrecv@2": [[4, 50e-6], [1048576, 0.5e-3]]},
        "wake_penalty_s": [[1e-4, 1e-4], [1e-3, 4e-4], [1e-2, 1e-3]],
        "compute": {"peak_fp32_flops": 1e11, "memory_bandwidth_Bps": 5e10,
                    "launch_overhead_s": 2e-6,
                    "matmul_fp32": [[1e6, 0.5], [1e9, 0.9]], "memory": [[1e4, 1.0], [1e8, 0.3]]},
        "host_block_s": {"forward": 2e-4, "backward": 3e-4},
    }
    doc.update(over)
    return doc


def test_table_interpolates_log_log_and_extrapolates_by_the_last_bandwidth():
    t = CommTable("allreduce", 2, (4.0, 1024.0, 1048576.0), (100e-6, 200e-6, 1.2e-3))
    assert t.time_s(1) == 100e-6 and t.time_s(1024) == pytest.approx(200e-6)
    # geometric midpoint in bytes → geometric mean in time
    assert t.time_s(64) == pytest.approx(math.sqrt(100e-6 * 200e-6))
    per_byte = (1.2e-3 - 200e-6) / (1048576 - 1024)
    assert t.time_s(2 * 1048576) == pytest.approx(1.2e-3 + 1048576 * per_byte)


def test_calls_above_the_largest_measured_size_are_told_apart_and_listed():
    from planner.measure.validate.dlrm_report import comm_extrapolations
    p = gloo_profile_from_dict(profile_doc())
    assert p.beyond_measured("allreduce", 2, 1048576) is None     # the last point itself
    assert p.beyond_measured("allreduce", 2, 1048577) == 1048576
    assert p.beyond_measured("allreduce", 4, 1e12) is None        # no table: not timed by it
    w = Workload()
    w.collective("allreduce", [0, 1], 1024)
    w.collective("allreduce", [0, 1], 3e6)
    w.collective("allreduce", [0, 1], 5e6)
    w.sendrecv(0, 1, 2e6)
    notes = comm_extrapolations(w, p)
    assert len(notes) == 2
    assert notes[0].startswith("allreduce of up to 5.0 MB on 2 processes") and "1.0 MB" in notes[0]
    assert notes[1].startswith("sendrecv of up to 2.0 MB on 2 processes")
    small = Workload()
    small.collective("allreduce", [0, 1], 1024)
    assert comm_extrapolations(small, p) == []


def _oversubscribed(**measured) -> dict:
    return profile_doc(measured={"machine": {"cpu_count": 2}, "processes": 4, **measured})


def test_ranks_pinned_to_a_core_share_it_in_proportion_to_who_computes():
    """4 processes measured on 2 cores, rank r pinned to core r mod 2: a profile time is work
    at half a core. A rank whose core-mate is idle runs it at a whole core (half the time);
    beside a busy core-mate at half a core (the time itself)."""
    topo = load_topology("localhost-gloo:node.gpus=4")
    prof = gloo_profile_from_dict(_oversubscribed())
    assert (prof.cores, prof.processes) == (2, 4)

    def step(busy) -> float:
        w = Workload()
        for r in busy:
            w.compute(r, f"work{r}", duration_s=1.0)
        return simulate(topo, w, measured_comm=prof).step_time_s
    assert step([0]) == pytest.approx(0.5)
    assert step([0, 1]) == pytest.approx(0.5)      # one rank on each core
    assert step([0, 2]) == pytest.approx(1.0)      # both on core 0
    assert step([0, 1, 2, 3]) == pytest.approx(1.0)
    # unequal work: rank 0 2 s, the others 1 s -> ranks 0 and 2 share core 0 until 1 s, then
    # rank 0 alone with 0.5 core-s left at a whole core
    w = Workload()
    for r in range(4):
        w.compute(r, f"work{r}", duration_s=2.0 if r == 0 else 1.0)
    res = simulate(topo, w, measured_comm=prof)
    ops = res.ops.set_index("name")
    assert ops.loc["work1", "end_s"] == pytest.approx(1.0)
    assert res.step_time_s == pytest.approx(1.5)
    # a profile without the record, or a core for every rank: every rank its own core
    for doc in (profile_doc(), _oversubscribed(machine={"cpu_count": 4})):
        assert simulate(topo, w, measured_comm=gloo_profile_from_dict(doc)).step_time_s == \
            pytest.approx(2.0)
    # measured with a core per process, run with 4 ranks on those 2 cores: half a core each
    # while all four compute, then rank 0's last second alone
    two = gloo_profile_from_dict(_oversubscribed(processes=2))
    assert simulate(topo, w, measured_comm=two).step_time_s == pytest.approx(3.0)


def test_a_core_computes_faster_while_the_other_cores_are_idle():
    """Measured with a core per process (2 on 2) and a core alone 1.25x faster than with both
    busy: closed forms. Both busy: the profile time; one busy: the time / 1.25; unequal work
    (rank 0 2 s, rank 1 1 s): both busy until 1 s, then rank 0's last second at 1.25x."""
    topo = load_topology("localhost-gloo:node.gpus=2")
    doc = profile_doc(measured={"machine": {"cpu_count": 2}, "processes": 2},
                      contention={"alone_speedup": 1.25})
    prof = gloo_profile_from_dict(doc)
    assert prof.alone_speedup == 1.25

    def step(work, p=prof) -> float:
        w = Workload()
        for r, d in enumerate(work):
            if d:
                w.compute(r, f"work{r}", duration_s=d)
        return simulate(topo, w, measured_comm=p).step_time_s
    assert step([1.0, 1.0]) == pytest.approx(1.0)
    assert step([1.0, 0.0]) == pytest.approx(0.8)
    assert step([2.0, 1.0]) == pytest.approx(1.0 + 1.0 / 1.25)
    # without the section (a profile that predates the probe): the measured speed throughout
    old = gloo_profile_from_dict(profile_doc(measured={"machine": {"cpu_count": 2},
                                                       "processes": 2}))
    assert old.alone_speedup is None and step([2.0, 1.0], old) == pytest.approx(2.0)
    # 4 ranks on 2 cores, 2 per core: rank 0 alone has its core to itself and the host too
    four = gloo_profile_from_dict({**_oversubscribed(), "contention": {"alone_speedup": 1.5}})
    t4 = load_topology("localhost-gloo:node.gpus=4")
    w = Workload()
    w.compute(0, "work0", duration_s=1.0)
    assert simulate(t4, w, measured_comm=four).step_time_s == pytest.approx(0.5 / 1.5)


@pytest.mark.parametrize("value", [0.9, "fast", True, None])
def test_bad_contention_record_names_the_field(value):
    with pytest.raises(SpecError) as err:
        gloo_profile_from_dict(profile_doc(contention={"alone_speedup": value}), source="p.yaml")
    assert err.value.field == "contention.alone_speedup" and err.value.source == "p.yaml"


@pytest.mark.parametrize("measured,field", [({"processes": 0}, "measured.processes"),
                                            ({"machine": {"cpu_count": "2"}},
                                             "measured.machine.cpu_count")])
def test_bad_core_record_names_the_field(measured, field):
    with pytest.raises(SpecError) as err:
        gloo_profile_from_dict(profile_doc(measured=measured), source="p.yaml")
    assert err.value.field == field


def test_wake_cost_is_zero_back_to_back_and_clamped_after_the_longest_gap():
    p = gloo_profile_from_dict(profile_doc())
    assert p.wake_s(0.0) == 0.0
    assert p.wake_s(5e-5) == pytest.approx(5e-5)               # linear from 0 to the first point
    assert p.wake_s(1e-3) == pytest.approx(4e-4)
    assert p.wake_s(math.sqrt(1e-3 * 1e-2)) == pytest.approx(7e-4)   # linear in log(gap)
    assert p.wake_s(1.0) == pytest.approx(1e-3)
    assert p.comm_time_s("allreduce", 2, 1024, gap_s=1e-3) == pytest.approx(200e-6 + 4e-4)
    assert p.comm_time_s("allreduce", 4, 1024) is None         # no table for 4 processes
    assert p.comm_time_s("alltoall", 2, 1024) is None


def test_engine_times_measured_calls_and_shares_each_rank_core():
    topo = load_topology("localhost-gloo:node.gpus=2")
    prof = gloo_profile_from_dict(profile_doc())
    w = Workload()
    w.compute(0, "work", duration_s=2e-3)
    w.collective("allreduce", [0, 1], 1024, stream="comm")     # independent of the compute
    shared = simulate(topo, w, measured_comm=prof)
    ops = shared.ops.set_index("name")
    assert ops.loc["allreduce", "algorithm"] == "measured"
    # rank 0's core runs the compute first (issued first), then the call: 2 ms idle before
    # it on rank 1 → the call pays the wake cost of a 2 ms gap
    wake = prof.wake_s(2e-3)
    assert ops.loc["allreduce", "duration_s"] == pytest.approx(200e-6 + wake)
    assert shared.step_time_s == pytest.approx(2e-3 + 200e-6 + wake)
    unshared = gloo_profile_from_dict(profile_doc(shared_core=False))
    free = simulate(topo, w, measured_comm=unshared)
    assert free.step_time_s == pytest.approx(2e-3)             # overlapped: the compute's time
    p2p = Workload()
    p2p.sendrecv(0, 1, 1048576)
    assert simulate(topo, p2p, measured_comm=prof).step_time_s == pytest.approx(0.5e-3)


def test_host_time_is_added_to_kernels_on_a_cpu():
    from dataclasses import replace as dc_replace

    from planner.model.llm.host import HostOverhead
    from planner.model.llm.layout import Layout
    from planner.model.llm.spec import load_llm_spec, parse_parallel
    from planner.workloads.llm.passes import pass_times
    from planner.workloads.llm.step import resolve_parallel
    spec = load_llm_spec("llama3-8b")
    spec = dc_replace(spec, training=dc_replace(spec.training, precision="fp32"))
    topo = load_topology("localhost-gloo:node.gpus=1")
    prof = gloo_profile_from_dict(profile_doc()).compute
    p = resolve_parallel(spec, parse_parallel("tp=1,pp=1,dp=1"), 1)
    lay = Layout(1, 1, 1, 1)
    host = HostOverhead(forward_s=0.5, backward_s=0.7, recompute_s=0.5)
    d_max, d_sum = {}, {}
    pass_times(spec, p, topo, lay, prof, detail=d_max, host=host)
    pass_times(spec, p, topo, lay, prof, detail=d_sum, host=host, host_serial=True)
    # the full-size block takes far more than 0.5 s of kernels on one core: max() = kernels
    kernels = d_max["layer_fwd_s"][0]
    assert kernels > 0.5
    from dataclasses import replace

    from planner.model.llm.kernels import block_kernels, kernels_time
    no_launch = replace(prof, launch_overhead_s=0.0)
    t = spec.training
    blk = block_kernels(spec.model, b=t.micro_batch_size, tp=1, cp=1, precision=t.precision)
    assert d_sum["layer_fwd_s"][0] == pytest.approx(kernels_time(no_launch, blk) + 0.5)


@pytest.mark.parametrize("change,field", [
    ({"format": "something else"}, "format"),
    ({"comm": {"gather@2": [[4, 1e-4], [8, 2e-4]]}}, "comm.gather@2"),
    ({"comm": {"allreduce@2": [[8, 1e-4], [4, 2e-4]]}}, "comm.allreduce"),
    ({"wake_penalty_s": [[0, 1e-4]]}, "wake_penalty_s"),
])
def test_bad_profile_names_the_field(change, field):
    with pytest.raises(SpecError) as e:
        gloo_profile_from_dict(profile_doc(**change), source="p.yaml")
    assert e.value.field is not None and e.value.field.startswith(field)
    assert "p.yaml" in str(e.value)


def test_missing_section_is_a_located_error():
    doc = profile_doc()
    del doc["compute"]
    with pytest.raises(SpecError) as e:
        gloo_profile_from_dict(doc, source="p.yaml")
    assert "p.yaml" in str(e.value) and "calibrate gloo" in str(e.value)


def test_heap_policy_is_read_and_a_bad_one_named():
    """``measured.heap`` (planner/measure/heap.py): absent in profiles that predate it (glibc's
    defaults then), read when present, refused with its field when unknown."""
    assert gloo_profile_from_dict(profile_doc()).heap == "system"
    assert gloo_profile_from_dict(profile_doc(measured={"heap": "retain"})).heap == "retain"
    with pytest.raises(SpecError) as e:
        gloo_profile_from_dict(profile_doc(measured={"heap": "jemalloc"}), source="p.yaml")
    assert e.value.field == "measured.heap" and "calibrate gloo" in e.value.fix


def test_uneven_all_to_all_is_priced_between_the_mean_and_the_busiest_rank():
    """Closed form: rank 1 sends 3 KiB to each of 3 peers, the others 1 KiB each; every rank's
    larger of sent and received bytes is [5, 9, 5, 5] KiB (rank 0 sends 3 and receives 3 from
    rank 1 and 1 from each other), mean 6 KiB, busiest 9 KiB."""
    k = 1024.0
    splits = [[0, k, k, k], [3 * k, 0, 3 * k, 3 * k], [k, k, 0, k], [k, k, k, 0]]
    table = [[1024, 1e-4], [65536, 1e-3]]
    busiest = 9 * k
    doc = profile_doc(comm={**profile_doc()["comm"], "alltoall@4": table})
    old = gloo_profile_from_dict(doc)
    t = CommTable("alltoall", 4, (1024.0, 65536.0), (1e-4, 1e-3))
    # no measured weight: the busiest rank's bytes, as before the probe
    assert old.comm_time_s("alltoall", 4, busiest, splits=splits) == pytest.approx(t.time_s(busiest))
    for w, expect in ((0.0, 6 * k), (0.5, 7.5 * k), (1.0, busiest)):
        prof = gloo_profile_from_dict({**doc, "alltoall_uneven": {"weight": w}})
        assert prof.comm_time_s("alltoall", 4, busiest, splits=splits) == \
            pytest.approx(t.time_s(expect))
        # an equal exchange and other kinds are unchanged
        eq = [[0 if i == j else k for j in range(4)] for i in range(4)]
        assert prof.comm_time_s("alltoall", 4, 3 * k, splits=eq) == pytest.approx(t.time_s(3 * k))
        assert prof.comm_time_s("allreduce", 2, 1024, splits=splits) == pytest.approx(200e-6)


def test_all_to_all_with_a_byte_matrix_is_timed_on_the_alltoallv_table():
    """A plan's all-to-all (split lists, as TorchRec calls it) is looked up on ``alltoallv``
    at its busiest rank's bytes off the diagonal, whatever ``nbytes`` says; the equal table
    (keyed by the whole buffer) still times a call without splits, and a profile without
    ``alltoallv`` falls back to it. Rank 1 of 2 sends 3 KiB, rank 0 1 KiB: both ranks' larger
    of sent and received is 3 KiB, the mean 3 KiB, so the weight changes nothing."""
    k = 1024.0
    splits = [[5 * k, k], [3 * k, 7 * k]]            # the diagonal (kept chunks) is not sent
    equal = [[1024, 1e-4], [65536, 1e-3]]
    v = [[1024, 3e-4], [65536, 3e-3]]
    doc = profile_doc(comm={**profile_doc()["comm"], "alltoall@2": equal, "alltoallv@2": v},
                      alltoall_uneven={"weight": 0.5})
    prof = gloo_profile_from_dict(doc, source="p.yaml")
    tv = CommTable("alltoallv", 2, (1024.0, 65536.0), (3e-4, 3e-3))
    te = CommTable("alltoall", 2, (1024.0, 65536.0), (1e-4, 1e-3))
    assert prof.comm_time_s("alltoall", 2, 12 * k, splits=splits) == pytest.approx(tv.time_s(3 * k))
    assert prof.comm_time_s("alltoall", 2, 3 * k) == pytest.approx(te.time_s(3 * k))
    del doc["comm"]["alltoallv@2"]
    old = gloo_profile_from_dict(doc)
    assert old.comm_time_s("alltoall", 2, 3 * k, splits=splits) == pytest.approx(te.time_s(3 * k))
    # extrapolation is judged on the table that times the call, in its convention
    big = [[0, 1e6], [1e5, 0]]
    assert prof.beyond_measured("alltoall", 2, 5e4, splits=big) == 65536
    assert prof.beyond_measured("alltoall", 2, 5e4) is None


@pytest.mark.parametrize("value", [1.5, -0.1, "half", True, None])
def test_bad_uneven_weight_names_the_field(value):
    with pytest.raises(SpecError) as err:
        gloo_profile_from_dict(profile_doc(alltoall_uneven={"weight": value}), source="p.yaml")
    assert err.value.field == "alltoall_uneven.weight" and err.value.source == "p.yaml"


def test_uneven_section_weighs_the_skewed_exchange_between_the_equal_ones():
    """Two ranks, two rounds, one size: per case the slowest rank's median per round, the
    median over rounds; weight (skewed - equal) / (at max - equal), clipped to [0, 1]."""
    from planner.measure.validate.uneven_a2a import uneven_section

    def rank(scale):
        return {rnd: {4096: {"equal": [1.0 * scale, 1.1 * scale, 0.9 * scale],
                             "skewed": [1.5 * scale] * 3, "equal_at_max": [3.0 * scale] * 3}}
                for rnd in (0, 1)}
    sec = uneven_section([rank(1.0), rank(2.0)])["alltoall_uneven"]
    assert sec["points"] == [[4096, 2.0, 3.0, 6.0]]   # median of each repeat's slowest (rank 1)
    assert sec["weight"] == pytest.approx((3.0 - 2.0) / (6.0 - 2.0))
    fast = {0: {4096: {"equal": [1.0], "skewed": [0.5], "equal_at_max": [2.0]}}}
    assert uneven_section([fast])["alltoall_uneven"]["weight"] == 0.0
