"""TorchRec's own ``EmbeddingShardingPlanner``, run for real, as a baseline planner.

The task becomes TorchRec's inputs (formats.md §2.4–2.8):

- one ``EmbeddingBagConfig`` per table (rows, dim, fp32/fp16/bf16, one feature named after the
  table) in an ``EmbeddingBagCollection`` on the ``meta`` device, each weight tagged with the
  task's optimizer class so TorchRec counts its state (SGD 0, Adam 2×, Adagrad 1×, row-wise
  Adagrad 1/dim);
- ``ParameterConstraints`` per table: its pooling factor, the sharding types the task and the
  table allow (intersected with what TorchRec's sharder offers on the device: on CPU only
  data-parallel, table-wise, column-wise and table-column-wise), kernels ``fused`` (and
  ``dense`` where data-parallel is allowed) — never UVM or key-value, which clusterplan does
  not model — and ``min_partition`` when given;
- ``Topology(world_size=N, compute_device="cpu" on a CPU target else "cuda",
  local_world_size=ranks per host, hbm_cap / ddr_cap = the task's memory per device)`` with
  TorchRec's default bandwidths (``bandwidths="default"``) or the ones clusterplan knows for the
  target (``"calibrated"``: the CPU profile's lookup and gloo bandwidths, or the GPU's HBM and
  the fitted all-to-all bandwidths), and a 0% storage reservation;
- TorchRec's enumerator and perf estimator, with shard storage charged as clusterplan's memory
  model does (``memory="clusterplan"``, the default: weights + optimizer state, so TorchRec plans
  against exactly the constraint every other planner is checked against; the pipeline's input
  and output buffers, which TorchRec also counts, are what the HBM reserve is for) or TorchRec's
  own storage estimate (``memory="torchrec"``, buffers included: tighter, may find no plan where
  the others do);
- ``batch_size`` = the global batch / N (TorchRec's is per rank).

TorchRec's ``ShardingPlan`` comes back as clusterplan layouts: ``table_wise`` as is,
``column_wise`` and ``table_column_wise`` as column-wise shards in TorchRec's order (one shard:
table-wise; two shards of a table on one rank stay two shards, as TorchRec runs them),
``row_wise`` / ``table_row_wise`` / ``data_parallel`` as such. The Plan is then costed and
memory-checked by clusterplan's model like any other, so measurement applies to it unchanged;
TorchRec's own estimate of its plan is kept in the notes. TorchRec's planner has no randomness:
the same task gives the same plan (the seed is recorded, not used).
"""

from __future__ import annotations

import logging
import time
import warnings

from simulator.errors import SpecError

from planner.model.tables.feasible import InfeasibleError
from planner.model.tables.memory import shard_memory_bytes
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import (
    Shard,
    ShardingType,
    TableSharding,
    data_parallel,
    table_wise,
)
from planner.model.tables.task import Problem, ShardingTask, prepare

__all__ = ["TorchRecPlanner", "torchrec_inputs", "from_torchrec_plan", "INSTALL_HINT",
           "CPU_SHARDING_TYPES"]

INSTALL_HINT = "install with `make setup-torchrec` (torch 2.13.0 CPU, fbgemm-gpu-cpu 1.8.0, " \
               "torchrec 1.8.0 --no-deps)"
#: what TorchRec's CPU sharder offers its planner (formats.md §2.10)
#: TorchRec's planner search stops after this many seconds when no time limit is given
DEFAULT_TIME_LIMIT_S = 300
CPU_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise")
_GPU_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise",
              "table_row_wise")
_OURS_TO_TR = {ShardingType.TABLE_WISE: ("table_wise",),
               ShardingType.COLUMN_WISE: ("column_wise", "table_column_wise"),
               ShardingType.ROW_WISE: ("row_wise",),
               ShardingType.TABLE_ROW_WISE: ("table_row_wise",),
               ShardingType.DATA_PARALLEL: ("data_parallel",)}
_TR_LOGGERS = ("torchrec", "torchrec.distributed", "torchrec.distributed.planner",
               "torchrec.distributed.planner.types", "torchrec.distributed.planner.planners",
               "torchrec.distributed.planner.stats")


def _tr_root_notice(record: logging.LogRecord) -> bool:
    """False for what TorchRec's plan validation logs on the root logger for every
    data-parallel table (it has no sharding spec, by design)."""
    return not str(record.msg).startswith("Sharding spec not found for ")


class _Quiet:
    """Silence TorchRec's loggers and Python warnings (the direct-Topology warning,
    deprecations), and its root-logger notice for each data-parallel table."""

    def __enter__(self):
        self.levels = {name: logging.getLogger(name).level for name in _TR_LOGGERS}
        for name in _TR_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        logging.getLogger().addFilter(_tr_root_notice)
        self.warn = warnings.catch_warnings()
        self.warn.__enter__()
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, *exc):
        self.warn.__exit__(*exc)
        logging.getLogger().removeFilter(_tr_root_notice)
        for name, lvl in self.levels.items():
            logging.getLogger(name).setLevel(lvl)


def _import_torchrec():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch  # noqa: F401
            import torchrec  # noqa: F401
            from torchrec.distributed.planner import planners  # noqa: F401
    except ImportError as exc:
        raise SpecError(f"the torchrec planner needs torch and torchrec ({exc.name or exc} is "
                        "missing)", source="--planner torchrec", fix=INSTALL_HINT) from None
    except Exception as exc:  # a broken install (fbgemm/torch mismatch) fails at import
        raise SpecError(f"torchrec does not import: {type(exc).__name__}: {exc}",
                        source="--planner torchrec", fix=INSTALL_HINT) from None


def _optimizer_class(name: str):
    import torch
    if name == "adam":
        return torch.optim.Adam
    if name == "adagrad":
        return torch.optim.Adagrad
    if name == "rowwise_adagrad":
        from torchrec.optim import RowWiseAdagrad
        return RowWiseAdagrad
    return torch.optim.SGD


def torchrec_inputs(problem: Problem, *, compute_device: str | None = None,
                    min_partition: int | None = None, bandwidths: str = "default"):
    """``(module, constraints, topology, batch_size, sharder)`` for TorchRec's planner."""
    _import_torchrec()
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    model = problem.model
    n = problem.devices
    device = compute_device or ("cpu" if problem.topology.gpu.name == "cpu" else "cuda")
    if device not in ("cpu", "cuda"):
        raise SpecError(f"compute device must be cpu or cuda, got {device!r}",
                        source="--planner torchrec", fix="use cpu or cuda")
    offered = CPU_SHARDING_TYPES if device == "cpu" else _GPU_TYPES
    dtypes = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}
    configs, constraints = [], {}
    for i, t in enumerate(model.tables):
        configs.append(EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings,
                                          embedding_dim=t.embedding_dim,
                                          feature_names=[t.name], data_type=dtypes[t.precision]))
        allowed = [tr for st in problem.allowed_types(i) for tr in _OURS_TO_TR[st]]
        types = [tr for tr in offered if tr in allowed]
        if problem.devices > 1 and len(problem.hosts) < 2:
            types = [tr for tr in types if tr not in ("table_row_wise",)]
        if not types:
            have = ", ".join(sorted(s.value for s in problem.allowed_types(i))) or "none"
            raise SpecError(f"table {t.name!r} allows only {have}, which TorchRec's {device} "
                            f"sharder does not offer ({', '.join(offered)})",
                            source=model.source or model.name, field=f"tables[{i}].sharding_types",
                            fix="allow table_wise or column_wise for it, or use another planner")
        kernels = ["fused"] + (["dense"] if "data_parallel" in types else [])
        constraints[t.name] = ParameterConstraints(
            sharding_types=types, compute_kernels=kernels,
            pooling_factors=[float(t.pooling_factor)], min_partition=min_partition)
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    opt = _optimizer_class(model.optimizer)
    for _, param in ebc.named_parameters():
        param._optimizer_classes = [opt]                 # what TorchRec reads for state size
    cap = int(min(problem.capacity_bytes))
    host = max(len(h) for h in problem.hosts)
    kw = {}
    if bandwidths == "calibrated":
        cm = problem.cost
        kw["hbm_mem_bw"] = kw["ddr_mem_bw"] = cm.hbm_Bps / 1000.0        # bytes per ms
        if n > 1:
            intra = cm.comm.intra_Bps
            inter = cm.comm.inter_Bps
            kw["intra_host_bw"] = (intra if intra != float("inf") else 1e15) / 1000.0
            kw["inter_host_bw"] = (inter if inter != float("inf") else intra) / 1000.0
    elif bandwidths != "default":
        raise SpecError(f"bandwidths must be default or calibrated, got {bandwidths!r}",
                        source="--planner torchrec", fix="use default or calibrated")
    with _Quiet():
        topology = Topology(world_size=n, compute_device=device, local_world_size=host,
                            hbm_cap=cap if device == "cuda" else None,
                            ddr_cap=cap if device == "cpu" else None, **kw)
    sharder = EmbeddingBagCollectionSharder()
    batch = max(1, int(round(model.batch_size / n)))
    return ebc, constraints, topology, batch, sharder


def from_torchrec_plan(problem: Problem, module_plan) -> tuple[list[TableSharding], list[str]]:
    """clusterplan layouts of TorchRec's per-table ``ParameterSharding`` map, and notes."""
    model = problem.model
    index = {t.name: i for i, t in enumerate(model.tables)}
    n = problem.devices
    host_size = max(len(h) for h in problem.hosts)
    out: list[TableSharding] = []
    notes: list[str] = []
    kinds: dict[str, int] = {}
    for name, ps in module_plan.items():
        if name not in index:
            raise ValueError(f"TorchRec planned unknown table {name!r}")
        i = index[name]
        t = model.tables[i]
        st = str(ps.sharding_type)
        kinds[f"{st}/{ps.compute_kernel}"] = kinds.get(f"{st}/{ps.compute_kernel}", 0) + 1
        shards = []
        if ps.sharding_spec is not None:
            for md in ps.sharding_spec.shards:
                rank = md.placement.rank() if hasattr(md.placement, "rank") else \
                    int(str(md.placement).split("/")[0].split(":")[1])
                r0, c0 = (int(x) for x in md.shard_offsets)
                rows, cols = (int(x) for x in md.shard_sizes)
                shards.append(Shard(int(rank), r0, c0, rows, cols))
        if st == "data_parallel":
            out.append(data_parallel(i, name, t.num_embeddings, t.embedding_dim, n))
        elif st == "table_wise":
            out.append(table_wise(i, name, t.num_embeddings, t.embedding_dim, shards[0].rank))
        elif st in ("column_wise", "table_column_wise"):
            shards.sort(key=lambda s: s.col_offset)
            if len(shards) == 1:
                out.append(table_wise(i, name, t.num_embeddings, t.embedding_dim,
                                      shards[0].rank))
            else:
                out.append(TableSharding(i, name, ShardingType.COLUMN_WISE, tuple(shards)))
        elif st == "row_wise":
            shards.sort(key=lambda s: s.row_offset)
            out.append(TableSharding(i, name, ShardingType.ROW_WISE, tuple(shards)))
        elif st == "table_row_wise":
            shards.sort(key=lambda s: s.row_offset)
            host = shards[0].rank // host_size if shards else 0
            out.append(TableSharding(i, name, ShardingType.TABLE_ROW_WISE, tuple(shards),
                                     host=host))
        else:
            raise ValueError(f"TorchRec chose {st} for {name!r}, which clusterplan does not model")
    notes.append("torchrec types/kernels: " + ", ".join(f"{v} {k}" for k, v in
                                                       sorted(kinds.items())))
    return out, notes


class TorchRecPlanner:
    """TorchRec's ``EmbeddingShardingPlanner`` (see the module docstring).

    Parameters
    ----------
    compute_device : {"cpu", "cuda"} or None
        None: ``cpu`` when the task's topology is a CPU one (the measured evaluation), else
        ``cuda`` with the task's HBM capacity.
    min_partition : int or None
        TorchRec's minimum column-wise shard width (None: TorchRec's default, 128, so dims ≤ 128
        are never split).
    bandwidths : {"default", "calibrated"}
        TorchRec's built-in bandwidths or those clusterplan's cost model uses for the target.
    memory : {"clusterplan", "torchrec"}
        Whose shard storage accounting the search uses (see the module docstring).
    """

    name = "torchrec"

    def __init__(self, *, compute_device: str | None = None, min_partition: int | None = None,
                 bandwidths: str = "default", memory: str = "clusterplan") -> None:
        if memory not in ("clusterplan", "torchrec"):
            raise SpecError(f"memory accounting must be clusterplan or torchrec, got {memory!r}",
                            source="--planner torchrec", fix="use clusterplan or torchrec")
        self.compute_device = compute_device
        self.min_partition = min_partition
        self.bandwidths = bandwidths
        self.memory = memory

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        ebc, constraints, topology, batch, sharder = torchrec_inputs(
            problem, compute_device=self.compute_device, min_partition=self.min_partition,
            bandwidths=self.bandwidths)
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.storage_reservations import (
            FixedPercentageStorageReservation,
        )
        t1 = time.perf_counter()
        try:
            with _Quiet():
                enumerator = None
                if self.memory == "clusterplan":
                    enumerator = _enumerator(problem, topology, batch, constraints)
                planner = EmbeddingShardingPlanner(
                    topology=topology, batch_size=batch, constraints=constraints,
                    enumerator=enumerator,
                    storage_reservation=FixedPercentageStorageReservation(0.0), debug=False,
                    timeout_seconds=max(1, int(time_limit_s)) if time_limit_s else
                    DEFAULT_TIME_LIMIT_S)
                sharding_plan = planner.plan(ebc, [sharder])
        except Exception as exc:
            if type(exc).__name__ == "PlannerError":
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no plan"
                raise InfeasibleError(f"TorchRec's planner found no plan: {first[:300]}",
                                      source=problem.model.source or problem.model.name,
                                      field="tables",
                                      fix="give the devices more memory (--memory), use more "
                                          "devices, or allow more sharding types") from None
            raise
        plan_s = time.perf_counter() - t1
        module_plan = sharding_plan.plan[""]
        shardings, notes = from_torchrec_plan(problem, module_plan)
        est = _torchrec_estimate_s(planner, devices)
        device = topology.compute_device
        notes.insert(0, f"TorchRec {device} planner, batch {batch} per rank, "
                        f"{self.bandwidths} bandwidths, {self.memory} memory accounting"
                     + (f", min_partition {self.min_partition}" if self.min_partition else ""))
        if est is not None:
            notes.append(f"TorchRec's own estimate of its plan: max rank {est * 1e3:.4f} ms")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, solver="torchrec", notes=tuple(notes),
                             timings_s=(("torchrec_plan", plan_s),))
        return make_plan(problem, shardings, self.name, stats)


def _enumerator(problem: Problem, topology, batch: int, constraints):
    """TorchRec's enumerator with its perf estimator and a storage estimator that charges each
    shard what clusterplan's memory model does (weights + optimizer state; data-parallel copies
    also their fp32 gradient) — the same accounting every other planner is checked against."""
    from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimatorFactory,
        EmbeddingStorageEstimator,
    )
    from torchrec.distributed.planner.types import Storage
    model = problem.model
    tables = {t.name: t for t in model.tables}
    cuda = topology.compute_device == "cuda"
    kinds = {"table_wise": ShardingType.TABLE_WISE, "column_wise": ShardingType.COLUMN_WISE,
             "table_column_wise": ShardingType.COLUMN_WISE, "row_wise": ShardingType.ROW_WISE,
             "table_row_wise": ShardingType.TABLE_ROW_WISE,
             "data_parallel": ShardingType.DATA_PARALLEL}

    class _ClusterplanStorage(EmbeddingStorageEstimator):
        def estimate(self, sharding_options, sharder_data_map=None) -> None:
            super().estimate(sharding_options, sharder_data_map)
            for so in sharding_options:
                t = tables.get(so.name)
                st = kinds.get(str(so.sharding_type))
                if t is None or st is None:
                    continue
                for sh in so.shards:
                    rows, cols = int(sh.size[0]), int(sh.size[1])
                    b = int(shard_memory_bytes(t, rows, cols, st, model.optimizer))
                    sh.storage = Storage(hbm=b if cuda else 0, ddr=0 if cuda else b)

    perf = EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topology,
                                                constraints=constraints)
    return EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=constraints,
                               estimator=[perf, _ClusterplanStorage(topology=topology,
                                                                    constraints=constraints)])


def _torchrec_estimate_s(planner, devices: int) -> float | None:
    """TorchRec's rating of its best plan: max over ranks of summed ``perf.total`` (ms → s)."""
    best = getattr(planner, "_best_plan", None)
    if not best:
        return None
    per = [0.0] * devices
    for opt in best:
        for sh in opt.shards:
            if sh.rank is not None and sh.perf is not None:
                per[sh.rank] += float(sh.perf.total)
    return max(per) / 1e3
