"""``clusterplan plan TABLES --dmt``: towers beside the flat plan, simulated both ways.

::

    clusterplan plan TABLES --devices N [--topology NAME] --dmt [--towers auto|K]
        [--tower-module auto|identity|mix|linear|mlp] [--tm-ratio C]
        [--partitioner affinity|balanced|random]
        [--balance EPS] [--coaccess FILE]

The plan made by ``--planner`` is the flat baseline. With ``--dmt`` the features are also
partitioned into towers (:mod:`planner.dmt.partition`), each host's tables are sharded inside
the host by the same planner, both steps are simulated (:mod:`.simulate`), and the plan JSON
gets a ``dmt`` section: towers (tables, host, pooled width in, module width), the partition's
tower costs, imbalance and affinity kept, each host's layout in global ranks, the simulated flat
and DMT step times and speedup with breakdowns and cross-host bytes, and the layout as TorchRec
embedding-tower shardings (:mod:`planner.export.dmt`).
"""

from __future__ import annotations

import argparse

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import check_input_file
from simulator.units import format_bytes, format_time

from planner.dmt.compare import compare_flat_dmt
from planner.dmt.partition import METHODS, partition_layout
from planner.export.dmt import tower_sharding_plan
from planner.model.dmt.layout import host_groups
from planner.model.dmt.module import TM_KINDS, TowerModuleSpec
from planner.model.tables.task import prepare

__all__ = ["add_dmt_arguments", "dmt_section", "format_dmt"]


def add_dmt_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--dmt`` options of ``clusterplan plan``."""
    g = p.add_argument_group("DMT towers (--dmt)")
    g.add_argument("--dmt", action="store_true",
                   help="also plan SPTT towers (one host each) and simulate DMT vs the flat plan")
    g.add_argument("--towers", default="auto", metavar="auto|K",
                   help="number of towers (auto: one per host)")
    g.add_argument("--tower-module", default="auto", choices=("auto",) + TM_KINDS,
                   help="per-tower dense module: identity keeps the model unchanged; mix mixes "
                        "a tower's F vectors into F/C; linear projects its width by C; auto "
                        "(default): mix when all tables share one dim, else linear")
    g.add_argument("--tm-ratio", type=float, default=4.0, metavar="C",
                   help="module compression D_t / D'_t (default 4; a model change whose accuracy "
                        "must be checked in training)")
    g.add_argument("--partitioner", default="affinity", choices=METHODS,
                   help="tower partitioner (default affinity)")
    g.add_argument("--balance", type=float, default=0.05, metavar="EPS",
                   help="tower-cost imbalance target max/mean - 1 (default 0.05)")
    g.add_argument("--coaccess", default=None, metavar="FILE",
                   help="co-access statistics: a .npy or CSV matrix samples x tables (per-sample "
                        "id counts, spec order); default: a seeded synthetic sample")


#: the largest --balance: a tower's cost over the mean, less 1; past towers - 1 it no longer
#: constrains anything, and an infinite one cannot enter the MIP
MAX_BALANCE = 100.0


def _load_coaccess(path: str | None, n_tables: int):
    if path is None:
        return None
    p = check_input_file(path, field="--coaccess", missing_fix="check the path")
    try:
        a = np.load(p) if p.suffix == ".npy" else np.loadtxt(p, delimiter=",", ndmin=2)
    except (ValueError, OSError, EOFError) as exc:
        raise SpecError(f"cannot read a numeric matrix: {exc}", source=path,
                        fix="write one row per sample, one column per table") from None
    if a.ndim != 2 or a.shape[1] != n_tables or not np.isfinite(a).all():
        raise SpecError(f"co-access matrix has shape {a.shape}, expected (samples, {n_tables}) "
                        "of finite numbers", source=path, fix="one column per table")
    return a


def dmt_section(args, task, plan) -> tuple[dict, object]:
    """The plan JSON's ``dmt`` section and the comparison behind it."""
    if not 0 <= args.balance <= MAX_BALANCE:       # also refuses nan
        raise SpecError(f"--balance must be in [0, {MAX_BALANCE:g}], got {args.balance}",
                        source="--balance", fix="pass e.g. --balance 0.05 (5% over the mean)")
    kind = args.tower_module
    if kind == "auto":
        kind = "mix" if len({t.embedding_dim for t in task.model.tables}) == 1 else "linear"
    module = TowerModuleSpec(kind=kind, ratio=args.tm_ratio)
    n = plan.devices
    problem = prepare(task, n)
    groups = host_groups(problem)
    co = _load_coaccess(args.coaccess, task.model.num_tables)
    part = partition_layout(task, n, towers=args.towers, module=module, method=args.partitioner,
                            coaccess=co, epsilon=args.balance, seed=args.seed)
    # the planner's limit (mip's default 10 s) shared by the hosts' sub-plans
    host_limit = max(0.5, (args.time_limit or 10.0) / part.layout.hosts)
    cmp = compare_flat_dmt(task, n, layout=part.layout, flat_plan=plan,
                           planner=plan.planner if plan.planner != "torchrec" else "greedy",
                           seed=args.seed, time_limit_s=host_limit)
    model = task.model
    lay = part.layout.to_dict(model)
    for tw, c in zip(lay["towers"], part.tower_costs_s):
        tw["cost_s"] = float(c)
    hosts = []
    for hp in cmp.host_plans:
        entry = {"host": hp.host, "ranks": list(groups[hp.host]), "shards": []}
        if hp.plan is not None:
            entry["max_cost_s"] = hp.plan.max_cost_s
            for ts in hp.plan.shardings:
                entry["shards"].append({
                    "table": model.tables[hp.tables[ts.table]].name,
                    "sharding_type": ts.sharding_type.value,
                    "ranks": [groups[hp.host][s.rank] for s in ts.shards],
                    "shards": [{"rank": groups[hp.host][s.rank],
                                "offsets": [s.row_offset, s.col_offset],
                                "sizes": [s.rows, s.cols]} for s in ts.shards]})
        hosts.append(entry)
    doc = dict(lay)
    doc["partitioner"] = {"method": args.partitioner, "balance_target": args.balance,
                          "coaccess": args.coaccess or "synthetic (seeded)", **part.to_dict()}
    doc["host_plans"] = hosts
    doc["simulation"] = cmp.to_dict()
    doc["torchrec"] = tower_sharding_plan(model, part.layout, cmp.host_plans, groups)
    doc["notes"] = ["module " + ("identity: the model is unchanged (only the route changes)"
                                 if module.is_identity else
                                 f"{module.kind} with ratio {module.ratio:g} changes the model; "
                                 "its accuracy is not simulated"),
                    "TorchRec 1.8.0's tower sharder accepts table_row_wise and "
                    "table_column_wise only; table-wise tables export as one-shard "
                    "table_column_wise"]
    return doc, (cmp, part)


def format_dmt(doc: dict) -> str:
    """Human-readable lines for the ``dmt`` section."""
    s = doc["simulation"]
    p = doc["partitioner"]
    lines = [f"DMT: {doc['num_towers']} towers on {doc['hosts']} hosts × {doc['gpus_per_host']} "
             f"GPUs, module {doc['module']['kind']}"
             + (f" (ratio {doc['module']['ratio']:g})" if doc['module']['kind'] != "identity"
                else "")
             + f", partitioner {p['method']}: imbalance {p['imbalance']:.3f}"
             + (f", affinity kept {p['affinity_kept']:.3f}" if p["affinity_kept"] is not None
                else "")]
    for tw in doc["towers"][:8]:
        names = ", ".join(tw["tables"][:6]) + (" …" if len(tw["tables"]) > 6 else "")
        lines.append(f"  tower {tw['tower']:>3} host {tw['host']:>3}: {len(tw['tables'])} tables "
                     f"({names}), width {tw['in_width']} → {tw['module_width']}, "
                     f"cost {format_time(tw['cost_s'])}")
    if len(doc["towers"]) > 8:
        lines.append(f"  … {len(doc['towers']) - 8} more towers")
    lines.append(f"simulated step: flat {format_time(s['flat_step_s'])}, DMT "
                 f"{format_time(s['dmt_step_s'])}, speedup {s['speedup']:.2f}×; cross-host "
                 f"bytes {format_bytes(s['flat_cross_host_bytes'])} → "
                 f"{format_bytes(s['dmt_bytes']['cross_host'])}")
    return "\n".join(lines)
