"""Packed variable-length documents (WLB-LLM, issue 26 item 1): the spec section, the packers'
invariants, the CP attention split against a direct count over the document mask, the
simulator's per-micro-batch passes against their closed form, the paper's packing trends, and
the CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.model.llm.doc_attention import _pieces_pairs, rank_pairs
from planner.model.llm.documents import DocumentSpec, length_sampler
from planner.model.llm.packing import delay_histogram, mean_imbalance, pack
from planner.model.llm.spec import parse_llm_spec
from planner.workloads.llm.step import build_step, resolve_parallel

REPO = Path(__file__).resolve().parents[2]


def _doc(documents=None, *, seq=8192, mbs=1, par=None):
    d = {"model": {"kind": "transformer", "name": "t", "layers": 4, "hidden_size": 512,
                   "ffn_hidden_size": 1536, "num_heads": 8, "vocab_size": 1000,
                   "seq_len": seq},
         "training": {"global_batch_size": 8, "micro_batch_size": mbs},
         "parallel": par or {"tp": 1, "cp": 2, "pp": 2, "dp": 2}}
    if documents is not None:
        d["training"]["documents"] = documents
    return d


# -- spec -----------------------------------------------------------------------------------
def test_documents_section_round_trips_and_bad_settings_name_the_field(tmp_path):
    spec = parse_llm_spec(_doc({"packing": "wlb", "queues": 2, "thresholds": [1024, 4096]}),
                          source="s.yaml")
    assert spec.training.documents.thresholds == (1024, 4096)
    bad = [({"packing": "lpt"}, "training.documents.packing"),
           ({"queues": -1}, "training.documents.queues"),
           ({"thresholds": [4096, 1024]}, "training.documents.thresholds"),
           ({"queues": 1, "thresholds": [1, 2]}, "training.documents.thresholds"),
           ({"max_tokens": 100}, "training.documents.max_tokens"),
           ({"lengths": "zipf"}, "training.documents.lengths"),
           ({"cp_sharding": "ring"}, "training.documents.cp_sharding")]
    for documents, field in bad:
        with pytest.raises(SpecError) as e:
            parse_llm_spec(_doc(documents), source="s.yaml")
        assert e.value.field == field, documents
    with pytest.raises(SpecError) as e:
        parse_llm_spec(_doc({}, mbs=2), source="s.yaml")
    assert e.value.field == "training.micro_batch_size"
    hist = tmp_path / "lengths.csv"
    hist.write_text("doc_len,count\n100,5\n9000,1\n")
    with pytest.raises(SpecError) as e:        # a document longer than the sequence
        parse_llm_spec(_doc({"lengths": str(hist)}), source="s.yaml")
    assert e.value.field == "training.documents.lengths" and "9000" in e.value.message


def test_histogram_file_is_sampled_in_proportion(tmp_path):
    hist = tmp_path / "lengths.csv"
    hist.write_text("doc_len,count\n100,3\n1000,1\n")
    spec = parse_llm_spec(_doc({"lengths": str(hist)}), source="s.yaml").training.documents
    draws = length_sampler(spec).draw(20000)
    assert set(np.unique(draws)) == {100, 1000}
    assert np.mean(draws == 100) == pytest.approx(0.75, abs=0.02)


# -- packing --------------------------------------------------------------------------------
@pytest.mark.parametrize("packing,kw", [("original", {}), ("fixed", {"window": 2}),
                                        ("wlb", {"queues": 2}),
                                        ("wlb", {"queues": 1, "max_tokens": 40000})])
def test_packers_respect_capacity_and_keep_every_token(packing, kw):
    seq, n, batches = 32768, 4, 24
    spec = DocumentSpec(packing=packing, seed=5, **kw)
    gbs = pack(spec, length_sampler(spec), seq=seq, n=n, batches=batches)
    cap = spec.max_tokens or seq
    assert len(gbs) == batches and all(len(gb.microbatches) == n for gb in gbs)
    for gb in gbs:
        for mb in gb.microbatches:
            assert sum(mb) <= cap and all(1 <= d <= seq for d in mb)
            if packing == "original":
                assert sum(mb) == seq
    # every packed token is in the delay record exactly once, and nearly n·seq per batch
    for gb in gbs:
        assert sum(t for t, _ in gb.delays) == sum(gb.tokens())
    # whole documents leave room unused, and delayed ones are trained later: the batches hold
    # at most what the loader read (n·seq a batch), and not much less
    assert 0.85 * n * seq <= np.mean([sum(gb.tokens()) for gb in gbs]) <= n * seq
    # the original packer moves nothing in time; the others a token by under 2 iterations
    # on average, none by more than the run
    delays = delay_histogram(gbs)
    if packing == "original":
        assert delays == {0: 1.0}
    else:
        assert sum(abs(k) * v for k, v in delays.items()) < 2 and max(map(abs, delays)) < batches


def test_packing_trends_of_wlb_llm_table2():
    """7B-128K, 4 micro-batches of 131,072 tokens (WLB-LLM Table 2). The paper's data are not
    ours, so the levels differ (README); what must hold are its trends: fixed-length repacking
    balances better over wider windows, outlier queues balance better than none, 2 queues reach
    what 3 do within 0.1, and the average token waits about half an iteration (paper: 0.5)."""
    def imb(**kw):
        spec = DocumentSpec(seed=0, **kw)
        gbs = pack(spec, length_sampler(spec), seq=131072, n=4, batches=96)
        return mean_imbalance(gbs), gbs
    original = imb(packing="original")[0]
    fixed = [imb(packing="fixed", window=k)[0] for k in (1, 2, 4, 8)]
    wlb = [imb(packing="wlb", queues=q) for q in (0, 1, 2, 3)]
    assert original > fixed[0] > fixed[1] > fixed[2] > fixed[3]
    assert wlb[0][0] > wlb[1][0] > wlb[2][0] >= wlb[3][0] - 0.02
    assert wlb[2][0] - wlb[3][0] < 0.1 and wlb[2][0] < 0.65 * original
    delay = sum(k * v for k, v in delay_histogram(wlb[2][1]).items())
    assert 0.25 < delay < 1.0


# -- CP attention split ----------------------------------------------------------------------
def _direct_pairs(docs: list[int], cp: int, sharding: str) -> np.ndarray:
    """Query-key pairs per rank by walking every query of the document mask."""
    out = np.zeros(cp)
    owner = [j if j < cp else 2 * cp - 1 - j for j in range(2 * cp)]
    start = 0
    total = sum(docs)
    for d in docs:
        for p in range(d):
            if sharding == "sequence":
                chunk = int((start + p) // (total / (2 * cp)))
            else:
                chunk = int(p // (d / (2 * cp)))
            out[owner[chunk]] += p + 1             # keys of its document up to itself
        start += d
    return out


@pytest.mark.parametrize("sharding", ["sequence", "document"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_rank_pairs_match_a_direct_count_over_the_mask(sharding, cp):
    rng = np.random.default_rng(cp)
    for _ in range(5):
        docs = [int(x) for x in rng.integers(1, 40, size=rng.integers(1, 6)) * 2 * cp * 4]
        useful, padded = rank_pairs(docs, cp=cp, sharding=sharding)
        np.testing.assert_allclose(useful, _direct_pairs(docs, cp, sharding), rtol=1e-9)
        assert np.all(padded >= useful - 1e-6)
    if sharding == "document":                     # equal work on every rank
        useful, _ = rank_pairs([4096, 512, 8192], cp=cp, sharding="document")
        np.testing.assert_allclose(useful, useful.mean(), rtol=1e-9)


def test_tile_padding_reproduces_the_measured_short_chunk_slowdown():
    """A query chunk against 16× as many keys (measured, not fitted: doc-attention/chunks.csv
    on H100 and H200): its rate relative to long chunks follows the useful/padded pairs of
    128-query tiles within 25%, from 16 to 4,096 queries."""
    for gpu in ("h100-sxm", "h200"):
        with (REPO / "traces/measured" / gpu / "doc-attention/chunks.csv").open() as fh:
            rows = [r for r in csv.DictReader(fh) if r["mask"] == "full"]
        top = np.median([float(r["forward_tflops"]) for r in rows if int(r["q_len"]) >= 1024])
        for r in rows:
            q, kv = int(r["q_len"]), int(r["kv_len"])
            if kv != 16 * q:
                continue
            useful, padded = _pieces_pairs(np.array([float(q)]), np.array([kv - float(q)]))
            predicted = top * useful[0] / padded[0]
            measured = float(r["forward_tflops"]) * useful[0] / (q * kv)
            assert predicted == pytest.approx(measured, rel=0.25), (gpu, q, kv)


# -- simulator --------------------------------------------------------------------------------
def test_micro_batch_passes_follow_their_tokens_and_attention():
    spec = parse_llm_spec(_doc(par={"tp": 1, "cp": 1, "pp": 2, "dp": 1}), source="s.yaml")
    topo = load_topology("dgx-h100", gpus=8)
    p = resolve_parallel(spec, replace(spec.parallel, dp=4), topo.num_gpus)
    base = build_step(spec, p, topo)
    same = build_step(spec, p, topo, mb_scales=[(1.0, 1.0)] * base.microbatches)
    assert simulate(topo, same.workload).step_time_s == pytest.approx(
        simulate(topo, base.workload).step_time_s, rel=1e-12)
    scales = [(0.5, 0.1), (1.0, 2.0)]
    plan = build_step(spec, p, topo, mb_scales=scales)
    a_f, a_b = plan.info["layer_attention_s"][0]
    n = plan.info["chunk_layers"][0][0]
    f0 = base.fwd_s[0][0]
    for mb, (lin, att) in enumerate(scales):
        op = next(o for o in plan.workload.ops if o.name == f"F mb{mb} c0"
                  and o.ranks[0] == plan.representatives[0])
        assert op.duration_s == pytest.approx((f0 - n * a_f) * lin + n * a_f * att, rel=1e-12)


def test_cli_simulates_packed_documents_deterministically(tmp_path):
    doc = _doc({"packing": "wlb", "cp_sharding": "adaptive", "batches": 4},
               par={"tp": 2, "cp": 2, "pp": 2, "dp": 1})
    doc["training"]["global_batch_size"] = 4
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    cmd = [sys.executable, "-m", "planner.cli", "simulate", str(path), "--topology",
           "dgx-h100", "--json", "--trace", str(tmp_path / "t.json")]
    runs = [subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    d = json.loads(runs[0].stdout)["documents"]
    assert d["batches"] == 4 and d["step_time_min_s"] <= d["step_time_mean_s"] \
        <= d["step_time_max_s"]
    assert sum(d["cp_sharding"].values()) == 4 * 4
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("name", "").startswith("F mb") for e in trace["traceEvents"])
    doc["training"]["documents"]["thresholds"] = [10, 5]
    path.write_text(json.dumps(doc))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "training.documents.thresholds" in r.stderr


@pytest.mark.parametrize("name", ["planner.model.llm.packing", "planner.model.llm.doc_attention"])
def test_doctests(name):
    import doctest
    import importlib
    res = doctest.testmod(importlib.import_module(name))
    assert res.failed == 0 and res.attempted > 0
