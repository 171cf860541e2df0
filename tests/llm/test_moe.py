"""Mixture of experts: parameter counts, expert parallelism (memory, all-to-all), search, export."""

import json
from dataclasses import replace

import pytest

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.cli.main import main
from planner.llm.metrics import simulate_llm
from planner.model.llm.kernels import block_kernels, block_model_flops
from planner.model.llm.memory import memory_per_gpu
from planner.model.llm.spec import ParallelSpec, load_llm_spec, parse_llm_spec
from planner.workloads.llm.step import resolve_parallel


@pytest.fixture(scope="module")
def mixtral():
    return load_llm_spec("mixtral-8x7b")


def test_mixtral_parameter_counts_match_the_paper(mixtral):
    m = mixtral.model
    # Jiang et al. 2024: 46.7B parameters, 12.9B active per token (embeddings included)
    assert m.total_params / 1e9 == pytest.approx(46.7, abs=0.1)
    active = m.active_non_embedding_params + 2 * m.embedding_params
    assert active / 1e9 == pytest.approx(12.9, abs=0.1)


def test_dense_model_is_unchanged_by_the_moe_fields():
    llama = load_llm_spec("llama3-8b").model
    assert not llama.is_moe
    assert llama.params_per_layer == llama.active_params_per_layer == llama.layer_params_per_rank(4)


def test_expert_flops_scale_with_top_k_not_with_experts(mixtral):
    m = mixtral.model
    top1 = replace(m, top_k=1)
    more = replace(m, num_experts=16)
    f2 = block_model_flops(m, tokens=4096)
    f1 = block_model_flops(top1, tokens=4096)
    mlp_one = 3 * 3 * 2 * 4096 * m.hidden_size * m.ffn_hidden_size      # fwd+bwd, 3 matrices
    assert f2 - f1 == pytest.approx(mlp_one, rel=1e-12)
    # 16 experts only add router FLOPs (h·E per token), not expert FLOPs
    router_extra = 3 * 2 * 4096 * m.hidden_size * 8
    assert block_model_flops(more, tokens=4096) - f2 == pytest.approx(router_extra, rel=1e-12)


def test_local_experts_become_separate_smaller_gemms(mixtral):
    m = mixtral.model
    k1 = {k.name: k for k in block_kernels(m, b=1, tp=1, cp=1, precision="bf16", ep=1)}
    k8 = {k.name: k for k in block_kernels(m, b=1, tp=1, cp=1, precision="bf16", ep=8)}
    for name in ("experts_up", "experts_down"):
        assert (k1[name].count, k8[name].count) == (8, 1)
        assert k1[name].flops == k8[name].flops                # same routed work per rank
        assert k8[name].bytes < k1[name].bytes                  # but 1/8 of the weights read
    # SwiGLU: the fused gate+up GEMM has twice the down projection's FLOPs
    assert k1["experts_up"].flops == pytest.approx(2 * k1["experts_down"].flops, rel=1e-12)


def test_expert_parallelism_divides_expert_memory(mixtral):
    t = mixtral.training
    mems = {ep: memory_per_gpu(mixtral.model, t, ParallelSpec(tp=1, pp=4, dp=64, ep=ep),
                               capacity_bytes=80e9) for ep in (1, 8)}
    m = mixtral.model
    expert_share = (m.params_per_layer - m.dense_params_per_layer) * 8 / 1   # 8 layers per stage
    # weights (bf16) + fp32 grads + 12 B optimizer = 18 B per parameter, 7/8 of experts gone
    saved = mems[1].total_bytes - mems[8].total_bytes
    assert saved == pytest.approx(expert_share * 18 * 7 / 8, rel=0.02)


def test_ep_all_to_all_is_timed_and_crossing_nodes_costs_more(mixtral):
    topo = load_topology("h100-ib:nodes=32")
    res = {}
    for tp in (1, 2):       # ep=8 inside a node (tp=1) or spread over two nodes (tp=2)
        par = ParallelSpec(tp=tp, pp=4, dp=256 // (4 * tp), ep=8)
        res[tp] = simulate_llm(mixtral, par, topo).to_dict()["breakdown"]
    none = simulate_llm(mixtral, ParallelSpec(tp=1, pp=4, dp=64, ep=1), topo)
    assert none.to_dict()["breakdown"]["ep_comm_s"] == 0.0
    assert res[1]["ep_comm_s"] > 0
    # the same bytes per rank (tokens/tp × tp ranks) cross InfiniBand instead of NVLink
    assert res[2]["ep_comm_s"] > 2 * res[1]["ep_comm_s"]


def test_ep_errors_name_the_field(mixtral):
    with pytest.raises(SpecError, match="ep 3 must divide num_experts 8"):
        resolve_parallel(mixtral, ParallelSpec(tp=1, pp=1, dp=0, ep=3), 64)
    with pytest.raises(SpecError, match="mixture-of-experts"):
        resolve_parallel(load_llm_spec("llama3-8b"), ParallelSpec(ep=2), 8)
    bad = {"model": {"name": "x", "layers": 2, "hidden_size": 64, "ffn_hidden_size": 128,
                     "num_heads": 4, "vocab_size": 100, "seq_len": 32, "num_experts": 4,
                     "top_k": 5},
           "training": {"global_batch_size": 8}}
    with pytest.raises(SpecError) as e:
        parse_llm_spec(bad, source="moe.yaml")
    assert e.value.field == "model.top_k"


def test_cli_plan_searches_ep_and_exports_it(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "mixtral-8x7b", "--topology", "h100-ib", "--gpus", "64", "--top", "2",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["num_experts"] == 8 and doc["parallel"]["ep"] in (1, 2, 4, 8)
    assert main(["export", str(out), "--to", "megatron"]) == 0
    text = capsys.readouterr().out
    assert "--num-experts 8" in text and "--moe-router-topk 2" in text
    assert f"--expert-model-parallel-size {doc['parallel']['ep']}" in text
