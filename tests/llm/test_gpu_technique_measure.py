"""The GPU microbenchmarks behind the long-context and compression techniques (PCIe offload,
packed-document attention, embedding quantizers): their codecs keep the error bounds they claim,
quick CPU runs write the files they document, bad flags exit 2, and the committed GPU data lies
inside the hardware's physical limits."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planner.measure.tables import gpu_quant

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "traces" / "measured"


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def _rows(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_quantizers_keep_their_error_bounds():
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1)) * 0.05
    codecs = gpu_quant._codecs()
    _, dec = codecs["uniform_eb"]
    assert float((dec(codecs["uniform_eb"][0](x)) - x).abs().max()) <= gpu_quant.EB * 1.0001
    enc, dec = codecs["int8_rowwise"]
    q, scale, lo = enc(x)
    assert q.dtype == torch.uint8
    assert bool(((dec((q, scale, lo)) - x).abs() <= scale / 2 * 1.0001).all())
    for name in ("fp16", "bf16"):
        enc, dec = codecs[name]
        normal = x.abs() >= 2**-14                  # fp16's smallest normal number
        rel = float(((dec(enc(x)) - x).abs() / x.abs())[normal].max())
        assert rel <= (2**-11 if name == "fp16" else 2**-8) * 1.0001


def test_quick_cpu_runs_write_the_documented_files(tmp_path):
    r = _run("planner.measure.tables.gpu_quant", "--out", str(tmp_path / "q"), "--quick",
             "--device", "cpu", "--samples", "3")
    assert r.returncode == 0, r.stderr
    rows = _rows(tmp_path / "q" / "quant.csv")
    assert [row["codec"] for row in rows] == list(gpu_quant.CODECS)
    assert all(int(row["bytes_out"]) < int(row["bytes_in"]) for row in rows)

    r = _run("planner.measure.compute.gpu_doc_attention", "--out", str(tmp_path / "a"),
             "--quick", "--device", "cpu", "--samples", "3")
    assert r.returncode == 0, r.stderr
    docs = _rows(tmp_path / "a" / "docs.csv")
    for row in docs:                    # FLOPs as the LLM model counts a causal document
        d, b, h = int(row["doc_len"]), int(row["docs"]), int(row["heads"]) * 128
        assert float(row["flops"]) == pytest.approx(2.0 * b * d * d * h, rel=1e-5)
    chunks = _rows(tmp_path / "a" / "chunks.csv")
    assert {row["mask"] for row in chunks} == {"causal", "full"}

    r = _run("planner.measure.compute.gpu_offload", "--out", str(tmp_path / "o"), "--quick",
             "--device", "cpu")
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["host_memory_bytes"] > 0 and "no CUDA" in meta["note"]


@pytest.mark.parametrize("module", ["planner.measure.compute.gpu_offload",
                                    "planner.measure.compute.gpu_doc_attention",
                                    "planner.measure.tables.gpu_quant"])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, module):
    r = _run(module, "--out", str(tmp_path), "--budget-s", "-1")
    assert r.returncode == 2 and "--budget-s" in r.stderr
    (tmp_path / "file").write_text("")
    r = _run(module, "--out", str(tmp_path / "file" / "sub"))
    assert r.returncode == 2 and "--out" in r.stderr


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_measured_pcie_copies_stay_under_pcie5_x16(gpu):
    """Both machines report a PCIe 5.0 x16 link (pcie-link.txt): 32 GT/s × 16 lanes × 128/130
    = 63.0 GB/s per direction before packet overhead. Pinned copies of ≥ 64 MiB must reach a
    large share of it and never exceed it; pageable copies, staged through a bounce buffer,
    must be slower than pinned."""
    rows = _rows(MEASURED / gpu / "offload" / "pcie.csv")
    link = 32e9 * 16 * 128 / 130 / 8 / 1e9
    assert "5, 16" in (MEASURED / gpu / "offload" / "pcie-link.txt").read_text()
    big = [r for r in rows if int(r["bytes"]) >= 2**26 and r["direction"] != "both"]
    for r in big:
        g = float(r["gbps"])
        assert g < link
        if r["host"] == "pinned":
            assert g > 0.75 * link
    pinned = {(r["direction"], r["bytes"]): float(r["gbps"]) for r in big if r["host"] == "pinned"}
    for r in big:
        if r["host"] == "pageable":
            assert float(r["gbps"]) < pinned[(r["direction"], r["bytes"])]
