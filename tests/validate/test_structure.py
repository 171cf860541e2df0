"""Issue 10, first slice: a real torch.distributed (gloo) run of a plan issues exactly the
communication of the simulator's op graph for that plan; a wrong expectation is caught; a rank
that fails or hangs ends the run within its timeout, named, with no process left behind.

The unit tests need no torch process group; the real runs share one pool of spawned processes
(torch imported once per process) to stay within this 2-core machine's test budget.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace

import pytest

from simulator.errors import SpecError
from simulator.topology import load_topology
from simulator.workload import Workload

from planner.measure.validate.compare import compare_rank, compare_structure, events_from_records
from planner.measure.validate.config import Scale, load_source, run_config
from planner.model.llm.layout import Layout
from planner.model.llm.spec import LLMSpec, ModelSpec, TrainingSpec, load_llm_spec, parse_parallel
from planner.model.llm.stages import chunk_layer_counts
from planner.workloads.llm.comm_events import CommEvent, comm_events
from planner.workloads.llm.partition import (
    dp_bucket_elements,
    p2p_activation_bytes,
    rank_params,
)
from planner.workloads.llm.step import build_step, resolve_parallel

torch = pytest.importorskip("torch")


def tiny(tp_layers: int = 4, ffn: str = "swiglu", kv: int = 4, recompute: str = "none",
         gbs: int = 8) -> LLMSpec:
    return LLMSpec(model=ModelSpec(name="tiny", layers=tp_layers, hidden_size=64,
                                   ffn_hidden_size=128, num_heads=4, num_kv_heads=kv,
                                   vocab_size=256, seq_len=16, ffn=ffn),
                   training=TrainingSpec(global_batch_size=gbs, micro_batch_size=1,
                                         precision="fp32", activation_recompute=recompute),
                   parallel=None, source="tiny")


def expanded(spec: LLMSpec, par: str, world: int, **kw):
    topo = load_topology(f"localhost-gloo:node.gpus={world}")
    p = resolve_parallel(spec, parse_parallel(par), world)
    return build_step(spec, p, topo, expand_collectives=True, sequence_parallel=False, **kw)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- simulator side, no processes ----------------------------------------------------------------

def test_comm_events_moves_representative_ops_to_every_rank():
    lay = Layout(tp=2, cp=1, dp=2, pp=2)          # ranks: tp inner, then dp, then pp
    w = Workload()
    f = w.compute(0, "F mb0 c0", duration_s=0.0, category="pass")
    ar = w.collective("allreduce", lay.group("tp", 0), 64, name="tp attn", stream="compute",
                      deps=[f], category="tp")
    w.compute(0, "later work", duration_s=1.0, deps=[ar])
    w.sendrecv(0, 4, 32, deps=[ar], name="act", category="pp")
    w.collective("allreduce", lay.group("dp", 1), 128, name="grads", category="dp")
    ev3 = comm_events(w, lay, 3)                  # tp=1, dp=1, pp=0
    assert [(e.kind, e.group) for e in ev3] == [("pass", (3,)), ("allreduce", (2, 3)),
                                                 ("send", (3, 7)), ("allreduce", (1, 3))]
    ev1 = comm_events(w, lay, 1)                  # in the DP group [1, 3] given explicitly
    assert [(e.kind, e.group, e.name) for e in ev1] == [
        ("pass", (1,), "F mb0 c0"), ("allreduce", (0, 1), "tp attn"), ("send", (1, 5), "act"),
        ("allreduce", (1, 3), "grads")]
    # the receiver sees the message where the workload lists it, on its own coordinates
    assert comm_events(w, lay, 6) == [CommEvent("recv", 32, (2, 6), "act", "pp")]
    with pytest.raises(SpecError):
        comm_events(w, lay, 8)


def test_expanded_step_lists_megatron_tp_collectives_per_block():
    spec = tiny(recompute="full")
    plan = expanded(spec, "tp=2,pp=1,dp=1", 2)
    micro, layers = plan.microbatches, spec.model.layers
    ev = comm_events(plan.workload, plan.layout, 1)
    names = [e.name for e in ev if e.kind == "allreduce"]
    per_block = {ps: sum(1 for n in names if re.search(rf" {ps} mb\d+ c\d+ l\d+$", n))
                 for ps in "FRB"}
    # Megatron without sequence parallelism: 2 all-reduces per block forward, 2 backward, and
    # the full-recompute forward's 2 again
    assert per_block == {"F": 2 * layers * micro, "R": 2 * layers * micro,
                         "B": 2 * layers * micro}
    # embedding (forward), 3 fp32 cross-entropy all-reduces, the logits' input gradient
    assert sum("embed" in n for n in names) == micro
    xent = [e for e in ev if "xent" in e.name]
    assert len(xent) == 3 * micro and {e.bytes for e in xent} == {spec.model.seq_len * 4}
    assert sum("logits B" in n for n in names) == micro
    # backward order inside a block: the MLP's input gradient first, then attention's
    b0 = [n for n in names if n.endswith(f"B mb0 c0 l{layers - 1}")]
    assert b0 == [f"tp mlp B mb0 c0 l{layers - 1}", f"tp attn B mb0 c0 l{layers - 1}"]
    # collectives sit on the real TP group, not folded into compute
    assert all(e.group == (0, 1) for e in ev if e.kind == "allreduce")


def test_expanded_dp_buckets_are_exact_slices_of_the_rank_parameters():
    spec = tiny()
    plan = expanded(spec, "tp=2,pp=2,dp=2", 8, dp_buckets=3)
    p = plan.parallel
    chunks = chunk_layer_counts(spec.model.layers, p.pp, p.vpp)
    for rank in range(8):
        s = plan.layout.coords(rank)["pp"]
        grads = [e for e in comm_events(plan.workload, plan.layout, rank) if e.category == "dp"]
        n = rank_params(spec, p, chunks, s, 0)
        k = min(3, chunks[s][0])
        assert [e.bytes for e in grads] == [4 * x for x in dp_bucket_elements(n, k)]
        assert all(e.group == tuple(plan.layout.group("dp", rank)) for e in grads)
    assert dp_bucket_elements(10, 4) == [2, 3, 2, 3] and sum(dp_bucket_elements(7, 3)) == 7


def test_folded_step_is_unchanged_by_the_new_options():
    spec = load_llm_spec("llama3-8b")
    topo = load_topology("h100-ib", gpus=64)
    p = resolve_parallel(spec, parse_parallel("tp=4,pp=2,dp=8"), 64)
    plan = build_step(spec, p, topo)
    cats = {op.category for op in plan.workload.ops}
    assert "tp" not in cats and "pass" not in cats
    m, t = spec.model, spec.training
    full = t.micro_batch_size * m.seq_len * m.hidden_size * 2
    sends = {op.bytes_moved for op in plan.workload.ops if op.kind == "sendrecv"}
    assert sends == {full / p.tp}              # the folded step's scatter-gather assumption
    assert p2p_activation_bytes(spec, p, sequence_parallel=False) == (full / p.tp, False)
    assert p2p_activation_bytes(spec, p, sequence_parallel=False, expanded=True) == (full, False)
    assert p2p_activation_bytes(spec, p, sequence_parallel=False, scatter_gather=True,
                                expanded=True) == (full / p.tp, True)
    assert p2p_activation_bytes(spec, p, sequence_parallel=True, expanded=True) == \
        (full / p.tp, False)
    with pytest.raises(SpecError, match="mixture-of-experts"):
        moe = load_llm_spec("mixtral-8x7b")
        pm = resolve_parallel(moe, parse_parallel("tp=2,pp=1,dp=4,ep=2"), 8)
        build_step(moe, pm, load_topology("dgx-a100"), expand_collectives=True)


@pytest.mark.parametrize("tp,ffn,kv", [(1, "swiglu", 4), (2, "swiglu", 2), (4, "gelu", 4),
                                        (2, "gelu", 4)])
def test_rank_params_counts_the_real_model(tp, ffn, kv):
    from planner.measure.validate.model import TPGroup, build_chunk, param_count
    spec = tiny(ffn=ffn, kv=kv)
    p = parse_parallel(f"tp={tp},pp=2,dp=1")
    chunks = chunk_layer_counts(spec.model.layers, 2, 1)
    group = TPGroup(None, None, tuple(range(tp)), 0)
    for s, first, last, layers in ((0, True, False, range(0, 2)), (1, False, True, range(2, 4))):
        chunk = build_chunk(spec.model, group, layers, first=first, last=last,
                            recompute="none", seed=0)
        assert param_count(chunk) == rank_params(spec, p, chunks, s, 0)


def test_compare_reports_the_first_difference_per_channel():
    exp = [CommEvent("pass", 0, (0,), "F mb0 c0", "pass"),
           CommEvent("allreduce", 64, (0, 1), "tp attn F mb0 c0 l0", "tp"),
           CommEvent("send", 32, (0, 2), "act mb0 v1", "pp"),
           CommEvent("allreduce", 400, (0, 4), "grads s0c0b0", "dp"),
           CommEvent("allreduce", 400, (0, 4), "grads s0c0b1", "dp")]
    assert compare_rank(0, 0, exp, list(exp)) is None
    mm = compare_rank(0, 0, exp, exp[:-1])                    # one bucket fewer
    assert (mm.channel, mm.index, mm.measured) == ("dp group [0, 4]", 1, None)
    swapped = [exp[0], exp[2], exp[1], *exp[3:]]              # TP/PP interleaving: not compared
    assert compare_rank(0, 0, exp, swapped) is None
    late = [exp[0], replace(exp[2], name="act mb1 v1"), *exp[3:], exp[1]]
    assert compare_rank(0, 0, exp, late).channel == "pipeline"
    rep = compare_structure({0: exp}, {0: {0: list(exp), 1: exp[:-1]}})
    assert not rep.match and rep.first.step == 1 and "real run nothing" in rep.first.text()
    recs = [(0, "pass", 0, (0,), "F mb0 c0", "pass", 0.0, 0.0),
            (0, "wait", 0, (0, 2), "wait act", "pp-wait", 0.0, 0.1)]
    assert events_from_records(recs) == {0: [exp[0]]}


def test_bad_input_names_the_field():
    spec, par, _order, _src = load_source("llama3-8b")
    for text, nproc, field in (("tp=2,pp=2,dp=1", 3, "--nproc"), ("tp=2,cp=2,dp=1", 4, "cp"),
                               ("tp=3,dp=1", 3, "--heads"), ("tp=2,dp=1,fsdp=zero3", 2, "fsdp")):
        with pytest.raises(SpecError) as exc:
            run_config(spec, par, parallel_text=text, nproc=nproc, scale=Scale())
        assert field in str(exc.value)
    from planner.cli.main import main
    assert main(["validate", "llama3-8b", "--parallel", "tp=2,dp=1", "--backend", "nccl"]) == 2
    assert main(["validate", "llama3-8b", "--parallel", "tp=2,dp=1",
                 "--inject-fault", "5:hang@0"]) == 2


# -- real runs ---------------------------------------------------------------------------------

CONFIGS = {
    "dp2": dict(par="tp=1,pp=1,dp=2"),
    "tp2": dict(par="tp=2,pp=1,dp=1"),
    "pp2-1f1b": dict(par="tp=1,pp=2,dp=1"),
    "tp2xdp2": dict(par="tp=2,pp=1,dp=2"),
    "pp2xdp2": dict(par="tp=1,pp=2,dp=2"),
    "tp2xpp2": dict(par="tp=2,pp=2,dp=1"),
    "tp2xpp2-recompute-scatter": dict(par="tp=2,pp=2,dp=1", recompute="full",
                                      p2p_scatter_gather=True),
    "pp2-interleaved-vpp2": dict(par="tp=1,pp=2,dp=1,vpp=2"),
    "pp2-gpipe-gelu": dict(par="tp=1,pp=2,dp=1,fsdp=none", model="gpt3-175b",
                           schedule="gpipe"),
}


def _config(name: str):
    c = dict(CONFIGS[name])
    spec, par, _order, _src = load_source(c.pop("model", "llama3-8b"))
    text = c.pop("par")
    world = parse_parallel(text).world()
    return run_config(spec, par, parallel_text=text, nproc=world,
                      scale=Scale(layers=2 * parse_parallel(text).pp * parse_parallel(text).vpp,
                                  hidden=64, seq=32, vocab=256),
                      steps=1, warmup=1, timeout_s=30.0, **c)


@pytest.fixture(scope="module")
def runs():
    """Every configuration run for real once, on one pool of 4 spawned processes."""
    from planner.measure.validate.runner import run_many
    cfgs = {name: _config(name) for name in CONFIGS}
    t0 = time.monotonic()
    results = run_many(list(cfgs.values()))
    wall = time.monotonic() - t0
    return {name: (cfgs[name], res) for name, res in zip(cfgs, results)}, wall


@pytest.mark.parametrize("name", list(CONFIGS))
def test_real_run_issues_exactly_the_simulated_communication(runs, name):
    from planner.measure.validate.expected import expected_step
    from planner.measure.validate.runner import RunFailed
    cfg, res = runs[0][name]
    assert not isinstance(res, RunFailed), str(res)
    exp = expected_step(cfg)
    measured = {r["rank"]: events_from_records(r["events"]) for r in res.ranks}
    rep = compare_structure(exp.events, measured)
    assert rep.match, rep.first.text()
    assert rep.steps == 2 and rep.ranks == cfg.world
    p = cfg.parallel
    kinds = {k.split()[0] for k in rep.counts}
    assert kinds == {a for a, on in (("tp", p.tp > 1), ("dp", p.dp > 1), ("pp", p.pp > 1)) if on}
    if name == "tp2":   # Megatron's count, derived independently of the op graph
        m, micro = cfg.spec.model, cfg.microbatches
        assert rep.counts["tp allreduce"] == cfg.world * micro * (4 * m.layers + 1 + 3 + 1)
    for r in res.ranks:                      # the model trained: a finite loss near ln(vocab)
        for loss in r["losses"]:
            assert 0.5 < loss / torch.log(torch.tensor(float(cfg.spec.model.vocab_size))) < 1.5
    assert all(_dead(pid) for pid in res.pids)


def test_a_wrong_expectation_is_a_mismatch(runs):
    from planner.measure.validate.expected import expected_step
    cfg, res = runs[0]["tp2xdp2"]
    measured = {r["rank"]: events_from_records(r["events"]) for r in res.ranks}
    buckets = sum(e.category == "dp" for e in measured[0][0])
    assert buckets == 2                        # min(dp_buckets, blocks per chunk)
    wrong = expected_step(cfg, dp_buckets=buckets - 1)               # one bucket fewer
    rep = compare_structure(wrong.events, measured)
    assert not rep.match
    assert rep.first.channel.startswith("dp group") and rep.first.expected != rep.first.measured


def test_report_has_the_json_keys(runs):
    from planner.measure.validate.report import format_report, validate
    cfg, res = runs[0]["pp2xdp2"]
    d = validate(cfg, result=res)
    for key in ("predicted_step_time_s", "measured_step_time_s", "relative_error"):
        assert isinstance(d[key], float)
    assert d["structure"]["match"] and d["measured_step_time_s"] > 0
    assert d["relative_error"] == pytest.approx(
        d["predicted_step_time_s"] / d["measured_step_time_s"] - 1)
    assert set(d["per_kind"]) == {"compute", "tp", "dp", "pp"}
    assert "MATCH" in format_report(d)


@pytest.mark.parametrize("fault,named", [("1:hang@1", "rank 1 hung"),
                                         ("0:raise@1", "rank 0 raised RuntimeError"),
                                         ("1:exit@0", "rank 1 exited with code 3")])
def test_a_failing_rank_ends_the_run_named_and_leaves_no_process(fault, named):
    from planner.measure.validate.config import parse_fault
    from planner.measure.validate.runner import RunFailed, run
    timeout = 4.0
    cfg = replace(_config("dp2"), timeout_s=timeout, fault=parse_fault(fault))
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as exc:
        run(cfg)
    took = time.monotonic() - t0
    assert named in str(exc.value), str(exc.value)
    assert exc.value.exit_code == 1
    assert took < 60.0
    assert exc.value.pids and all(_dead(pid) for pid in exc.value.pids)
