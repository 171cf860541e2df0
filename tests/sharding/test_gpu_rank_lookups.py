"""The per-rank lookup microbenchmark times what it claims: PyTorch's sparse-gradient path
(DeepLearningExamples' PyTorch DLRM) builds one gradient row per id, uncoalesced, and its
unscale and SGD step give the dense reference's update; a quick CPU run writes its files and
bad arguments exit 2 naming the flag."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import torch

from planner.measure.tables.gpu_rank_lookups import SparseGradRank

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "traces" / "measured" / "h200" / "rank-lookups" / "cases.json"


def _dense_reference(sg: SparseGradRank, w0, g):
    ref = torch.nn.Parameter(w0.clone())
    if sg.one_hot:
        out = torch.nn.functional.embedding(sg.ids, ref)
    else:
        out = torch.nn.functional.embedding_bag(sg.ids, ref, sg.offsets, mode="sum")
    out.half().backward(g)
    return w0 - 0.01 * ref.grad * float(sg.inv_scale)


def test_sparse_path_one_row_per_id_and_the_sgd_update_is_the_dense_one():
    dev = torch.device("cpu")
    for tables in ([(40, 1), (7, 1)], [(60, 3), (9, 1)]):
        sg = SparseGradRank(tables, 8, 32, "zipf1.2", dev, seed=3)
        w0 = sg.weight.detach().clone()
        g = torch.randn(sg.bags, 8, dtype=torch.float16)
        want = _dense_reference(sg, w0, g)
        sg.forward().backward(g)
        grad = sg.weight.grad
        assert grad.is_sparse and not grad.is_coalesced()
        assert grad._nnz() == sg.ids.numel()       # a bag's gradient copied to each of its ids
        assert sg.distinct < sg.ids.numel()          # repeated ids stay separate rows
        sg.unscale()
        sg.opt.step()
        torch.testing.assert_close(sg.weight.detach(), want, rtol=1e-3, atol=1e-5)


def test_quick_run_writes_its_files_and_bad_flags_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "planner.measure.tables.gpu_rank_lookups",
                        "--cases", str(CASES), "--out", str(tmp_path), "--quick",
                        "--device", "cpu", "--samples", "2"],
                       capture_output=True, text=True, cwd=REPO, timeout=200)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "ranks.csv").open()))
    cases = json.loads(CASES.read_text())
    assert len(rows) == 2 * len(cases)               # two id distributions, sparse path on CPU
    assert all(int(x["nnz"]) == int(x["ids_total"]) for x in rows)
    assert all(float(x["step_s"]) > 0 for x in rows)
    assert len(list(csv.DictReader((tmp_path / "bottom.csv").open()))) == 6
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["ranks_rows"] == len(rows) and meta["cases"] == cases
    bad = subprocess.run([sys.executable, "-m", "planner.measure.tables.gpu_rank_lookups",
                          "--cases", str(tmp_path / "none.json"), "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "--cases" in bad.stderr and "Traceback" not in bad.stderr
    broken = tmp_path / "broken.json"
    for doc, flags, names in (
            ({"case": "x"}, [], "--cases"),
            ([{"case": "x", "rank": 0, "batch": 8, "dim": 4}], [], "broken.json [0].tables"),
            ([{"case": "x", "rank": 0, "batch": 8, "dim": 4, "tables": [[10, "a"]]}], [],
             "broken.json [0].tables"),
            (cases[:1], ["--ids", "normal"], "--ids"),
            (cases[:1], ["--paths", "dense"], "--paths"),
            (cases[:1], ["--bottom-batches", "8k"], "--bottom-batches")):
        broken.write_text(json.dumps(doc))
        bad = subprocess.run([sys.executable, "-m", "planner.measure.tables.gpu_rank_lookups",
                              "--cases", str(broken), "--out", str(tmp_path / "o"), *flags],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
        assert bad.returncode == 2 and names in bad.stderr and "fix:" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr and not (tmp_path / "o").exists()
