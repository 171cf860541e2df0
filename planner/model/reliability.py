"""`simulate` options for stragglers and failures, shared by model and workload simulations.

``--straggler RANK=FACTOR`` (repeatable) slows a rank's compute; ``--link-fault`` scales a
link's capacity from a moment on; ``--mtbf`` (per GPU) with
``--checkpoint-every``, ``--checkpoint-cost`` and ``--restart`` adds MegaScale's effective
training time ratio (simulator/faults.py) and the throughput that survives it.
"""

from __future__ import annotations

from simulator.errors import SpecError
from simulator.faults import (
    Reliability,
    ettr,
    find_hot_links,
    find_stragglers,
    optimal_checkpoint_interval,
    parse_link_faults,
    parse_stragglers,
)
from simulator.units import format_time

__all__ = ["add_arguments", "stragglers_from_args", "link_faults_from_args",
           "reliability_report"]


def add_arguments(p) -> None:
    g = p.add_argument_group("stragglers and failures")
    g.add_argument("--straggler", action="append", default=[], metavar="RANK=FACTOR",
                   help="rank RANK computes FACTOR× slower (e.g. 17=1.1); repeatable")
    g.add_argument("--link-fault", action="append", default=[], metavar="SRC->DST=FACTOR[@TIME]",
                   help="from TIME on the link keeps FACTOR of its capacity, e.g. "
                        "'leaf0/rail0<->spine0=0.5@5ms' (<-> both directions, wildcards ok)")
    g.add_argument("--diagnose", action="store_true",
                   help="name straggling ranks and hot links (links busy far longer than "
                        "their peers); tracks per-link traffic, so runs in explicit mode")
    g.add_argument("--mtbf", metavar="TIME",
                   help="mean time between failures of one GPU, e.g. 50000h; adds ETTR")
    g.add_argument("--checkpoint-every", default="30min", metavar="TIME",
                   help="training time between checkpoints (default 30min)")
    g.add_argument("--checkpoint-cost", default="0s", metavar="TIME",
                   help="stall to write one checkpoint (default 0s: asynchronous)")
    g.add_argument("--restart", default="10min", metavar="TIME",
                   help="from a failure to training again (default 10min)")


def stragglers_from_args(args, num_gpus: int) -> dict[int, float]:
    return parse_stragglers(getattr(args, "straggler", None) or [], num_gpus)


def link_faults_from_args(args, topo) -> list:
    return parse_link_faults(getattr(args, "link_fault", None) or [], topo)


def reliability_report(args, *, gpus: int, step_time_s: float,
                       busy_s: dict[int, float] | None = None, sim=None, topo=None
                       ) -> tuple[dict, list[str]]:
    """JSON members and printed lines for the diagnosis (stragglers, hot links) and the ETTR."""
    data: dict = {}
    lines: list[str] = []
    diagnose = getattr(args, "diagnose", False)
    if busy_s is not None and (getattr(args, "straggler", None) or diagnose):
        found = find_stragglers(busy_s)
        data["stragglers_found"] = found
        if found:
            worst = found[0]
            lines.append(f"  straggler diagnosis: rank {worst['rank']} busy "
                         f"{format_time(worst['busy_s'])}, ×{worst['slowdown']:.3f} the median "
                         f"rank ({len(found)} rank(s) flagged)")
        elif diagnose:
            lines.append("  straggler diagnosis: no rank stands out")
    if diagnose and sim is not None and topo is not None:
        hot = find_hot_links(topo, sim.link_busy_s)
        data["hot_links"] = hot
        lines.append("  hot links: " + ("; ".join(
            f"{h['link']} busy {format_time(h['busy_s'])}, ×{h['ratio']:.1f} its {h['tier']} "
            f"peers" for h in hot) if hot else "none stand out"))
    if getattr(args, "mtbf", None):
        rel = Reliability.parse(mtbf=args.mtbf, interval=args.checkpoint_every,
                                cost=args.checkpoint_cost, restart=args.restart)
        if rel.checkpoint_interval_s < step_time_s:
            raise SpecError(f"checkpoint interval {format_time(rel.checkpoint_interval_s)} is "
                            f"shorter than one step ({format_time(step_time_s)})",
                            field="--checkpoint-every", fix="checkpoint every few steps at most")
        r = ettr(gpus, rel)
        if r < 1e-6:
            raise SpecError(f"a failure every {format_time(rel.mtbf_gpu_s / gpus)} on {gpus} GPUs "
                            f"with a checkpoint every {format_time(rel.checkpoint_interval_s)} "
                            f"and {format_time(rel.restart_s)} restarts makes no progress "
                            f"(ETTR {r:.1e})", field="--mtbf",
                            fix="check the MTBF (it is per GPU, e.g. 50000h) or checkpoint and "
                                "restart faster")
        # free checkpoints are best taken as often as possible: no optimum to report
        best = optimal_checkpoint_interval(gpus, rel) if rel.checkpoint_cost_s > 0 else \
            max(step_time_s, 0.0)
        data["reliability"] = {
            "ettr": r, "gpus": gpus, "mtbf_gpu_s": rel.mtbf_gpu_s,
            "job_mtbf_s": rel.mtbf_gpu_s / gpus,
            "checkpoint_interval_s": rel.checkpoint_interval_s,
            "checkpoint_cost_s": rel.checkpoint_cost_s, "restart_s": rel.restart_s,
            "best_checkpoint_interval_s": best, "ettr_at_best_interval": ettr(
                gpus, Reliability(rel.mtbf_gpu_s, best, rel.checkpoint_cost_s, rel.restart_s)),
            "effective_step_time_s": step_time_s / r}
        lines.append(f"  failures: one every {format_time(rel.mtbf_gpu_s / gpus)} on {gpus} GPUs; "
                     f"ETTR {r:.1%} (checkpoint every {format_time(rel.checkpoint_interval_s)}; "
                     f"best {format_time(best)} → {data['reliability']['ettr_at_best_interval']:.1%}),"
                     f" effective step {format_time(step_time_s / r)}")
    return data, lines
