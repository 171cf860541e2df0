"""Planners honour --sharding-types: a plan only uses allowed types, and a planner that cannot
says so (exit 2, naming the field and the fix) instead of writing an invalid plan or a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TABLES = """name: allowed-types
batch_size: 256
optimizer: sgd
tables:
  - {name: a, num_embeddings: 4000, embedding_dim: 32, pooling_factor: 4}
  - {name: b, num_embeddings: 2000, embedding_dim: 16, pooling_factor: 2}
  - {name: c, num_embeddings: 8000, embedding_dim: 64, pooling_factor: 8}
"""


def _plan(tmp_path, *args):
    spec = tmp_path / "tables.yaml"
    spec.write_text(TABLES)
    out = tmp_path / "plan.json"
    p = subprocess.run([sys.executable, "-m", "planner.cli.main", "plan", str(spec), "--devices", "2",
                        "--out", str(out), *args], capture_output=True, text=True, timeout=120)
    return p, out


@pytest.mark.parametrize("types,expect", [("row_wise", "row_wise"),
                                          ("column_wise", "column_wise")])
def test_mip_uses_only_allowed_types(tmp_path, types, expect):
    p, out = _plan(tmp_path, "--planner", "mip", "--time-limit", "10", "--sharding-types", types)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["valid"] and set(doc["sharding_type_counts"]) == {expect}


def test_greedy_refuses_types_it_cannot_place(tmp_path):
    p, out = _plan(tmp_path, "--planner", "greedy", "--sharding-types", "row_wise")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--sharding-types" in p.stderr and "local_search or mip" in p.stderr
    assert not out.exists()


def test_mip_without_any_usable_type_is_an_input_error(tmp_path):
    p, out = _plan(tmp_path, "--planner", "mip", "--sharding-types", "table_row_wise")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "more than one host" in p.stderr and not out.exists()
