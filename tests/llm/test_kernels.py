"""The kernels of one transformer block: FLOPs agree with the model-FLOPs formula, and a
GEMM's backward is timed as the two GEMMs it is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.compute import load_compute_profile, op_time

from planner.model.llm.kernels import Kernel, block_kernels, block_model_flops, kernels_time
from planner.model.llm.spec import ModelSpec


@pytest.mark.parametrize("ffn", ["swiglu", "gelu"])
def test_block_kernels_add_up_to_the_model_flops(ffn):
    m = ModelSpec(name="t", layers=1, hidden_size=1024, ffn_hidden_size=2816 if ffn == "swiglu"
                  else 4096, num_heads=8, num_kv_heads=8 if ffn == "gelu" else 2, vocab_size=1000,
                  seq_len=512, ffn=ffn)
    ks = block_kernels(m, b=2, tp=1, cp=1, precision="bf16")
    names = [k.name for k in ks]
    assert names.count("mlp_up") == names.count("mlp_down") == 1
    # the causal attention kernel executes half the full-score FLOPs the formula counts
    executed = sum(k.flops for k in ks) + sum(k.flops for k in ks if k.kind == "attention")
    assert 3 * executed == pytest.approx(block_model_flops(m, tokens=2 * 512), rel=1e-12)
    up, down = (next(k for k in ks if k.name == n) for n in ("mlp_up", "mlp_down"))
    assert up.flops == pytest.approx((2 if ffn == "swiglu" else 1) * down.flops, rel=1e-12)


def test_gemm_backward_is_two_gemms_of_the_forward_size():
    prof = load_compute_profile("h100-sxm")
    for flops in (1e8, 1e9, 1e10, 1e12):
        k = Kernel("g", flops, flops / 100, "bf16")
        one = op_time(prof, flops=flops, bytes_moved=flops / 100, dtype="bf16")
        assert kernels_time(prof, [k]) == pytest.approx(one, rel=1e-12)
        assert kernels_time(prof, [k], backward=True) == pytest.approx(2 * one, rel=1e-12)
    # where the curve still rises, two GEMMs take longer than one of twice the size would
    small = 1e8
    merged = op_time(prof, flops=2 * small, bytes_moved=2 * small / 100, dtype="bf16")
    assert kernels_time(prof, [Kernel("g", small, small / 100, "bf16")], backward=True) > merged
    # launches: a split GEMM (count) launches twice per backward, with the launch overhead each
    no_launch = replace(prof, launch_overhead_s=0.0)
    k4 = Kernel("e", 4e9, 4e7, "bf16", count=4)
    extra = kernels_time(prof, [k4], backward=True) - kernels_time(no_launch, [k4], backward=True)
    assert extra == pytest.approx(8 * prof.launch_overhead_s, rel=1e-9)


def test_flash_attention_and_memory_passes_stay_single_kernels():
    prof = replace(load_compute_profile("h100-sxm"), launch_overhead_s=0.0)
    att = Kernel("attention", 1e11, 1e8, "bf16", kind="attention")
    assert kernels_time(prof, [att], backward=True) == pytest.approx(
        op_time(prof, flops=2.5e11, bytes_moved=2.5e8, kind="attention_backward"), rel=1e-12)
    mem = Kernel("elementwise", 0.0, 1e8, "bf16")
    assert kernels_time(prof, [mem], backward=True) == pytest.approx(
        op_time(prof, flops=0.0, bytes_moved=2e8), rel=1e-12)
