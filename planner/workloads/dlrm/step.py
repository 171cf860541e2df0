"""One DLRM training step of a sharding plan, simulated with :mod:`simulator.engine`.

The step as a DAG on every rank (streams ``compute``, ``comm``, ``comm:dp``)::

    comm      ids all-to-all ─┐              ┌ pooled all-to-all ┐ [RW reduce-scatter]
    compute   bottom MLP fwd ─┼ lookups fwd ─┘                   └ interaction + top MLP fwd
                                                                     │
    compute   top MLP + interaction bwd ── bottom MLP bwd ── lookups bwd ── dense optimizer
    comm      grad all-to-all (reverse of pooled) ┘ [RW all-gather]           │
    comm:dp   dense all-reduce (after the MLP backward; overlaps the lookups backward) ┘
              [data-parallel tables' all-reduce after the lookups backward]

With the trainer's ``pipeline: sparse_dist`` (TorchRec's ``TrainPipelineSparseDist``, the
default) the ids all-to-all is the *next* batch's input dist: it shares the links with this
step's collectives but the lookups do not wait for it; ``pipeline: none`` makes them wait;
``input_dist: loader`` (each rank's loader reads its tables' ids) leaves it out. With
``bottom_mlp: rank0`` (DeepLearningExamples' PyTorch DLRM) rank 0 alone runs the bottom MLP on
the global batch before its lookups, its output joins rank 0's pooled all-to-all and comes
back as gradients before rank 0's bottom backward, and the dense all-reduce carries the top
part's gradients only, starting once the top backward is done.

All-to-alls carry the plan's uneven byte matrices (``splits``), so ranks with more pooled
output send more and every rank waits for the slowest, as in NCCL. Lookups are compute ops with
the analytic model's time (:mod:`planner.model.tables.cost`: bytes gathered at the device's
measured row-gather bandwidth, the optimizer's update of touched rows). The dense part is timed
op by op (:func:`planner.workloads.dlrm.dense.dense_pass_times`: every GEMM of the MLPs and
DCNv2 layers and both backward products on the measured GEMM curve, the elementwise ops on the
memory curve, each no faster than the host's dispatch when the trainer is eager), followed by
one fused optimizer step over the dense parameters. Collectives share the network with each
other, so the dense all-reduce competes with the gradient all-to-all for links.

With the model's ``a2a_compression`` (planner/model/tables/compression.py) the pooled all-to-all
(and, with ``backward``, the gradients') carries each table's bytes over its compression ratio
(the cost model's features, so the planners see it too), each sender compressing what it sends
and each receiver decompressing what it gets, as compute ops at the codec's calibrated
throughput (category ``compress``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from simulator.engine import simulate
from simulator.result import SimResult
from simulator.workload import Workload

from planner.model.tables.features import F_BWD, F_DP, F_FWD, F_HRS, F_RW
from planner.model.tables.plan import Plan
from planner.model.tables.shards import TableSharding
from planner.model.tables.task import Problem, prepare
from planner.workloads.dlrm.dense import mlp_flops
from planner.workloads.dlrm.torchrec import build_torchrec_step_workload
from planner.workloads.dlrm.torchrec_comms import torchrec_step_ops

__all__ = ["StepSimulation", "build_step_workload", "simulate_step", "simulate_plan"]

CATEGORIES = ("a2a", "emb_fwd", "emb_bwd", "mlp_fwd", "mlp_bwd", "rw_comm", "dense_allreduce",
              "dp_allreduce", "optimizer", "compress")


@dataclass
class StepSimulation:
    """Result of :func:`simulate_step`.

    Attributes
    ----------
    step_time_s : float
        Simulated time of one training step, seconds.
    breakdown_s : dict
        Per op category (``a2a``, ``emb_fwd``, ``emb_bwd``, ``mlp_fwd``, ``mlp_bwd``,
        ``rw_comm``, ``dense_allreduce``, ``dp_allreduce``): the busiest rank's summed op time,
        seconds (overlapped time counts in each category it overlaps).
    a2a_bytes : dict
        Total bytes of the ``input``, ``output_fwd`` and ``output_bwd`` all-to-alls.
    result : SimResult
    """

    step_time_s: float
    breakdown_s: dict
    a2a_bytes: dict
    result: SimResult


def build_step_workload(problem: Problem, shardings: Sequence[TableSharding]
                        ) -> tuple[Workload, dict[str, np.ndarray]]:
    """The step's :class:`Workload` and its all-to-all byte matrices (rank i → j)."""
    cm = problem.cost
    n = problem.devices
    F = cm.plan_features(shardings)
    mats = cm.a2a_matrices(F)
    d = problem.model.dense
    dtype = d.dtype if d is not None else "fp32"
    fl = mlp_flops(problem)
    dt = cm.dense_times()
    ranks = list(range(n))
    w = Workload(name=f"dlrm-step:{problem.model.name}")
    fixed_fwd, fixed_bwd = cm.call_s(F)          # each rank's fused lookup calls
    hbm = cm.hbm_Bps

    comp = problem.model.compression
    codec_f, codec_b = cm.plan_codec_s(shardings)

    def a2a(name: str, mat: np.ndarray, deps) -> int | None:
        if n < 2:
            return None
        return w.collective("alltoall", ranks, float(mat.sum(axis=1).max()), name=name,
                            splits=mat, deps=deps, stream="comm", category="a2a")

    def codec(what: str, seconds, deps) -> list[int]:
        """One codec op per rank (``seconds[r]``) after ``deps[r]`` (one op, or one per rank)."""
        return [w.compute(r, what, duration_s=float(seconds[r]),
                          deps=[deps[r] if isinstance(deps, list) else deps],
                          category="compress") for r in ranks]

    def dense(r: int, name: str, block: str, phase: str, flops: float, deps=None) -> int:
        return w.compute(r, name, flops=flops, dtype=dtype, deps=deps,
                         duration_s=dt.passes.get((block, phase), 0.0),
                         category=f"mlp_{phase}")

    # bottom_mlp: rank0 (DLE's PyTorch DLRM): rank 0 alone runs it on the global batch
    alone_fwd, alone_bwd, _ = cm.bottom_rank0_terms()
    alone = cm.bottom_on_rank0

    def bottom_op(r: int, phase: str, deps=None) -> int | None:
        if not fl["bottom"] or (alone and r != 0):
            return None
        if not alone:
            return dense(r, f"bottom_mlp_{phase}", "bottom", phase,
                         fl["bottom"] * (1 if phase == "fwd" else 2), deps)
        return w.compute(r, f"bottom_mlp_{phase}", deps=deps,
                         flops=fl["bottom"] * n * (1 if phase == "fwd" else 2), dtype=dtype,
                         duration_s=float((alone_fwd if phase == "fwd" else alone_bwd)[r]),
                         category=f"mlp_{phase}")

    # pipelined (TorchRec's TrainPipelineSparseDist): this all-to-all carries the next batch's
    # ids while this batch computes; it still loads the links, but no lookup waits for it
    ids = a2a("input_a2a", mats["input"], None) if mats["input"].any() else None
    look_deps = None if problem.model.trainer.pipelined or ids is None else [ids]
    bottom = [bottom_op(r, "fwd") for r in ranks]

    def lookups_after(r: int) -> list[int] | None:
        """The ids, and rank 0's lone bottom MLP, whose output leaves after its lookups."""
        deps = list(look_deps or []) + ([bottom[r]] if alone and bottom[r] is not None else [])
        return deps or None

    fwd = [w.compute(r, "lookups_fwd",
                     duration_s=float(F[r, F_FWD] - codec_f[r] + fixed_fwd[r]),
                     bytes_moved=float((F[r, F_FWD] - codec_f[r]) * hbm), deps=lookups_after(r),
                     category="emb_fwd") for r in ranks]
    # compressed: each sender compresses its pooled outputs, each receiver decompresses
    sent = codec("compress output_a2a_fwd", codec_f, fwd) if comp is not None else fwd
    out = a2a("output_a2a_fwd", mats["output_fwd"], sent)
    if comp is not None and out is not None:
        out = codec("decompress output_a2a_fwd", [cm.decompress_fwd_s] * n, out)
    rw_rs, host_rs = _row_wise_collectives(w, problem, F, "reducescatter", fwd)
    top_fwd, top_bwd, bottom_bwd, bwd = [], [], [], []
    for r in ranks:
        got = out[r] if isinstance(out, list) else out     # a rank's own decompression
        deps = [fwd[r]] + [x for x in (got, rw_rs, bottom[r], host_rs.get(
            problem.cost.host_of[r])) if x is not None]
        top_fwd.append(dense(r, "interaction_top_mlp_fwd", "top", "fwd", fl["top"], deps))
    for r in ranks:
        top_bwd.append(dense(r, "top_mlp_interaction_bwd", "top", "bwd", 2 * fl["top"],
                             [top_fwd[r]]))
    packed = comp is not None and comp.backward
    grad = a2a("output_a2a_bwd", mats["output_bwd"],
               codec("compress output_a2a_bwd", [cm.compress_bwd_s] * n, top_bwd)
               if packed else top_bwd)
    if packed and grad is not None:
        grad = codec("decompress output_a2a_bwd", codec_b, grad)
    rw_ag, host_ag = _row_wise_collectives(w, problem, F, "allgather", top_bwd)
    backs = [grad[r] if isinstance(grad, list) else grad for r in ranks]
    for r in ranks:              # rank 0's alone waits for its output's gradients to return
        after = [top_bwd[r]] + ([backs[r]] if alone and backs[r] is not None else [])
        op = bottom_op(r, "bwd", after)
        bottom_bwd.append(top_bwd[r] if op is None else op)
    for r in ranks:
        back = backs[r]
        deps = [bottom_bwd[r]] + [x for x in (back, rw_ag, host_ag.get(problem.cost.host_of[r]))
                                  if x is not None]
        bwd.append(w.compute(r, "lookups_bwd",
                             duration_s=float(F[r, F_BWD] - codec_b[r] + fixed_bwd[r]),
                             bytes_moved=float((F[r, F_BWD] - codec_b[r]) * hbm), deps=deps,
                             category="emb_bwd"))
    dense_ar = None
    params = cm.allreduced_dense_params()
    if params > 0 and n > 1:
        grad_bytes = params * problem.model.trainer.gradient_bytes(problem.model.dense.dtype)
        dense_ar = w.collective("allreduce", ranks, grad_bytes, name="dense_allreduce",
                                deps=top_bwd if alone else bottom_bwd, stream="comm:dp",
                                category="dense_allreduce")
    if F[0, F_DP] > 0 and n > 1:
        w.collective("allreduce", ranks, float(F[0, F_DP]), name="dp_tables_allreduce",
                     deps=bwd, stream="comm:dp", category="dp_allreduce")
    if dt.optimizer_s > 0:              # the dense optimizer step, once backward has returned
        for r in ranks:
            w.compute(r, "dense_optimizer", duration_s=dt.optimizer_s,
                      deps=[bwd[r]] + ([dense_ar] if dense_ar is not None else []),
                      category="optimizer")
    return w, mats


def _row_wise_collectives(w: Workload, problem: Problem, F: np.ndarray, kind: str,
                          after: list[int]) -> tuple[int | None, dict[int, int]]:
    """The row-wise tables' collective of ``kind`` (the pooled partial sums reduce-scattered
    forward, their gradients all-gathered backward) over every rank, and the table-row-wise
    tables' over each host's ranks, each after its ranks' ops in ``after``: the global op id
    (None without row-wise tables) and the per-host op ids."""
    ranks = list(range(problem.devices))
    short = {"reducescatter": "rs", "allgather": "ag"}[kind]
    everywhere = None
    if F[0, F_RW] > 0 and len(ranks) > 1:
        everywhere = w.collective(kind, ranks, float(F[0, F_RW]), name=f"rw_{kind}",
                                  deps=after, stream="comm", category="rw_comm")
    per_host = {}
    for h, members in enumerate(problem.hosts):
        size = float(F[members[0], F_HRS])
        if size > 0 and len(members) > 1:
            per_host[h] = w.collective(kind, members, size, name=f"twrw_{short}_h{h}",
                                       deps=[after[r] for r in members], stream="comm",
                                       category="rw_comm")
    return everywhere, per_host


def simulate_step(problem: Problem, shardings: Sequence[TableSharding], *,
                  mode: str = "explicit", comm: str = "model") -> StepSimulation:
    """Simulate one training step of ``shardings`` on the problem's topology.

    ``comm="model"``: the averaged all-to-alls above; ``comm="torchrec"``: the collectives
    TorchRec 1.8.0 issues for one seeded batch (:mod:`planner.workloads.dlrm.torchrec_comms`,
    checked call for call against real runs by ``clusterplan validate``)."""
    if comm == "torchrec":
        if problem.cost.bottom_on_rank0:
            raise ValueError("comm='torchrec' replays TorchRec's collectives, whose bottom MLP "
                             "is data-parallel; the trainer's bottom_mlp: rank0 needs "
                             "comm='model'")
        ops = torchrec_step_ops(problem, shardings)
        w = build_torchrec_step_workload(problem, shardings, ops)
        def sent(sel) -> np.ndarray:       # bytes between different ranks
            return np.array(sum(float(o.matrix.sum() - np.trace(o.matrix)) for o in ops
                                if o.matrix is not None and sel(o)))
        mats = {"input": sent(lambda o: o.phase == "fwd" and "pooled" not in o.name),
                "output_fwd": sent(lambda o: o.phase == "fwd" and "pooled" in o.name),
                "output_bwd": sent(lambda o: o.phase == "bwd")}
    elif comm == "model":
        w, mats = build_step_workload(problem, shardings)
    else:
        raise ValueError(f"comm must be 'model' or 'torchrec', not {comm!r}")
    res = simulate(problem.topology, w, mode=mode)
    per = res.per_device()
    breakdown = {}
    for cat in CATEGORIES:
        sel = per[per.category == cat]
        breakdown[cat] = float(sel.groupby("rank").duration_s.sum().max()) if len(sel) else 0.0
    return StepSimulation(step_time_s=res.step_time_s, breakdown_s=breakdown,
                          a2a_bytes={k: float(v.sum()) for k, v in mats.items()}, result=res)


def simulate_plan(plan: Plan, task) -> StepSimulation:
    """Simulate ``plan`` (made for ``task``, a :class:`~planner.model.tables.task.ShardingTask`)."""
    return simulate_step(prepare(task, plan.devices), plan.shardings)
