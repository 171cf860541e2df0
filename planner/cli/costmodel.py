"""``clusterplan costmodel collect | train``."""

from __future__ import annotations

import argparse
import shlex
import sys

from simulator.errors import SpecError
from simulator.fileio import dumps_json

from planner.costmodel.model import train
from planner.costmodel.weights import save_weights
from planner.measure.tables.collect import CollectConfig, collect

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    cs = p.add_subparsers(dest="costmodel_cmd", required=True)
    c = cs.add_parser("collect", help="measure fused TBE lookups and straggler all-to-alls")
    c.add_argument("--out", required=True, help="data CSV (appended; DATA.meta.json beside it)")
    c.add_argument("--samples", type=int, default=400, help="compute combinations (default 400)")
    c.add_argument("--comm-samples", type=int, default=100,
                   help="all-to-all samples on --comm-devices gloo processes (default 100)")
    c.add_argument("--passes", type=int, default=3,
                   help="passes over all compute samples, one after another; training takes "
                        "the median over them (default 3)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--repeats", type=int, default=20,
                   help="timed iterations per sample and pass (default 20)")
    c.add_argument("--max-tables", type=int, default=20)
    c.add_argument("--comm-devices", type=int, default=4)
    c.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the lookup kernels are timed (default cpu; cuda needs a GPU and "
                        "CUDA builds of torch and fbgemm_gpu)")
    c.add_argument("--mix-hardware", action="store_true",
                   help="append to a file collected on other hardware")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=run)
    t = cs.add_parser("train", help="train the cost network and the gradient-boosting baseline")
    t.add_argument("data", help="data CSV from `costmodel collect`")
    t.add_argument("--out", help="weights file (.pt; a .json with the metadata beside it)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--epochs", type=int, default=300)
    t.add_argument("--ensemble", type=int, default=5,
                   help="additive nets averaged into the shipped compute model (default 5)")
    t.add_argument("--json", action="store_true", help="print the metrics as JSON")
    t.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    """``costmodel collect`` or ``costmodel train``."""
    return _collect(a) if a.costmodel_cmd == "collect" else _train(a)


def _collect(a: argparse.Namespace) -> int:
    for name in ("samples", "comm_samples", "passes", "repeats", "max_tables"):
        least = 1 if name in ("passes", "repeats", "max_tables") else 0
        if getattr(a, name) < least:
            flag = f"--{name.replace('_', '-')}"
            raise SpecError(f"{flag} must be ≥ {least}, got {getattr(a, name)}",
                            source=f"--{name.replace('_', '-')}", fix="pass a positive count")
    if a.comm_devices < 2:
        raise SpecError(f"--comm-devices must be ≥ 2, got {a.comm_devices}",
                        source="--comm-devices", fix="pass e.g. --comm-devices 4")
    cfg = CollectConfig(seed=a.seed, samples=a.samples, comm_samples=a.comm_samples,
                        passes=a.passes, repeats=a.repeats, max_tables=a.max_tables,
                        comm_devices=a.comm_devices, device=a.device)
    command = "clusterplan " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    counts = collect(a.out, cfg, mix_hardware=a.mix_hardware, progress=not a.no_progress,
                     command=command)
    print(f"{a.out}: {counts['compute']} compute and {counts['comm']} communication rows added "
          f"({counts['skipped']} already there)")
    return 0


def _train(a: argparse.Namespace) -> int:
    if a.ensemble < 1 or a.epochs < 1:
        raise SpecError(f"--ensemble and --epochs must be ≥ 1, got {a.ensemble}, {a.epochs}",
                        source="--ensemble" if a.ensemble < 1 else "--epochs",
                        fix="pass e.g. --ensemble 5 --epochs 300")
    res = train(a.data, seed=a.seed, epochs=a.epochs, ensemble=a.ensemble)
    m = res["metrics"]
    if a.out:
        save_weights(a.out, res, data_path=a.data, command="clusterplan " + " ".join(
            shlex.quote(x) for x in sys.argv[1:]))
    if a.json:
        print(dumps_json(m, indent=1, sort_keys=True))
        return 0
    print(f"{m['samples']} combinations ({m['train']} train, {m['validation']} validation, "
          f"{m['test']} held-out test, batch {m['batch']})")
    print(f"{'model':<26}{'held-out MAPE':>15}{'Kendall tau':>13}")
    shipped = f"additive nets ×{m['compute_net']['members']} (shipped)"
    for key, label in (("compute_net", shipped),
                       ("neuroshard_net", "NeuroShard pooled net"),
                       ("hist_gradient_boosting", "HistGradientBoosting")):
        print(f"{label:<26}{100 * m[key]['test_mape']:>14.1f}%{m[key]['test_kendall_tau']:>13.3f}")
    if "noise_pairs" in m:
        nz = m["noise_pairs"]
        print(f"{'noise (pass 1 vs pass 0)':<26}{100 * nz['mape_round1_vs_round0']:>14.1f}%"
              f"{nz['kendall_tau_round1_vs_round0']:>13.3f}   ({nz['pairs']} pairs, "
              f"{nz['column']})")
    print(f"target: {m['target']}")
    if "comm" in m:
        c = m["comm"]
        for key, label in (("fwd_net", "forward all-to-all net"),
                           ("bwd_net", "backward all-to-all net")):
            print(f"{label:<26}{100 * c[key]['test_mape']:>14.1f}%"
                  f"{c[key]['test_kendall_tau']:>13.3f}   ({c['devices']} devices)")
    if a.out:
        print(f"weights: {a.out}")
    return 0
