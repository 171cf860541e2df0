"""Run a sweep's points in a local process pool or on a Ray cluster; resumable; one table.

Each point runs one ``clusterplan`` command line in a worker through ``command`` (the CLI's
``main``, handed down by the ``sweep`` command: this layer sits below the CLI that drives it)
and keeps its JSON output. Finished
points are appended to a checkpoint file (JSON lines, ``<out>.partial.jsonl``) as they arrive,
so an interrupted sweep started again with the same file and output runs only what is missing.
The table has one row per point in grid order, whatever order the workers finished in, so the
pool and Ray give the same table.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from simulator.errors import SpecError
from simulator.fileio import read_text

from planner.progress import track
from planner.sweep.grid import Point, SweepSpec, points

__all__ = ["run_point", "run_sweep", "result_table", "check_plot_columns"]


class _PointTimeout(BaseException):
    """A point ran past its time (a BaseException: the command's own ``except Exception``
    must not swallow it)."""


@contextlib.contextmanager
def _deadline(seconds: float | None):
    """Raise :class:`_PointTimeout` in this (main) thread after ``seconds`` of wall time."""
    if not seconds:
        yield
        return

    def expire(_sig, _frame):
        raise _PointTimeout

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_point(argv: tuple[str, ...], command: Callable[[list[str]], int],
              timeout_s: float | None = None) -> dict[str, Any]:
    """Run one ``clusterplan`` command line with ``command`` (a ``main(argv) -> exit code``,
    picklable for the pool and Ray); ``{"ok": bool, "result"|"error": ...}``.

    A point whose command fails (bad value, exit 2) is a row with its error, not a crash of the
    sweep: one impossible configuration in a grid is normal. A point whose command raises
    (a bug, memory) or runs past ``timeout_s`` seconds is a failed row too, marked ``crashed``
    (not kept in the checkpoint, so a rerun, perhaps with a longer timeout, tries it again).
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with _deadline(timeout_s):
                code = command(list(argv))
        except SystemExit as exc:                 # argparse rejects an argument
            code = exc.code if isinstance(exc.code, int) else 2
        except _PointTimeout:
            return _crashed(f"timed out after {timeout_s:g} s") | {"timed_out": True}
        except Exception as exc:  # noqa: BLE001 - one point's crash must not end the sweep
            return _crashed(f"{type(exc).__name__}: {exc}")
    if code != 0:
        msg = (err.getvalue().strip().splitlines() or [f"exit code {code}"])[-1]
        return {"ok": False, "error": msg, "exit_code": code}
    try:
        return {"ok": True, "result": json.loads(out.getvalue())}
    except json.JSONDecodeError:
        return {"ok": False, "error": "the command printed no JSON", "exit_code": code}


def _crashed(why: str) -> dict[str, Any]:
    return {"ok": False, "error": f"crashed: {why}"[:500], "exit_code": 1, "crashed": True}


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(d, (int, float, str, bool)) or d is None:
        out[prefix[:-1]] = d
    return out


def _row(point: Point, outcome: dict, keep: tuple[str, ...] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point.index, **point.params, "ok": outcome["ok"],
                           "error": outcome.get("error", "")}
    if outcome["ok"]:
        res = outcome["result"]
        if keep:
            flat = _flatten(res)
            for k in keep:
                row[k] = flat.get(k)
        else:
            for k, v in res.items():
                # wall-clock fields differ run to run; the table is about the simulated system
                if isinstance(v, (int, float, str, bool)) and "wall" not in k:
                    row[k] = v
    return row


def result_table(spec: SweepSpec, outcomes: dict[str, dict]) -> pd.DataFrame:
    """The table of a sweep from its outcomes by point key, in grid order."""
    rows = [_row(p, outcomes[p.key], spec.keep) for p in points(spec) if p.key in outcomes]
    return pd.DataFrame(rows)


def _read_checkpoint(path: Path) -> dict[str, dict]:
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    for line in read_text(path, field="checkpoint").splitlines():
        try:
            rec = json.loads(line)
            done[rec["key"]] = rec["outcome"]
        except (json.JSONDecodeError, RecursionError, KeyError, TypeError):
            continue                       # a line cut by the interruption: rerun that point
    return done


def run_sweep(spec: SweepSpec, *, command: Callable[[list[str]], int],
              workers: int | None = None, ray_address: str | None = None,
              checkpoint: Path | None = None,
              progress: Callable[[Iterable, int], Iterable] | None = None,
              timeout_s: float | None = None) -> tuple[pd.DataFrame, dict]:
    """Run every point not yet in ``checkpoint``; returns (table, stats).

    ``command``: runs one point's command line (:func:`run_point`); ``workers``: processes of
    the local pool (default: the CPUs); ``ray_address``: run on Ray instead (``"local"`` starts
    a local Ray instance, anything else is ``ray.init(address=)``); ``timeout_s``: wall seconds
    a point may take before it is stopped and recorded as timed out. ``stats`` counts points
    run now, resumed from the checkpoint, failed, and timed out.
    """
    pts = points(spec)
    done = _read_checkpoint(checkpoint) if checkpoint else {}
    todo = [p for p in pts if p.key not in done]
    workers = workers or os.cpu_count() or 1
    fh = checkpoint.open("a") if checkpoint else None
    progress = progress or (lambda it, total: it)
    try:
        stream = (_run_ray(todo, command, ray_address, workers, timeout_s) if ray_address
                  else _run_pool(todo, command, workers, timeout_s))
        for key, outcome in progress(stream, len(todo)):
            done[key] = outcome
            if fh and not outcome.get("crashed"):
                fh.write(json.dumps({"key": key, "outcome": outcome}) + "\n")
                fh.flush()
    finally:
        if fh:
            fh.close()
    table = result_table(spec, done)
    stats = {"points": len(pts), "run": len(todo), "resumed": len(pts) - len(todo),
             "failed": int((~table.ok).sum()) if len(table) else 0,
             "timed_out": sum(1 for o in done.values() if o.get("timed_out"))}
    return table, stats


def _run_pool(todo: list[Point], command, workers: int, timeout_s: float | None):
    if workers == 1 or len(todo) <= 1:
        for p in todo:
            yield p.key, run_point(p.argv, command, timeout_s)
        return
    with ProcessPoolExecutor(max_workers=workers) as ex:
        futs = {ex.submit(run_point, p.argv, command, timeout_s): p for p in todo}
        for fut in as_completed(futs):
            try:
                outcome = fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker killed (memory) or broken pool
                outcome = _crashed(f"worker process lost: {type(exc).__name__}: {exc}")
            yield futs[fut].key, outcome


def _run_ray(todo: list[Point], command, address: str, workers: int,
             timeout_s: float | None):
    if address == "local":
        # A local Ray binds its GCS, raylet and workers to the node's address; on Linux that is
        # the outward-facing one unless Ray is told this is a single-machine cluster. Read by
        # ray at import; with it, every Ray server listens on loopback only.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise SpecError("Ray is not installed", field="--ray",
                        fix="pip install 'ray>=2.9' (or run without --ray: a local pool)") from None
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "configure_logging": False}
        if address == "local":
            kw |= {"num_cpus": workers, "object_store_memory": 100 * 2**20,
                   "_node_ip_address": "127.0.0.1"}
        else:
            kw["address"] = address
        try:
            ray.init(**kw)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise SpecError(f"cannot reach the Ray cluster at {address!r}: {exc}", field="--ray",
                            fix="give the head's address (ray://host:10001 or host:6379), "
                                "or --ray local") from None
        started = True
    try:
        task = ray.remote(run_point)
        refs = {task.remote(p.argv, command, timeout_s): p for p in todo}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                try:
                    outcome = ray.get(r)
                except Exception as exc:  # noqa: BLE001 - a Ray worker died under the point
                    outcome = _crashed(f"Ray task lost: {type(exc).__name__}")
                yield refs[r].key, outcome
    finally:
        if started:
            ray.shutdown()


def write_table(table: pd.DataFrame, path: Path) -> None:
    """CSV or parquet by suffix, written atomically (no half-written table)."""
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        try:
            table.to_parquet(tmp, index=False)
        except ImportError:
            raise SpecError("writing parquet needs pyarrow", field="--out",
                            fix="pip install pyarrow, or write .csv") from None
    elif path.suffix == ".csv":
        table.to_csv(tmp, index=False)
    else:
        raise SpecError(f"unknown table format {path.suffix!r}", field="--out",
                        fix="end the file name in .csv or .parquet")
    os.replace(tmp, path)


def check_plot_columns(table: pd.DataFrame, plot: dict) -> None:
    """A :class:`SpecError` naming the first of the plot's x, y, hue the table lacks."""
    for col in (plot["x"], plot["y"], plot.get("hue")):
        if col and col not in table.columns:
            raise SpecError(f"plot column {col!r} is not in the table "
                            f"({', '.join(map(str, table.columns))})", field="plot",
                            fix="name a grid option (without dashes) or a kept result key")


def plot_table(table: pd.DataFrame, plot: dict, path: Path) -> None:
    """One line per ``hue`` value of ``y`` against ``x`` (PNG/SVG/PDF by suffix)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    check_plot_columns(table, plot)
    x, y, hue = plot["x"], plot["y"], plot.get("hue")
    ok = table[table.ok]
    fig, ax = plt.subplots(figsize=(6, 4))
    groups = ok.groupby(hue) if hue else [(None, ok)]
    for val, g in groups:
        g = g.sort_values(x)
        ax.plot(g[x], g[y], marker="o", label=f"{hue}={val}" if hue else None)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if plot.get("logx"):
        ax.set_xscale("log")
    if plot.get("logy"):
        ax.set_yscale("log")
    if plot.get("title"):
        ax.set_title(plot["title"])
    if hue:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def bar_progress(it: Iterable, total: int) -> Iterable:
    """A rich progress bar over the finished points (when stderr is a terminal)."""
    return track(it, total, "sweep")
