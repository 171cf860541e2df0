"""clusterplan sweep: a grid of runs in a process pool or on Ray, one table, resumable."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from simulator.errors import SpecError

from planner.cli.main import main
from planner.sweep import parse_sweep, points, run_point, run_sweep

#: 4 sizes × 6 group sizes × 3 algorithms × 3 clusters = 216 simulations
BIG = {
    "command": ["collective", "allreduce"],
    "grid": {"--size": ["256KiB", "4MiB", "64MiB", "1GiB"],
             "--ranks": [2, 4, 8, 16, 32, 64],
             "--algo": ["ring", "tree", "auto"],
             "--topology": ["h100-ib:nodes=8", "dgx-a100:nodes=8", "selene-a100:nodes=8"]},
    "keep": ["time_s", "busbw_Bps", "algorithm", "channels"],
}


def test_points_are_the_cartesian_product_with_zip_in_file_order():
    spec = parse_sweep({"command": "collective allreduce", "args": {"--topology": "dgx-a100"},
                        "grid": {"--size": ["1MiB", "1GiB"]},
                        "zip": {"--ranks": [2, 8], "--algo": ["ring", "tree"]}}, source="t")
    pts = points(spec)
    assert [p.params for p in pts] == [
        {"size": "1MiB", "ranks": 2, "algo": "ring"}, {"size": "1MiB", "ranks": 8, "algo": "tree"},
        {"size": "1GiB", "ranks": 2, "algo": "ring"}, {"size": "1GiB", "ranks": 8, "algo": "tree"}]
    assert pts[1].argv == ("collective", "allreduce", "--topology", "dgx-a100", "--size", "1MiB",
                           "--ranks", "8", "--algo", "tree", "--json")
    assert len({p.key for p in pts}) == 4


def test_a_failing_point_is_a_row_not_a_crash():
    bad = run_point(("collective", "allreduce", "--size", "1GiB", "--ranks", "9999",
                     "--topology", "dgx-a100", "--json"), main)
    assert not bad["ok"] and "--ranks" in bad["error"] and bad["exit_code"] == 2
    bad = run_point(("collective", "allreduce", "--size", "1GiB", "--algo", "ring",
                     "--no-such-option", "--topology", "dgx-a100", "--json"), main)
    assert not bad["ok"] and bad["exit_code"] == 2


def test_pool_and_ray_give_the_same_table_for_216_simulations():
    pytest.importorskip("ray")
    spec = parse_sweep(BIG, source="big")
    pool, s1 = run_sweep(spec, command=main, workers=2)
    ray_t, s2 = run_sweep(spec, command=main, workers=2, ray_address="local")
    assert s1["points"] == s2["points"] == 216 and s1["run"] == s2["run"] == 216
    assert pool.ok.all(), pool[~pool.ok].head()
    pd.testing.assert_frame_equal(pool, ray_t)
    # the table is the simulations' results: bus bandwidth grows with the message size
    ring = pool[(pool.algo == "ring") & (pool.ranks == 64)]
    for _, g in ring.groupby("topology"):
        assert g.busbw_Bps.is_monotonic_increasing


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    spec = parse_sweep({"command": ["collective", "allreduce"],
                        "args": {"--topology": "dgx-a100:nodes=2"},
                        "grid": {"--size": ["1MiB", "16MiB", "256MiB"], "--ranks": [4, 8, 16]},
                        "keep": ["time_s"]}, source="t")
    full, _ = run_sweep(spec, command=main, workers=1)
    ckpt = tmp_path / "out.csv.partial.jsonl"
    pts = points(spec)
    with ckpt.open("w") as fh:           # the first 4 points finished, then a half-written line
        for p in pts[:4]:
            fh.write(json.dumps({"key": p.key, "outcome": run_point(p.argv, main)}) + "\n")
        fh.write('{"key": "' + pts[4].key + '", "outc')
    again, stats = run_sweep(spec, command=main, workers=1, checkpoint=ckpt)
    assert stats == {"points": 9, "run": 5, "resumed": 4, "failed": 0, "timed_out": 0}
    pd.testing.assert_frame_equal(full, again)


def test_cli_writes_table_and_plot_and_resumes(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("command: [collective, alltoall]\n"
                    "args: {--topology: 'h100-ib:nodes=4'}\n"
                    "grid: {--size: [1MiB, 64MiB], --ranks: [8, 32]}\n"
                    "keep: [time_s]\n"
                    "plot: {x: ranks, y: time_s, hue: size, logy: true}\n")
    out, fig = tmp_path / "r.csv", tmp_path / "r.png"
    assert main(["sweep", str(grid), "--out", str(out), "--plot", str(fig), "--workers", "1"]) == 0
    t = pd.read_csv(out)
    assert len(t) == 4 and t.ok.all() and (t.time_s > 0).all()
    assert fig.stat().st_size > 1000 and fig.read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "r.csv.partial.jsonl").exists()


@pytest.mark.parametrize("doc, field", [
    ({"command": ["collective"], "grid": {}}, "grid"),
    ({"command": ["collective"], "grid": {"size": [1]}}, "grid.size"),
    ({"command": ["collective"], "grid": {"--size": "1GiB"}}, "grid.--size"),
    ({"command": ["collective"], "grid": {"--size": [{"a": 1}]}}, "grid.--size"),
    ({"command": ["collective"], "grid": {"--a": [1]}, "zip": {"--b": [1], "--c": [1, 2]}}, "zip"),
    ({"command": ["sweep"], "grid": {"--a": [1]}}, "command"),
    ({"command": ["collective"], "grid": {"--a": list(range(400)), "--b": list(range(400))}},
     "grid"),
    ({"command": ["collective"], "grid": {"--a": [1]}, "colour": 1}, "colour"),
])
def test_bad_grids_name_the_field(doc, field):
    with pytest.raises(SpecError) as info:
        parse_sweep(doc, source="g.yaml")
    assert info.value.field == field and info.value.source == "g.yaml"


def test_bad_grid_file_exits_2(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text("command: [collective, allreduce]\ngrid: {--size: 1GiB}\n")
    assert main(["sweep", str(grid), "--out", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert "g.yaml" in err and "grid.--size" in err and not (tmp_path / "r.csv").exists()


def _crashy(argv):
    """`main`, except that one point's command raises (a bug in a code path the grid reaches)."""
    if "4MiB" in argv:
        raise RuntimeError("boom")
    return main(argv)


#: three points; the commands above misbehave on the middle one
THREE = {"command": "collective allreduce", "args": {"--topology": "dgx-a100"},
         "grid": {"--size": ["1MiB", "4MiB", "16MiB"]}}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crashing_point_is_a_failed_row_and_is_retried(tmp_path, workers):
    spec = parse_sweep(THREE, source="t")
    ckpt = tmp_path / "ckpt.jsonl"
    table, stats = run_sweep(spec, command=_crashy, workers=workers, checkpoint=ckpt)
    assert stats["points"] == 3 and stats["failed"] == 1
    row = table[~table.ok].iloc[0]
    assert row["size"] == "4MiB" and "crashed: RuntimeError: boom" in row["error"]
    assert len(ckpt.read_text().splitlines()) == 2        # the crash is not checkpointed
    table, stats = run_sweep(spec, command=main, workers=workers, checkpoint=ckpt)
    assert stats["run"] == 1 and table.ok.all()


def _slow(argv):
    """`main`, except that one point hangs (a search that never converges)."""
    if "4MiB" in argv:
        time.sleep(30)
    return main(argv)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_point_past_its_timeout_is_stopped_and_recorded(tmp_path, workers):
    spec = parse_sweep(THREE, source="t")
    ckpt = tmp_path / "ckpt.jsonl"
    t0 = time.monotonic()
    table, stats = run_sweep(spec, command=_slow, workers=workers, checkpoint=ckpt,
                             timeout_s=1.0)
    assert time.monotonic() - t0 < 20                        # not the 30 s of the hung point
    assert stats["failed"] == 1 and stats["timed_out"] == 1
    row = table[~table.ok].iloc[0]
    assert row["size"] == "4MiB" and "timed out after 1 s" in row["error"]
    assert table.ok.sum() == 2 and len(ckpt.read_text().splitlines()) == 2


def test_cli_exit_code_says_a_point_failed_and_a_bad_plot_writes_nothing(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    head = "command: [collective, allreduce]\nargs: {--topology: dgx-a100, --size: 1MiB}\n"
    grid.write_text(head + "grid: {--ranks: [2, 4096]}\nkeep: [time_s]\n")
    out = tmp_path / "r.csv"
    assert main(["sweep", str(grid), "--out", str(out), "--workers", "1"]) == 1
    t = pd.read_csv(out)
    assert t.ok.tolist() == [True, False] and "1 failed" in capsys.readouterr().out
    # a plot column the table lacks: exit 2 before the old table is touched; the finished
    # points stay in the checkpoint for the corrected rerun
    grid.write_text(head + "grid: {--ranks: [2, 8]}\nkeep: [time_s]\nplot: {x: ranks, y: nope}\n")
    before = out.read_bytes()
    assert main(["sweep", str(grid), "--out", str(out), "--plot", str(tmp_path / "p.png"),
                 "--workers", "1"]) == 2
    assert "nope" in capsys.readouterr().err and out.read_bytes() == before
    assert not (tmp_path / "p.png").exists()
    assert (tmp_path / "r.csv.partial.jsonl").exists()
    assert main(["sweep", str(grid), "--out", str(out), "--timeout", "0"]) == 2
