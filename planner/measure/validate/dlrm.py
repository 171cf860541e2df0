"""``clusterplan validate`` for embedding-sharding (DLRM) plans: what a run executes.

A ``clusterplan.sharding-plan`` JSON (``clusterplan plan TABLES --devices N --out plan.json``)
with its table spec (``--tables``, default the plan's ``task.source``) becomes a
:class:`DLRMRunConfig`: the model spec (batch size from the plan, or ``--batch-size``), the
shardings, the plan exported to TorchRec (:func:`planner.export.torchrec.
export_torchrec_plan`) and the run's settings. Every rank and the simulator draw the same
batches: :func:`planner.measure.validate.dlrm_ops.step_batch` (seeded per step and table, from each table's access distribution,
:func:`planner.measure.tables.plans.table_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from simulator.errors import SpecError
from simulator.fileio import read_json_file

from planner.export.torchrec import export_torchrec_plan
from planner.export.torchrec_check import empty_row_shards, empty_shard_error
from planner.measure.heap import DEFAULT_HEAP
from planner.measure.tables.plans import cpu_topology_ref
from planner.measure.validate.config import MAX_PROCESSES, Fault
from planner.measure.validate.dlrm_worker import run_rank
from planner.model.tables.plan import plan_model, read_plan_json
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["DLRMRunConfig", "is_sharding_plan", "load_dlrm_config"]

PLAN_FORMAT = "clusterplan.sharding-plan"


def is_sharding_plan(ref: str) -> bool:
    """Whether ``ref`` is a JSON file whose ``format`` is a clusterplan sharding plan."""
    p = Path(ref)
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        doc = read_json_file(p, field="PLAN", missing_fix="", json_fix="")
    except SpecError:
        return False
    return isinstance(doc, dict) and doc.get("format") == PLAN_FORMAT


@dataclass(frozen=True, kw_only=True)
class DLRMRunConfig:
    """Everything a DLRM validation rank needs (picklable; no torch objects)."""

    model: object                  # planner.model.tables.spec.ModelSpec (batch overridden)
    shardings: tuple               # planner.model.tables.shards.TableSharding, one per table
    torchrec_plan: dict            # export_torchrec_plan(...) document
    plan_source: str = ""
    world: int = 2
    local_world: int = 2
    steps: int = 3
    warmup: int = 1
    timeout_s: float = 60.0
    seed: int = 1234
    lr: float = 0.01
    trace_dir: str | None = None
    fault: Fault | None = None
    backend: str = "gloo"
    heap: str = DEFAULT_HEAP        # what the ranks' C heap does with freed memory
    host_probe: bool = False        # time the lookup probe before the warm-up and after the steps
    extra: dict = field(default_factory=dict)

    @property
    def local_batch(self) -> int:
        return self.model.batch_size // self.world

    def to_dict(self) -> dict:
        m = self.model
        return {"kind": "dlrm", "plan": self.plan_source, "model": m.name,
                "tables": len(m.tables), "batch_size": m.batch_size,
                "local_batch": self.local_batch,
                "dense": None if m.dense is None else {
                    "bottom_mlp": list(m.dense.bottom_mlp), "top_mlp": list(m.dense.top_mlp),
                    "interaction": m.dense.interaction},
                "sharding_types": sorted({ts.sharding_type.value for ts in self.shardings}),
                "processes": self.world, "local_world_size": self.local_world,
                "steps": self.steps, "warmup": self.warmup, "timeout_s": self.timeout_s,
                "backend": self.backend, "heap": self.heap, "seed": self.seed,
                "host_probe": self.host_probe}

    def rank_main(self, rank: int, port: int, progress, report, state: dict) -> dict:
        """The rank's run (called by :func:`planner.measure.validate.worker.worker_main`)."""
        return run_rank(rank, self, port, progress, report, state)


def load_dlrm_config(plan_path: str, *, tables: str | None = None, nproc: int | None = None,
                     batch_size: int | None = None, **kw) -> DLRMRunConfig:
    """Read the plan and its tables, check what a CPU run supports, export to TorchRec."""
    doc = read_json_file(plan_path, field="PLAN", missing_fix="check the path",
                         json_fix="pass a plan written by `clusterplan plan TABLES --out`")
    model = plan_model(doc, plan_path, tables)
    devices = int(doc.get("devices") or 0)
    if nproc is not None and nproc != devices:
        raise SpecError(f"--nproc {nproc} but the plan is for {devices} devices",
                        field="--nproc", fix=f"pass --nproc {devices} (or re-plan)")
    if not 2 <= devices <= MAX_PROCESSES:
        raise SpecError(f"the plan has {devices} devices; validate runs 2 to {MAX_PROCESSES} "
                        "processes", source=plan_path, field="devices",
                        fix="plan for 2-16 devices")
    if model.optimizer != "sgd":
        raise SpecError(f"optimizer {model.optimizer!r}: the real run trains with fused exact "
                        "SGD only", source=plan_path, field="task.optimizer",
                        fix="plan with --optimizer sgd")
    problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(devices)), devices)
    shardings = tuple(sorted(read_plan_json(doc, problem), key=lambda t: t.table))
    if [ts.table for ts in shardings] != list(range(model.num_tables)):
        raise SpecError("the plan does not place every table exactly once", source=plan_path,
                        field="shards", fix="re-plan with clusterplan plan")
    tr = export_torchrec_plan(doc, device="cpu")
    empty = empty_row_shards(tr)
    if empty:
        _fqn, name, k, rank = empty[0]
        raise empty_shard_error(name, rank, source=plan_path, field=f"shards.{name}")
    # a validation run keeps the plan's tables but may use a smaller batch
    b = batch_size if batch_size is not None else model.batch_size
    if b < devices or b % devices:
        raise SpecError(f"batch {b} does not split evenly over {devices} ranks",
                        field="--batch-size", fix=f"pass --batch-size as a multiple of {devices}")
    model = replace(model, batch_size=b)
    if model.dense is not None and model.dense.interaction == "dot":
        dims = {t.embedding_dim for t in model.tables}
        out = model.dense.bottom_mlp[-1] if model.dense.bottom_mlp else \
            model.dense.num_dense_features
        if dims != {out}:
            raise SpecError("the dot interaction needs every embedding_dim equal to the bottom "
                            f"MLP's output ({out}); the tables have {sorted(dims)}",
                            field="dense.interaction", fix="use interaction: dcnv2, or equal dims")
    return DLRMRunConfig(model=model, shardings=shardings, torchrec_plan=tr,
                         plan_source=str(plan_path), world=devices,
                         local_world=int(tr["local_world_size"]), **kw)
