"""The op graph of one DLRM training step with SPTT towers (:func:`build_sptt_workload`).

The flat step is :func:`planner.workloads.dlrm.step.build_step_workload` (a global id
all-to-all, lookups, a global pooled all-to-all over all ``N`` ranks). The SPTT step (papers.md
§3.2, the data flow of TorchRec's ``ShardedEmbeddingTowerCollection``) on ``H`` hosts × ``G``
GPUs, rank ``(h, g)``, local batch ``B``::

    forward
      1 ids, cross-host peers   cross_pg[g] (size H)  (h,g) → (t,g): tower-t ids of B samples
      2 ids, inside the host    intra_pg[t] (size G)  to the GPU owning each shard (H·B samples)
      3 lookups                 every GPU, its shards, H·B·G = global batch
      4 pooled, inside the host intra_pg[t]           (t,g) gets D_t values for its H·B samples
                                [row-wise tables: reduce-scatter inside the host]
      5 tower module            (t,g): f_t on H·B samples, D_t → D'_t
      6 return, cross-host      cross_pg[g]           (t,g) → (h,g): B × D'_t
      7 interaction + top MLP   every rank, its B samples, input Σ_t D'_t
    backward: 7 → 6 (gradients of the tower outputs back to (t,g)) → 5 (module backward; its
      weight gradient all-reduced inside the host, stream comm:tm) → 4 (pooled gradients to
      the shard owners) [row-wise: all-gather] → 3 (lookups backward); the dense all-reduce of
      the top/bottom MLPs over all N ranks as in the flat step.

Every exchange is one simulator all-to-all with its exact uneven byte matrix; the ``G``
cross-host collectives of one step (one per local index) and the ``H`` intra-host ones run
concurrently and share the network. Lookup times are the sharding cost model's for each host's
sub-plan; the tower module is a roofline-timed compute op with its FLOPs (backward 2×); the
MLPs are timed op by op and the trainer's pipelining applies as in the flat step, so the two
steps differ only in their exchanges and towers. :mod:`planner.workloads.dmt.step` simulates
it beside the flat step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from simulator.workload import Workload

from planner.model.dmt.layout import HostPlan, TowerLayout, host_groups
from planner.model.tables.features import F_BWD, F_FWD, F_RW
from planner.model.tables.spec import ModelSpec
from planner.model.tables.task import Problem, ShardingTask, prepare

__all__ = ["build_sptt_workload", "top_input_dims"]


def top_input_dims(model: ModelSpec, layout: TowerLayout) -> list[int]:
    """Embedding widths the interaction sees after the towers.

    ``dot``: the features must share one width ``d`` (the model's mean dim), so a tower of
    output width ``D'_t`` contributes ``ceil(D'_t / d)`` vectors of width ``d``; with identity
    modules this is the flat model's list. ``dcnv2``: the concatenation, so one entry per tower.
    """
    d = model.dense
    dims = [t.embedding_dim for t in model.tables]
    if layout.module.is_identity:
        return dims
    if d is not None and d.interaction == "dot":
        w = max(1, int(round(sum(dims) / len(dims))))
        out = []
        for tw in layout.towers:
            out += [w] * max(1, -(-tw.out_width // w))
        return out
    return [tw.out_width for tw in layout.towers]


def _mlp_flops(model: ModelSpec, dims: Sequence[int], local_batch: float) -> dict[str, float]:
    d = model.dense
    if d is None:
        return {"bottom": 0.0, "top": 0.0, "params": 0.0}
    ls = d.layers(list(dims))
    bottom = sum(2.0 * local_batch * i * o for i, o in ls["bottom"])
    top = sum(2.0 * local_batch * i * o for i, o in ls["interaction"] + ls["top"])
    return {"bottom": bottom, "top": top, "params": float(d.param_count(list(dims)))}


def _id_bytes_per_sample(model: ModelSpec, tables: Sequence[int], cfg) -> float:
    return float(sum(model.tables[t].pooling_factor * cfg.id_bytes + cfg.length_bytes
                     for t in tables))


def build_sptt_workload(task: ShardingTask, devices: int, layout: TowerLayout,
                        host_plans: Sequence[HostPlan]) -> tuple[Workload, dict]:
    """The SPTT step as a :class:`Workload` and its byte totals per exchange."""
    problem = prepare(task, devices)
    groups = host_groups(problem)
    H, G = len(groups), len(groups[0])
    if (H, G) != (layout.hosts, layout.gpus_per_host):
        raise ValueError(f"layout for {layout.hosts}×{layout.gpus_per_host}, problem {H}×{G}")
    sb = _SpttBuilder(problem, task.model, devices, layout, groups, host_plans)
    # 1 cross-host ids (B samples × tower ids to each peer)
    ids_x = sb.cross("ids_cross", sb.B * sb.ids_ps, lambda g: None)
    bottom = sb.bottom_mlp_fwd()
    tmf = sb.towers_fwd(ids_x)
    # 6 cross-host return of module outputs (B samples × D'_t to each peer)
    ret = sb.cross("pooled_cross_fwd", sb.B * sb.out_w * sb.obytes,
                   lambda g: [tmf[groups[h][g]] for h in range(H)])
    top_bwd = sb.top_mlp(tmf, ret, bottom)
    bottom_bwd = sb.bottom_mlp_bwd(top_bwd)
    grad_x = sb.cross("pooled_cross_bwd", sb.B * sb.out_w * sb.obytes,
                      lambda g: [top_bwd[groups[h][g]] for h in range(H)], transpose=True)
    sb.towers_bwd(top_bwd, bottom_bwd, grad_x)
    sb.optimizer(sb.last)
    return sb.w, sb.totals


class _SpttBuilder:
    """Adds the ops of one SPTT step to ``w`` (see the module docstring) and sums the bytes of
    each exchange in ``totals``. ``B``: samples per rank; per host ``h``: ``ids_ps[h]`` id
    bytes per sample, ``out_w[h]`` module output width, ``tm_flops[h]``, ``tm_params[h]``."""

    def __init__(self, problem: Problem, model: ModelSpec, devices: int, layout: TowerLayout,
                 groups, host_plans: Sequence[HostPlan]) -> None:
        H, G = len(groups), len(groups[0])
        self.groups, self.H, self.G, self.devices = groups, H, G, devices
        cfg = problem.cost.config
        self.obytes = problem.cost.out_bytes
        B = self.B = model.batch_size / devices
        dense = model.dense
        self.dtype = dense.dtype if dense is not None else "fp32"
        #: bytes per dense parameter gradient the all-reduces move (the trainer's)
        self.grad_bytes = model.trainer.gradient_bytes(self.dtype)
        self.fl = _mlp_flops(model, top_input_dims(model, layout), B)
        self.dt = problem.cost.dense_times_for(top_input_dims(model, layout))
        self.pipelined = model.trainer.pipelined
        tm = layout.module
        self.w = Workload(name=f"dlrm-sptt:{model.name}")
        self.totals = {"ids_cross": 0.0, "ids_intra": 0.0, "pooled_intra_fwd": 0.0,
                       "pooled_cross_fwd": 0.0, "pooled_cross_bwd": 0.0, "pooled_intra_bwd": 0.0,
                       "tm_params": 0.0}
        # per host: ids bytes per sample, module output width, module flops and params
        self.ids_ps = np.array([_id_bytes_per_sample(model, layout.host_tables(h), cfg)
                                for h in range(H)])
        self.out_w = np.array([sum(tw.out_width for tw in layout.host_towers(h))
                               for h in range(H)], dtype=float)
        self.tm_flops = [sum(tm.flops_fwd(tw.dims, samples=H * B) for tw in layout.host_towers(h))
                         for h in range(H)]
        self.tm_params = [sum(tm.param_count(tw.dims) for tw in layout.host_towers(h))
                          for h in range(H)]
        self.totals["tm_params"] = float(sum(self.tm_params))
        self.off = 1.0 - np.eye(H)
        self.sub = _host_subplans(host_plans, G)
        self.hbm = problem.cost.hbm_Bps
        self.last: dict = {}            # per rank: its last backward op (lookups backward)
        self.dense_ar = None

    def cross(self, name: str, per_dest: np.ndarray, deps_of, *, transpose: bool = False):
        """One all-to-all per local index g over the cross-host group; ``per_dest[h']`` is what
        each rank sends to host h' (its peer there); ``transpose``: the reverse direction."""
        H, G, groups = self.H, self.G, self.groups
        ops = []
        mat = per_dest[None, :] * self.off
        if transpose:
            mat = mat.T.copy()
        if H < 2:
            return [None] * G
        for g in range(G):
            ranks = [groups[h][g] for h in range(H)]
            ops.append(self.w.collective("alltoall", ranks, float(mat.sum(axis=1).max()),
                                         name=f"{name}_g{g}", splits=mat, deps=deps_of(g),
                                         stream="comm", category="a2a_cross"))
        totals_key = {"ids_cross": "ids_cross", "pooled_cross_fwd": "pooled_cross_fwd",
                      "pooled_cross_bwd": "pooled_cross_bwd"}[name]
        self.totals[totals_key] += float(mat.sum()) * G
        return ops

    def intra(self, name: str, key: str, h: int, deps, total_key: str):
        """The all-to-all ``key`` of host ``h``'s sub-plan inside the host (None: nothing)."""
        if self.sub[h] is None or self.G < 2:
            return None
        mat = self.sub[h][2][key]
        self.totals[total_key] += float(mat.sum())
        return self.w.collective("alltoall", self.groups[h], float(mat.sum(axis=1).max()),
                                 name=f"{name}_h{h}", splits=mat, deps=deps, stream="comm",
                                 category="a2a_intra")

    def lookup_time(self, h: int, i: int, col: int) -> float:
        """Seconds of feature ``col`` (lookups forward or backward) of local rank ``i`` of
        host ``h`` in its sub-plan (0 without one)."""
        if self.sub[h] is None:
            return 0.0
        sp, F, _ = self.sub[h]
        return float(F[i, col])

    def fixed_time(self, h: int, i: int, col: int) -> float:
        """Fixed seconds of local rank ``i``'s lookup calls on host ``h`` (forward launches or
        backward calls, one per lookup group it holds; 0 without a sub-plan)."""
        if self.sub[h] is None:
            return 0.0
        sp, F, _ = self.sub[h]
        fwd, bwd = sp.cost.call_s(F)
        return float((fwd if col == F_FWD else bwd)[i])

    def _row_wise_bytes(self, h: int) -> float:
        """Bytes of host ``h``'s row-wise reduce-scatter (forward) and all-gather (backward);
        0 when it has none."""
        if self.sub[h] is not None and self.sub[h][1][0, F_RW] > 0 and self.G > 1:
            return float(self.sub[h][1][0, F_RW])
        return 0.0

    def bottom_mlp_fwd(self) -> dict:
        """The bottom MLP's forward on every rank (when it has any FLOPs): op id per rank."""
        bottom = {}
        for h in range(self.H):
            for r in self.groups[h]:
                if self.fl["bottom"]:
                    bottom[r] = self.dense(r, "bottom_mlp_fwd", ("bottom", "fwd"),
                                           self.fl["bottom"])
        return bottom

    def towers_fwd(self, ids_x: list) -> dict:
        """Steps 2-5 on every host: ids inside the host, lookups, pooled embeddings to the
        tower owners (row-wise: reduce-scatter), the tower module; its op id per rank."""
        w, fwd, tmf = self.w, {}, {}
        for h in range(self.H):
            mem = self.groups[h]
            d1 = [x for x in ids_x if x is not None]
            ids_i = self.intra("ids_intra", "input", h, d1, "ids_intra")
            for i, r in enumerate(mem):
                t = self.lookup_time(h, i, F_FWD)
                deps = [ids_i] if ids_i is not None else d1
                if self.pipelined:      # the next batch's input dist (see the flat step)
                    deps = None
                fwd[r] = w.compute(r, "lookups_fwd",
                                   duration_s=t + self.fixed_time(h, i, F_FWD) if t else 0.0,
                                   bytes_moved=t * self.hbm, deps=deps, category="emb_fwd")
            out_i = self.intra("pooled_intra_fwd", "output_fwd", h, [fwd[r] for r in mem],
                               "pooled_intra_fwd")
            rs_i, rw = None, self._row_wise_bytes(h)
            if rw:
                rs_i = w.collective("reducescatter", mem, rw,
                                    name=f"rw_rs_h{h}", deps=[fwd[r] for r in mem],
                                    stream="comm", category="rw_comm")
            for r in mem:
                deps = [fwd[r]] + [x for x in (out_i, rs_i) if x is not None]
                tmf[r] = w.compute(r, "tower_module_fwd", flops=self.tm_flops[h],
                                   dtype=self.dtype, deps=deps, category="tm_fwd") \
                    if self.tm_flops[h] else \
                    w.compute(r, "tower_gather", duration_s=0.0, deps=deps, category="tm_fwd")
        return tmf

    def top_mlp(self, tmf: dict, ret: list, bottom: dict) -> dict:
        """Step 7 and its backward on every rank: the interaction and top MLP forward and
        backward; the backward's op id per rank."""
        top_fwd, top_bwd = {}, {}
        fl = self.fl
        for h in range(self.H):
            for g, r in enumerate(self.groups[h]):
                deps = [tmf[r]] + [x for x in (ret[g], bottom.get(r)) if x is not None]
                top_fwd[r] = self.dense(r, "interaction_top_mlp_fwd", ("top", "fwd"),
                                        fl["top"], deps)
                top_bwd[r] = self.dense(r, "top_mlp_interaction_bwd", ("top", "bwd"),
                                        2 * fl["top"], [top_fwd[r]])
        return top_bwd

    def bottom_mlp_bwd(self, top_bwd: dict) -> dict:
        """The bottom MLP's backward on every rank and the dense all-reduce over all ranks;
        the op each rank's tower backward waits for, per rank."""
        bottom_bwd = {}
        fl = self.fl
        for h in range(self.H):
            for r in self.groups[h]:
                # issued before the tower backward so that, as in the flat step, the dense
                # all-reduce can start while the tower gradients travel
                bottom_bwd[r] = (self.dense(r, "bottom_mlp_bwd", ("bottom", "bwd"),
                                            2 * fl["bottom"], [top_bwd[r]])
                                 if fl["bottom"] else top_bwd[r])
        self.dense_ar = None
        if fl["params"] > 0 and self.devices > 1:
            self.dense_ar = self.w.collective(
                "allreduce", list(range(self.devices)), fl["params"] * self.grad_bytes,
                name="dense_allreduce", deps=list(bottom_bwd.values()), stream="comm:dp",
                category="dense_allreduce")
        return bottom_bwd

    def dense(self, r: int, name: str, key: tuple, flops: float, deps=None) -> int:
        """A dense pass on rank ``r`` timed op by op (the flat step's model, same trainer)."""
        return self.w.compute(r, name, flops=flops, dtype=self.dtype, deps=deps,
                              duration_s=self.dt.passes.get(key, 0.0), category=f"mlp_{key[1]}")

    def optimizer(self, last: dict) -> None:
        """The dense optimizer step on every rank once its backward has returned."""
        if self.dt.optimizer_s <= 0:
            return
        extra = [self.dense_ar] if self.dense_ar is not None else []
        for r, op in last.items():
            self.w.compute(r, "dense_optimizer", duration_s=self.dt.optimizer_s,
                           deps=[op] + extra, category="optimizer")

    def towers_bwd(self, top_bwd: dict, bottom_bwd: dict, grad_x: list) -> None:
        """Steps 5-3 backward on every host: the tower module (its weight gradient all-reduced
        in the host), pooled gradients to the shard owners (row-wise: all-gather), lookups."""
        w, dtype = self.w, self.dtype
        for h in range(self.H):
            mem = self.groups[h]
            tmb = {}
            for g, r in enumerate(mem):
                deps = [top_bwd[r]] + ([grad_x[g]] if grad_x[g] is not None else [])
                tmb[r] = w.compute(r, "tower_module_bwd", flops=2 * self.tm_flops[h],
                                   dtype=dtype, deps=deps, category="tm_bwd") \
                    if self.tm_flops[h] else \
                    w.compute(r, "tower_scatter", duration_s=0.0, deps=deps, category="tm_bwd")
            if self.tm_params[h] and self.G > 1:
                w.collective("allreduce", mem, self.tm_params[h] * self.grad_bytes,
                             name=f"tm_allreduce_h{h}",
                             deps=[tmb[r] for r in mem], stream="comm:tm",
                             category="tm_allreduce")
            gi = self.intra("pooled_intra_bwd", "output_bwd", h, [tmb[r] for r in mem],
                            "pooled_intra_bwd")
            ag, rw = None, self._row_wise_bytes(h)
            if rw:
                ag = w.collective("allgather", mem, rw, name=f"rw_ag_h{h}",
                                  deps=[tmb[r] for r in mem], stream="comm", category="rw_comm")
            for i, r in enumerate(mem):
                t = self.lookup_time(h, i, F_BWD)
                deps = [bottom_bwd[r], tmb[r]] + [x for x in (gi, ag) if x is not None]
                self.last[r] = w.compute(r, "lookups_bwd",
                                         duration_s=t + self.fixed_time(h, i, F_BWD)
                                         if t else 0.0,
                                         bytes_moved=t * self.hbm, deps=deps, category="emb_bwd")


def _host_subplans(host_plans: Sequence[HostPlan], G: int) -> list:
    """Per host: None without a sub-plan, else its prepared problem on the ``G`` local ranks,
    its per-rank features and its all-to-all byte matrices."""
    sub = []
    for hp in host_plans:
        if hp.plan is None:
            sub.append(None)
            continue
        sp = prepare(hp.task, G)
        F = sp.cost.plan_features(hp.plan.shardings)
        sub.append((sp, F, sp.cost.a2a_matrices(F)))
    return sub
