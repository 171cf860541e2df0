"""Long work is never silent: plain lines on stderr where no bar can be drawn."""

import planner.progress as P


def test_plain_lines_without_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv("CLUSTERPLAN_PROGRESS", raising=False)
    monkeypatch.setattr(P, "LINE_EVERY_S", 0.0)
    assert list(P.track(range(3), 3, "job")) == [0, 1, 2]
    err = capsys.readouterr()
    assert err.out == "" and err.err.splitlines()[-1].startswith("job: 3/3 after")
    bar = P.Bar(None, "poll")
    bar.update(7)
    bar.close()
    assert "poll: 7 after" in capsys.readouterr().err


def test_short_work_and_silenced_work_print_nothing(monkeypatch, capsys):
    monkeypatch.delenv("CLUSTERPLAN_PROGRESS", raising=False)
    assert list(P.track(range(3), 3, "quick")) == [0, 1, 2]     # under LINE_EVERY_S
    monkeypatch.setenv("CLUSTERPLAN_PROGRESS", "0")
    monkeypatch.setattr(P, "LINE_EVERY_S", 0.0)
    assert list(P.track(range(3), 3, "off")) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def test_stages_print_a_line_each_unless_quiet(monkeypatch, capsys):
    monkeypatch.delenv("CLUSTERPLAN_PROGRESS", raising=False)
    with P.stages("job", 2) as stage:
        stage("first")
        stage("second")
    lines = capsys.readouterr().err.splitlines()
    assert [x.split(" after")[0] for x in lines] == ["job: 1/2 first", "job: 2/2 second"]
    with P.stages("short", 2, quiet=True) as stage:
        stage("first")
    monkeypatch.setenv("CLUSTERPLAN_PROGRESS", "0")
    with P.stages("off", 1) as stage:
        stage("only")
    assert capsys.readouterr().err == ""


def test_each_names_every_item_as_it_starts(monkeypatch, capsys):
    monkeypatch.delenv("CLUSTERPLAN_PROGRESS", raising=False)
    seen = []
    for x in P.each([4, 8], "sweep", lambda n: f"{n} GPUs"):
        seen.append((x, capsys.readouterr().err.split(" after")[0]))
    assert seen == [(4, "sweep: 1/2 4 GPUs"), (8, "sweep: 2/2 8 GPUs")]


def test_a_long_mip_plan_says_what_it_is_doing(capsys):
    from planner.cli.main import main
    assert main(["plan", "criteo-dlrm", "--devices", "8", "--planner", "mip",
                 "--time-limit", "3", "--json"]) == 0
    err = capsys.readouterr().err
    assert "plan mip: 1/2 warm start" in err and "plan mip: 2/2 model build and CBC" in err
