"""Every what-if notebook runs top to bottom (small sizes) and writes its figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_at_least_five_studies():
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_writes_figures(path, tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTERPLAN_PROGRESS", raising=False)
    figures = tmp_path / "figures"
    monkeypatch.setenv("CLUSTERPLAN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("CLUSTERPLAN_FIGURES", str(figures))
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # the sweep names each point as it starts, also in a notebook (no terminal: issue 24)
    stderr = "".join(o.get("text", "") for o in nb.cells[2].get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")
    assert re.search(r": 1/\d+ .+ after \d+\.\d s", stderr), stderr
    pngs = list(figures.glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs), pngs
