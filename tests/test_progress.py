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
