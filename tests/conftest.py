"""Shared fixtures: small topologies built from mappings, and the vTrain data location."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Host calibrations the tests measure go to a temporary folder, not the user's cache."""
    import os
    old = os.environ.get("CLUSTERPLAN_CACHE")
    os.environ["CLUSTERPLAN_CACHE"] = str(tmp_path_factory.mktemp("clusterplan-cache"))
    yield
    if old is None:
        os.environ.pop("CLUSTERPLAN_CACHE", None)
    else:
        os.environ["CLUSTERPLAN_CACHE"] = old


@pytest.fixture
def star8():
    """Eight GPUs on one switch: 100 GB/s per direction, 1 µs per hop, alpha 2 µs, no overheads."""
    from simulator.topology import build_topology
    devices = [{"id": f"g{i}", "kind": "gpu"} for i in range(8)] + [{"id": "sw", "kind": "switch"}]
    links = [{"a": f"g{i}", "b": "sw", "bandwidth": 100e9, "latency": 1e-6, "kind": "nvlink"}
             for i in range(8)]
    return build_topology({"name": "star8", "gpu": "a100-80gb", "devices": devices, "links": links,
                           "collectives": {"alpha": {"default": 2e-6}}}, source="star8")


@pytest.fixture
def vtrain_table():
    """Path of the vTrain NCCL all-reduce table for n A100 GPUs (skips if shared/ is absent)."""
    def path(n: int) -> Path:
        p = SHARED / "data" / "vtrain" / f"a100_allreduce_{n}gpu_lut.txt"
        if not p.exists():
            pytest.skip("shared/data/vtrain not present beside the repository")
        return p
    return path
