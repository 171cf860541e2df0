"""Iteration-time fidelity against published runs (the issue's gate: MAPE ≤ 10% per set).

Compute and network come from priors and microbenchmark fits only (traces/efficiency,
topology collectives: sections); nothing here is fitted to these tables. The sets are data
(traces/published/), each row simulated through the public spec path. About three minutes.
"""

import json
from pathlib import Path

import pytest
import yaml

from planner.cli.main import main
from planner.llm.fidelity import (
    kendall_tau_by_group,
    korthikanti_rows,
    load_set,
    narayanan_rows,
    row_command,
    row_spec_document,
    run_set,
    set_info,
    vtrain_rows,
)
from planner.model.llm.trainer import PRESETS


@pytest.mark.parametrize("name,rows", [("narayanan", narayanan_rows), ("korthikanti", korthikanti_rows)])
def test_mape_within_ten_percent(name, rows):
    df = run_set(rows())
    mape = df.error.abs().mean()
    print(f"\n{name}: MAPE {mape:.1%}\n" + df[["row", "measured_s", "predicted_s", "error"]].to_string())
    assert mape <= 0.10
    assert df.error.abs().max() < 0.20          # no row far off while the mean hides it


VTRAIN = Path(__file__).resolve().parents[3] / "shared" / "data" / "vtrain" / "ground_truth_multi.csv"
# Groups whose measured ranking the model does not yet reproduce (see planner/llm/fidelity.py,
# "Known gaps"): strict, so the test flags the day a physical fix lifts them over 0.7.
VTRAIN_KNOWN_GAPS = {"18.4B", "39.1B"}


@pytest.fixture(scope="module")
def vtrain_df():
    if not VTRAIN.exists():
        pytest.skip(f"vTrain data not found at {VTRAIN}")
    return run_set(vtrain_rows(VTRAIN))


@pytest.mark.parametrize("group", [
    pytest.param(g, marks=pytest.mark.xfail(strict=True, reason="known gap: TP2/TP4 rows with "
                                                                "PP predicted too fast"))
    if g in VTRAIN_KNOWN_GAPS else g
    for g in ("3.6B", "18.4B", "39.1B", "175.0B")])
def test_vtrain_ranking_kendall_tau(vtrain_df, group):
    tau = kendall_tau_by_group(vtrain_df)[group]
    print(f"\nvTrain {group}: Kendall tau {tau:.2f}")
    assert tau >= 0.7


def test_vtrain_multi_node_mape_within_ten_percent(vtrain_df):
    mape = vtrain_df.error.abs().mean()
    print(f"\nvTrain multi-node: MAPE {mape:.1%} over {len(vtrain_df)} rows")
    assert mape <= 0.10


@pytest.mark.parametrize("name", ["narayanan", "korthikanti"])
def test_every_set_names_its_trainer_and_why(name):
    info = set_info(name)
    assert info["trainer"]["preset"] in PRESETS and len(info["trainer"]["because"]) > 40
    rows = load_set(name)
    assert {r["spec"].trainer.preset for r in rows} == {info["trainer"]["preset"]}


def test_a_row_reproduces_through_the_public_cli(tmp_path, capsys):
    """The row's spec file and command line give the fidelity harness's time exactly."""
    row = load_set("korthikanti")[1]                   # 22B, selective + sequence parallel
    expected = float(run_set([row]).predicted_s.iloc[0])
    path = tmp_path / "row.yaml"
    path.write_text(yaml.safe_dump(row_spec_document(row)))
    argv = row_command(row, str(path)).split()[1:] + ["--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(expected, rel=1e-12)
