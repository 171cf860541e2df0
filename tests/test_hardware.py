"""The GPU catalog: every entry loads, every number has a source, lookups fail helpfully."""

from __future__ import annotations

import pytest

from simulator.errors import SpecError
from simulator.hardware import DTYPES, GPUSpec, gpu_names, gpu_spec, gpu_spec_from_dict

EXPECTED = ["a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "cpu"]


def test_catalog_has_the_expected_kinds():
    assert gpu_names() == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_every_entry_loads_with_a_source_for_every_number(name):
    spec = gpu_spec(name)
    assert isinstance(spec, GPUSpec) and spec.name == name and spec.vendor_name
    assert spec.peak_flops and set(spec.peak_flops) <= set(DTYPES)
    assert all(v > 0 for v in spec.peak_flops.values())
    assert spec.hbm_bytes > 0 and spec.hbm_bandwidth_Bps > 0 and spec.nvlink_bandwidth_Bps >= 0
    for dtype in spec.peak_flops:
        assert spec.source_of(f"peak_flops.{dtype}"), (name, dtype)
    for field in ("hbm_bytes", "hbm_bandwidth", "nvlink_bandwidth"):
        assert spec.source_of(field), (name, field)
    if spec.tdp_watts is not None:
        assert spec.source_of("tdp_watts")


def test_published_values_and_ratios():
    a100, h100, h200 = gpu_spec("a100-80gb"), gpu_spec("h100-sxm"), gpu_spec("h200")
    assert h100.peak("bf16") / a100.peak("bf16") == pytest.approx(3.17, abs=0.01)
    assert h100.peak("bf16") == 989.4e12 and h100.peak("fp8") == 1978.9e12
    assert a100.peak("tf32") == 156e12 and a100.hbm_bandwidth_Bps == 2039e9
    assert gpu_spec("a100-40gb").hbm_bandwidth_Bps == 1555e9
    assert h200.hbm_bytes > h100.hbm_bytes and h200.hbm_bandwidth_Bps > h100.hbm_bandwidth_Bps
    assert h200.peak("bf16") == h100.peak("bf16")
    assert h100.nvlink_bandwidth_Bps == 450e9 and a100.nvlink_bandwidth_Bps == 300e9
    b200 = gpu_spec("b200")
    assert b200.peak("bf16") == 2.25e15 and b200.hbm_bytes == 183359 * 1024**2
    assert b200.nvlink_bandwidth_Bps == 900e9 and b200.tdp_watts == 1000
    assert gpu_spec("cpu").nvlink_bandwidth_Bps == 0
    assert gpu_spec("cpu").hbm_bytes == 24 * 1024**3


def test_cpu_entry_is_measured():
    cpu = gpu_spec("cpu")
    assert "measured" in cpu.source_of("peak_flops.fp32").lower()
    assert "2026-11-22" in cpu.source_of("peak_flops.fp32")
    assert "measured" in cpu.source_of("hbm_bandwidth").lower()


def test_unknown_gpu_names_the_kind_and_the_known_ones():
    with pytest.raises(SpecError) as info:
        gpu_spec("h300", source="topo.yaml", field="gpu")
    text = str(info.value)
    assert "'h300'" in text and "topo.yaml" in text
    assert all(name in text for name in EXPECTED)
    assert "gpus.yaml" in info.value.fix


def test_unknown_dtype_names_it_and_the_available_ones():
    with pytest.raises(SpecError) as info:
        gpu_spec("a100-80gb").peak("fp8")
    assert "'fp8'" in str(info.value) and "bf16" in str(info.value)


def test_custom_gpu_from_a_topology_mapping():
    spec = gpu_spec_from_dict("my-gpu", {"name": "my-gpu", "peak_flops": {"bf16": "500 TFLOP/s"},
                                         "hbm_bytes": "96 GB", "hbm_bandwidth": "4 TB/s"},
                              source="topo.yaml")
    assert spec.peak("bf16") == 500e12 and spec.hbm_bytes == 96e9
    assert spec.hbm_bandwidth_Bps == 4e12 and spec.nvlink_bandwidth_Bps == 0
    assert spec.tdp_watts is None


@pytest.mark.parametrize("bad, field", [
    ({"peak_flops": {"bf16": "fast"}, "hbm_bytes": 1, "hbm_bandwidth": 1}, "gpu.peak_flops.bf16"),
    ({"peak_flops": {"fp4": 1e15}, "hbm_bytes": 1, "hbm_bandwidth": 1}, "gpu.peak_flops.fp4"),
    ({"peak_flops": {"bf16": 1e15}, "hbm_bytes": -5, "hbm_bandwidth": 1}, "gpu.hbm_bytes"),
    ({"peak_flops": {"bf16": 1e15}, "hbm_bytes": 1}, "gpu.hbm_bandwidth"),
    ({"peak_flops": {"bf16": 1e15}, "hbm_bytes": 1, "hbm_bandwidth": 1, "tdp": 5}, "gpu.tdp"),
    ({"peak_flops": {"bf16": 1e15}, "hbm_bytes": 1, "hbm_bandwidth": 1, "tdp_watts": 0},
     "gpu.tdp_watts"),
])
def test_bad_custom_gpu_fields_are_located(bad, field):
    with pytest.raises(SpecError) as info:
        gpu_spec_from_dict("x", bad, source="topo.yaml")
    assert info.value.source == "topo.yaml" and info.value.field == field


def test_catalog_entries_require_sources():
    entry = {"peak_flops": {"bf16": 1e15}, "hbm_bytes": 1, "hbm_bandwidth": 1,
             "sources": {"peak_flops": "datasheet", "hbm_bytes": "datasheet"}}
    with pytest.raises(SpecError, match="hbm_bandwidth"):
        gpu_spec_from_dict("x", entry, source="gpus.yaml", field="x", require_sources=True)
