"""Timing benchmark of ``clusterplan validate``: predicted vs measured step time on this machine.

    python tests/bench/bench_validate.py [--only llm|dlrm] [--rounds 5] [--steps 10]
                                         [--warmup 5] [--retries 2] [--out FILE.json]
    python tests/bench/bench_validate.py --repredict traces/validate/bench-*.json

One pool of 2 spawned gloo processes (one thread each, main threads pinned to a core) runs
``--rounds`` rounds, each a round of ``clusterplan calibrate gloo`` (per-size collective
tables, reduce-scatter and all-gather separate, the extra cost of a call after compute, one
core's compute curves, host time per block, co-running lookups, TorchRec probe plans)
followed by every configuration once: ``--warmup`` steps, then ``--steps`` measured steps. The calibration is
the median over its rounds, the measured step time the median over all rounds' steps of the
slowest rank's step. Why rounds: this shared VM's speed drifts by up to ±20% over minutes
(other tenants; invisible in ``/proc``), so a calibration taken once, then configurations
run one after the other, each see a different machine; interleaved, calibration and every
configuration sample the same spells. While each run (and each calibration round) goes, the
CPU time other processes used is metered (``/proc``); a run where they used more than 0.2
cores is flagged and run again (``--retries``), and the table says so.

Configurations (2 processes): a scaled Llama-style transformer (SwiGLU, GQA) with DP, TP, PP
(1F1B and GPipe), interleaved PP, and a GPT-style (GELU, selective recompute) one with TP and
DP; DLRM sharding plans (TorchRec DMP) for one table spec of 8 tables (20k-400k rows, dims
16-64, pooling 5-30, batch 2,048, DCNv2 dense part): the greedy planner's (table-wise) and hand
layouts (column-wise, row-wise, TW+RW, TW/CW/RW/DP mixed), and mixed and all data-parallel on
the same tables with rows ÷ 8 (all-DP of the full tables takes ~370 ms a step). A mix of axes needs four processes, twice
this machine's cores; that is left out here (its structure is checked by the tests).

Prints one row per configuration (predicted, measured, error, other cores, retries), the MAPE,
the worst error and Kendall's tau between predicted and measured times, against the goals of
issue 10 (each within 20%, MAPE ≤ 12%, tau ≥ 0.8), and writes everything as JSON.
``--repredict`` runs nothing: it times the LLM rows of earlier runs again with the current
simulator and the calibration each file recorded, to see what a model change does to them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LLAMA = dict(hidden=512, seq=128, layers=4, heads=8, kv_heads=2)
GPT = dict(hidden=384, seq=128, layers=4, heads=6, kv_heads=6)

#: (label, model, parallel, schedule, scale overrides)
LLM_CONFIGS = (
    ("llama dp2", "llama3-8b", "tp=1,pp=1,dp=2", "1f1b", dict(LLAMA, microbatches=2)),
    ("llama tp2", "llama3-8b", "tp=2,pp=1,dp=1", "1f1b", dict(LLAMA, microbatches=2)),
    ("llama pp2 1f1b", "llama3-8b", "tp=1,pp=2,dp=1", "1f1b", dict(LLAMA, microbatches=4)),
    ("llama pp2 gpipe", "llama3-8b", "tp=1,pp=2,dp=1", "gpipe", dict(LLAMA, microbatches=4)),
    ("llama pp2 vpp2", "llama3-8b", "tp=1,pp=2,dp=1,vpp=2", "interleaved",
     dict(LLAMA, microbatches=4)),
    ("gpt tp2", "gpt3-175b", "tp=2,pp=1,dp=1,fsdp=none", "1f1b", dict(GPT, microbatches=2)),
    ("gpt dp2", "gpt3-175b", "tp=1,pp=1,dp=2,fsdp=none", "1f1b", dict(GPT, microbatches=2)),
)

DLRM_TABLES = """name: bench-dlrm
batch_size: 2048
optimizer: sgd
dense: {num_dense_features: 13, bottom_mlp: [128, 64], top_mlp: [128, 64, 1], interaction: dcnv2,
        dcn_layers: 1, dcn_projection: 32}
tables:
  - {name: t0, num_embeddings: 200000, embedding_dim: 64, pooling_factor: 20, zipf_exponent: 1.1}
  - {name: t1, num_embeddings: 100000, embedding_dim: 64, pooling_factor: 10, zipf_exponent: 1.05}
  - {name: t2, num_embeddings: 50000, embedding_dim: 32, pooling_factor: 30, zipf_exponent: 1.2}
  - {name: t3, num_embeddings: 400000, embedding_dim: 32, pooling_factor: 5, zipf_exponent: 1.1}
  - {name: t4, num_embeddings: 20000, embedding_dim: 64, pooling_factor: 15, zipf_exponent: 1.0}
  - {name: t5, num_embeddings: 80000, embedding_dim: 16, pooling_factor: 25, zipf_exponent: 1.15}
  - {name: t6, num_embeddings: 160000, embedding_dim: 32, pooling_factor: 8, zipf_exponent: 1.1}
  - {name: t7, num_embeddings: 40000, embedding_dim: 64, pooling_factor: 12, zipf_exponent: 1.05}
"""

#: (label, table spec (full or rows ÷ 8), planner name or a hand layout: the sharding type of
#: each table in turn, tw / cw (halves) / rw / dp)
DLRM_CONFIGS = (
    ("dlrm greedy", "full", "greedy"),
    ("dlrm cw", "full", ("cw",)),
    ("dlrm rw", "full", ("rw",)),
    ("dlrm tw+rw", "full", ("tw", "rw")),
    ("dlrm mixed", "full", ("tw", "cw", "rw", "dp")),
    ("dlrm mixed small", "small", ("tw", "cw", "rw", "dp")),
    ("dlrm dp small", "small", ("dp",)),
)


def _small(text: str) -> str:
    import re
    return re.sub(r"num_embeddings: (\d+)", lambda m: f"num_embeddings: {int(m[1]) // 8}",
                  text).replace("name: bench-dlrm", "name: bench-dlrm-small")


def _hand_plan(spec: Path, kinds: tuple, out: Path) -> None:
    import planner.model.tables.shards as sh
    from planner.model.tables.plan import PlannerStats, make_plan
    from planner.model.tables.spec_file import load_model_spec
    from planner.model.tables.task import ShardingTask, prepare
    model = load_model_spec(spec)
    problem = prepare(ShardingTask(model=model, topology="localhost-gloo:node.gpus=2"), 2)
    shards = []
    for i, t in enumerate(model.tables):
        k, rows, dim = kinds[i % len(kinds)], t.num_embeddings, t.embedding_dim
        shards.append(sh.table_wise(i, t.name, rows, dim, i % 2) if k == "tw" else
                      sh.column_wise(i, t.name, rows, dim, [0, 1], [dim // 2, dim - dim // 2])
                      if k == "cw" else sh.row_wise(i, t.name, rows, dim, 2) if k == "rw" else
                      sh.data_parallel(i, t.name, rows, dim, 2))
    plan = make_plan(problem, shards, "hand", PlannerStats())
    if not plan.valid:
        raise SystemExit(f"hand plan {kinds} is invalid: {plan.problems[:2]}")
    out.write_text(json.dumps(plan.to_dict()))


def llm_runs(steps: int, warmup: int):
    from planner.measure.validate.config import Scale, load_source, run_config
    for label, model, par, sched, scale in LLM_CONFIGS:
        spec, p, order, _ = load_source(model)
        cfg = run_config(spec, p, parallel_text=par, nproc=2, scale=Scale(**scale), order=order,
                         schedule=sched, recompute=None, steps=steps, warmup=warmup,
                         dp_buckets=4, p2p_scatter_gather=False, timeout_s=120, fault=None)
        yield label, "llm", cfg


def dlrm_runs(steps: int, warmup: int, work: Path):
    import contextlib
    import io

    from planner.cli.main import main as clusterplan
    from planner.measure.validate.dlrm import load_dlrm_config
    specs = {"full": work / "bench-dlrm.yaml", "small": work / "bench-dlrm-small.yaml"}
    specs["full"].write_text(DLRM_TABLES)
    specs["small"].write_text(_small(DLRM_TABLES))
    for label, which, how in DLRM_CONFIGS:
        out = work / f"plan-{label.replace(' ', '-')}.json"
        if isinstance(how, str):
            argv = ["plan", str(specs[which]), "--devices", "2", "--planner", how,
                    "--out", str(out)]
            with contextlib.redirect_stdout(io.StringIO()):
                if clusterplan(argv) != 0:
                    raise SystemExit(f"clusterplan {' '.join(argv)} failed")
        else:
            _hand_plan(specs[which], how, out)
        cfg = load_dlrm_config(str(out), nproc=2, steps=steps, warmup=warmup, timeout_s=120)
        yield label, "dlrm", cfg


def kendall_tau(a, b) -> float:
    from scipy.stats import kendalltau
    return float(kendalltau(a, b).statistic)


def summarise(rows: list[dict], *, wall_s: float | None = None) -> tuple[dict, dict]:
    """MAPE, worst error, rows within 20% and Kendall's tau of ``rows``, against the goals of
    issue 10; printed and returned."""
    errs = [abs(r["relative_error"]) for r in rows]
    tau = kendall_tau([r["predicted_step_time_s"] for r in rows],
                      [r["measured_step_time_s"] for r in rows]) if len(rows) > 1 else None
    summary = {"configs": len(rows), "mape": statistics.fmean(errs), "worst": max(errs),
               "within_20": sum(e <= 0.20 for e in errs), "kendall_tau": tau,
               "flagged": sum(r["flagged"] for r in rows), "wall_s": wall_s}
    goals = {"each within 20%": summary["within_20"] == len(rows),
             "MAPE <= 12%": summary["mape"] <= 0.12,
             "Kendall tau >= 0.8": tau is not None and tau >= 0.8}
    print(f"\n{summary['configs']} configurations: MAPE {summary['mape']:.1%}, worst "
          f"{summary['worst']:.1%}, {summary['within_20']} within 20%, Kendall tau "
          f"{tau:.2f}; {summary['flagged']} flagged for load"
          + (f"; {wall_s:.0f} s" if wall_s is not None else ""))
    print("goals: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items()))
    return summary, goals


def repredict(paths: list[str]) -> int:
    """Time the LLM rows of earlier runs' JSON files again with the current simulator, from the
    calibration each file recorded (nothing is run; the measured times are the file's). DLRM
    rows keep their recorded prediction: it needs the run's recorded collectives."""
    from simulator.gloo_profile import gloo_profile_from_dict

    from planner.measure.validate.expected import expected_step
    llm = {label: cfg for label, _, cfg in llm_runs(10, 5)}
    for path in paths:
        d = json.loads(Path(path).read_text())
        cal = gloo_profile_from_dict(d["calibration"], source=f"the calibration in {path}")
        rows = []
        print(f"{path} ({d['command']})")
        for r in d["rows"]:
            r = dict(r)
            old = r["predicted_step_time_s"]
            if r["config"] in llm:
                r["predicted_step_time_s"] = expected_step(
                    llm[r["config"]], calibration=cal).simulate().step_time_s
            m = r["measured_step_time_s"]
            r["relative_error"] = (r["predicted_step_time_s"] - m) / m
            rows.append(r)
            print(f"{r['config']:20s} predicted {r['predicted_step_time_s'] * 1e3:8.1f} ms "
                  f"(recorded {old * 1e3:8.1f} ms)  measured {m * 1e3:8.1f} ms  error "
                  f"{r['relative_error']:+6.1%}" + ("" if r["config"] in llm else "  as recorded"))
        summarise(rows)
        print()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("llm", "dlrm"))
    ap.add_argument("--repredict", nargs="+", metavar="FILE.json",
                    help="run nothing: time the LLM rows of these earlier runs again with the "
                         "current simulator and the calibration each recorded")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per round (10)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps per round (5)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds (5): each a calibration round, then every configuration once")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON to write (default traces/validate/"
                                                "bench-<time>.json)")
    a = ap.parse_args(argv)
    if min(a.steps, a.rounds) < 1 or a.warmup < 0 or a.retries < 0:
        ap.error("--steps and --rounds must be ≥ 1, --warmup and --retries ≥ 0")
    if a.repredict:
        missing = [f for f in a.repredict if not Path(f).is_file()]
        if missing:
            ap.error(f"--repredict: no such file {missing[0]}")
        return repredict(a.repredict)

    from simulator.gloo_profile import gloo_profile_from_dict

    from planner.measure.validate.calibrate import GlooCalibration, measure_gloo_raw
    from planner.measure.validate.calibrate_profile import profile_from_raw
    from planner.measure.validate.calibrate_summary import summary_lines
    from planner.measure.validate.dlrm_report import validate_dlrm
    from planner.measure.validate.load import OTHER_CORES_LIMIT, LoadMeter
    from planner.measure.validate.report import validate
    from planner.measure.validate.runner import Pool

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(a.out or ROOT / "traces" / "validate" / f"bench-{stamp}.json")
    rows = []
    t_start = time.time()
    with Pool(2) as pool, tempfile.TemporaryDirectory() as tmp:
        configs = []
        if a.only in (None, "llm"):
            configs += list(llm_runs(a.steps, a.warmup))
        if a.only in (None, "dlrm"):
            configs += list(dlrm_runs(a.steps, a.warmup, Path(tmp)))
        configs = [(label, kind, replace(cfg, trace_dir=None)) for label, kind, cfg in configs]
        raws, runs = [], {label: [] for label, _, _ in configs}
        for rnd in range(a.rounds):
            for attempt in range(a.retries + 1):
                raw = measure_gloo_raw(GlooCalibration(world=2, rounds=1, torchrec_rounds=1),
                                       pool=pool)
                if raw["other_cores"] <= OTHER_CORES_LIMIT:
                    break
            raws.append(raw)
            print(f"round {rnd + 1}/{a.rounds}: calibrated (other cores "
                  f"{raw['other_cores']:.2f}), running {len(configs)} configurations", flush=True)
            for label, kind, cfg in configs:
                tries = []
                for attempt in range(a.retries + 1):
                    meter = LoadMeter()
                    res = pool.run(cfg)
                    tries.append(meter.other_cores())
                    if tries[-1] <= OTHER_CORES_LIMIT:
                        break
                runs[label].append((res, tries))
        doc = profile_from_raw(raws)
        cal = gloo_profile_from_dict(doc, source=f"calibrate gloo in this run ({stamp}, "
                                                 f"{a.rounds} rounds between the runs)")
        print("\n".join(summary_lines(doc)), flush=True)
        for label, kind, cfg in configs:
            ds = [validate(cfg, result=res, calibration=cal) if kind == "llm"
                  else validate_dlrm(cfg, result=res, calibration=cal)
                  for res, _ in runs[label]]
            steps = [t for d in ds for t in d["steps_s"]]
            tries = [t for _, tr in runs[label] for t in tr]
            measured = statistics.median(steps)
            predicted = ds[0]["predicted_step_time_s"]
            flagged = sum(tr[-1] > OTHER_CORES_LIMIT for _, tr in runs[label])
            row = {"config": label, "kind": kind,
                   "predicted_step_time_s": predicted, "measured_step_time_s": measured,
                   "relative_error": (predicted - measured) / measured, "steps_s": steps,
                   "round_medians_s": [d["measured_step_time_s"] for d in ds],
                   "structure_match": all(d["structure"]["match"] for d in ds),
                   "other_cores": max(tries), "retries": len(tries) - len(ds),
                   "flagged": flagged > 0, "per_kind": [d["per_kind"] for d in ds]}
            rows.append(row)
            rm = ", ".join(f"{t * 1e3:.0f}" for t in row["round_medians_s"])
            print(f"{label:20s} predicted {predicted * 1e3:8.1f} ms  measured "
                  f"{measured * 1e3:8.1f} ms ({rm})  error {row['relative_error']:+6.1%}  "
                  f"other cores ≤ {row['other_cores']:.2f}"
                  + (f"  FLAGGED in {flagged} round(s)" if flagged else "")
                  + (f"  retried {row['retries']}×" if row["retries"] else "")
                  + ("" if row["structure_match"] else "  STRUCTURE MISMATCH"), flush=True)
    summary, goals = summarise(rows, wall_s=time.time() - t_start)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "goals": goals, "rows": rows,
                               "calibration": doc, "machine": doc["measured"]["machine"],
                               "command": " ".join(sys.argv)}, indent=1, default=float))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
