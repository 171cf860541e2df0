"""Token-wise activation swap (MEMO, issue 26 item 2): alpha's closed form, the simulated swap
streams against the forward's closed form, the memory it needs, the longest-sequence search,
the topology's host link against the measured PCIe copies, and bad settings."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.llm.longctx import fits, longest_sequence
from planner.llm.metrics import simulate_llm
from planner.model.llm.offload import alpha_closed_form, host_copy_Bps
from planner.model.llm.spec import parse_llm_spec
from planner.workloads.llm.step import build_step, resolve_parallel

REPO = Path(__file__).resolve().parents[2]


def _spec(seq=65536, alpha="auto", layers=8, recompute="none", pp=1, offload=True):
    d = {"model": {"kind": "transformer", "name": "memo-t", "layers": layers,
                   "hidden_size": 2048, "ffn_hidden_size": 8192, "num_heads": 16,
                   "vocab_size": 32000, "seq_len": seq, "ffn": "gelu"},
         "training": {"global_batch_size": 1, "activation_recompute": recompute},
         "parallel": {"tp": 8, "pp": pp, "dp": 1}}
    if offload:
        d["training"]["offload"] = {"alpha": alpha}
    return parse_llm_spec(d, source="memo.yaml")


def test_alpha_closed_form_bounds():
    kw = dict(layers=34, s_in=1.0, s_attn=1.0, s_oth=10.0)
    assert alpha_closed_form(copy_Bps=1.0, layer_s=7.0, host_bytes=1e9, **kw) == (0.5, "pcie")
    assert alpha_closed_form(copy_Bps=1e9, layer_s=1.0, host_bytes=32 * 4.0, **kw) \
        == (0.2, "host memory")
    assert alpha_closed_form(copy_Bps=1.0, layer_s=1.0, host_bytes=1e9, **kw)[0] == 0.0
    assert alpha_closed_form(copy_Bps=1e9, layer_s=1.0, host_bytes=1e12, **kw)[0] == 1.0


def _starts(sim, layers):
    names = list(sim.table["name"])
    return [float(sim.table["start_s"][names.index(f"F mb0 c0 l{k}")]) for k in range(layers)]


@pytest.mark.parametrize("pcie", ["2000 GB/s", "20 GB/s", "4 GB/s"])
def test_swap_streams_match_the_forward_closed_form(pcie):
    """One block's forward (with its TP collectives) lasting L and its swap-out D (two
    buffers, one copy stream): blocks run back to back when D ≤ L; otherwise block k ≥ 2 waits
    for the copy of block k − 2, which queues behind the copies before it, so block k starts
    L + (k − 1)·D after block 0. Blocks are alike here, so this is exact."""
    layers = 8
    spec = _spec(alpha=1.0, layers=layers)
    topo = load_topology(f"dgx-h100:node.pcie_bandwidth={pcie}")
    p = resolve_parallel(spec, spec.parallel, topo.num_gpus)
    plan = build_step(spec, p, topo)
    sim = simulate(topo, plan.workload)
    D = plan.info["offload"].swap_s
    t = _starts(sim, layers)
    L = t[1] - t[0]
    assert L >= plan.info["layer_fwd_s"][0]
    for k in range(2, layers):
        want = k * L if D <= L else L + (k - 1) * D
        assert t[k] - t[0] == pytest.approx(want, rel=1e-9), (k, L, D)
    streams = {s for s, c in zip(sim.table["stream"], sim.table["category"])
               if c == "offload"}
    assert streams == {"d2h", "h2d"}
    assert sum(c == "offload" for c in sim.table["category"]) == 2 * (layers - 2)


def test_alpha_auto_is_the_closed_form_of_the_simulated_block():
    spec = _spec(seq=262144, layers=16)
    topo = load_topology("dgx-h100")
    plan = build_step(spec, resolve_parallel(spec, spec.parallel, 8), topo)
    o = plan.info["offload"]
    want = alpha_closed_form(copy_Bps=o.copy_Bps, layer_s=plan.info["layer_fwd_s"][0],
                             host_bytes=o.host_bytes_per_gpu, layers=16, s_in=o.s_in,
                             s_attn=o.s_attn, s_oth=o.s_oth)
    assert (o.alpha, o.bound) == want
    # the skeletal split is MEMO's: block input and attention output are 2 of 16·b·s·h/tp
    assert o.s_in == pytest.approx(o.s_attn) and o.s_in * 16 / 2 == pytest.approx(
        o.full_bytes - o.s_oth + o.s_in * 14 / 2, rel=0.3)


def test_offload_memory_is_two_blocks_and_a_buffer_not_every_block():
    topo = load_topology("dgx-h100")
    none = simulate_llm(_spec(offload=False, layers=16), _spec(offload=False).parallel, topo)
    memo = simulate_llm(_spec(alpha=0.5, layers=16), _spec().parallel, topo)
    o = memo.plan.info["offload"]
    blocks = none.memory.stages[0]["block_activation_bytes"]
    assert o.full_bytes == pytest.approx(blocks, rel=1e-9)
    # without offload 16 blocks stay on the GPU; with it two, plus one swap buffer
    saved = none.memory.activations_bytes - memo.memory.activations_bytes
    assert saved == pytest.approx(16 * blocks - 2 * blocks - o.swap_bytes, rel=0.02)
    assert memo.to_dict()["offload"]["alpha"] == 0.5


def test_longest_sequence_is_the_fit_boundary():
    topo = load_topology("dgx-h100")
    spec = _spec(layers=16)
    out = longest_sequence(spec, spec.parallel, topo, step=65536, limit=2**23)
    assert out["fits"] and 65536 <= out["seq_len"] < 2**23
    from dataclasses import replace
    above = replace(spec, model=replace(spec.model, seq_len=out["seq_len"] + 65536))
    assert not fits(simulate_llm(above, spec.parallel, topo))


def test_host_link_matches_the_measured_pinned_copies():
    """dgx-h100 states PCIe Gen5 x16 at 64 GB/s and a PCIe efficiency of 0.85 (set before
    these measurements): the host copy bandwidth they give is within 3% of the pinned
    device-to-host copies measured on an H100 (traces/measured/h100-sxm/offload/pcie.csv)."""
    topo = load_topology("dgx-h100")
    model = host_copy_Bps(dict(topo.params), topo.comm.efficiency["pcie"])
    with (REPO / "traces/measured/h100-sxm/offload/pcie.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["host"] == "pinned"
                and r["direction"] == "d2h" and int(r["bytes"]) >= 2**26]
    for r in rows:
        assert model / 1e9 == pytest.approx(float(r["gbps"]), rel=0.03)


def test_bad_offload_settings_name_the_field(tmp_path):
    topo = load_topology("dgx-h100")
    with pytest.raises(SpecError) as e:
        _spec(alpha=1.5)
    assert e.value.field == "training.offload.alpha"
    two = load_topology("dgx-h100:nodes=2")
    for spec, field in ((_spec(recompute="full"), "training.activation_recompute"),
                        (_spec(pp=2), "training.offload")):
        with pytest.raises(SpecError) as e:
            build_step(spec, resolve_parallel(spec, spec.parallel, 8 * spec.parallel.pp),
                       two if spec.parallel.pp > 1 else topo)
        assert e.value.field == field
    spec = _spec()
    with pytest.raises(SpecError) as e:           # a topology that states no host memory
        build_step(spec, resolve_parallel(spec, spec.parallel, 8),
                   load_topology("dgx-h100:node.host_memory=0"))
    assert e.value.field == "node.host_memory"
    doc = {"model": {"kind": "transformer", "name": "t", "layers": 4, "hidden_size": 512,
                     "ffn_hidden_size": 2048, "num_heads": 8, "vocab_size": 1000,
                     "seq_len": 4096},
           "training": {"global_batch_size": 1, "offload": {"alpha": -0.1}},
           "parallel": {"tp": 8}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "planner.cli", "simulate", str(path),
                        "--topology", "dgx-h100"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 2 and "training.offload.alpha" in r.stderr


@pytest.mark.parametrize("name", ["planner.model.llm.offload", "planner.llm.longctx"])
def test_doctests(name):
    import doctest
    import importlib
    res = doctest.testmod(importlib.import_module(name))
    assert res.failed == 0 and res.attempted > 0


def test_allocator_layouts_against_the_mip_and_the_live_bound():
    """A hand-sized case where the online best-fit allocator fragments: the offline plan and
    the §6.4 MIP (CBC, proven optimal) reach the live-bytes bound, the online one does not."""
    from planner.model.llm.allocator import Request, layout_report
    reqs = [Request("a", 2, 0, 2), Request("b", 2, 0, 4), Request("c", 4, 2, 4),
            Request("d", 1, 1, 3), Request("e", 3, 3, 5)]
    r = layout_report(reqs)
    assert r["live_bytes"] == 9 and r["online_bytes"] > r["live_bytes"]
    assert r["mip_status"] == "optimal" and r["optimal_bytes"] == pytest.approx(9)
    assert r["planned_bytes"] >= r["optimal_bytes"] - 1e-9
    assert r["online_fragmentation"] > 0


def test_token_wise_swap_fragments_an_online_allocator():
    """Under the swap a block's offloaded tokens outlive its dropped ones by two blocks: their
    frees interleave with the next blocks' requests, which fragments a best-fit caching
    allocator (MEMO §6.2) while the offline plan packs them at the live-bytes bound."""
    from planner.model.llm.allocator import layout_report, offload_requests
    m = _spec(seq=131072, layers=16).model
    r = layout_report(offload_requests(m, layers=16, alpha=0.5, seq=131072, tp=8), mip=False)
    assert r["online_fragmentation"] > 0.05 and r["planned_fragmentation"] < 0.01


def test_the_planner_chooses_the_swap_and_exports_refuse_it(tmp_path):
    """A 7B model at 512k tokens on one DGX H100 fits with full recompute, but the swap skips
    the recompute: asked for the swap, the plan search tries every layout both ways and ranks
    the swap first; without the spec asking, it plans no swap; an export of a plan that swaps
    says which field it cannot express."""
    from planner.llm.search import search
    doc = {"model": {"kind": "transformer", "name": "memo-7b", "layers": 32,
                     "hidden_size": 4096, "ffn_hidden_size": 16384, "num_heads": 32,
                     "vocab_size": 50257, "seq_len": 524288, "ffn": "gelu"},
           "training": {"global_batch_size": 1, "offload": {"alpha": "auto"}}}
    spec = parse_llm_spec(doc, source="memo.yaml")
    topo = load_topology("dgx-h100")
    results, stats = search(spec, topo, top=4)
    assert stats["offload_candidates"] >= 1
    best = results[0]
    assert best.spec.training.offload is not None and "offload" in best.to_dict()
    assert any(r.spec.training.offload is None for r in results)
    full = min(r.step_time_s for r in results if r.spec.training.offload is None)
    assert best.step_time_s < full
    plain = parse_llm_spec({**doc, "training": {"global_batch_size": 1,
                                                "activation_recompute": "full"}},
                           source="memo.yaml")
    assert all(r.spec.training.offload is None for r in search(plain, topo, top=4)[0])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    plan = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "planner.cli", "plan", str(path), "--topology",
                        "dgx-h100", "--gpus", "8", "--out", str(plan)], capture_output=True,
                       text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "planner.cli", "export", str(plan), "--to",
                        "megatron", "--out", str(tmp_path / "meg")], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "spec.training.offload" in r.stderr
