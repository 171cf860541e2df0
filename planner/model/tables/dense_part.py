"""The dense part of a DLRM step as the embedding cost model sees it: the MLPs and interaction
on one rank, op by op, their gradients' all-reduce, and a bottom MLP that rank 0 alone runs on
the global batch (the trainer's ``bottom_mlp: rank0``, DeepLearningExamples' PyTorch DLRM).

:class:`DensePart` is a base of :class:`~.cost.CostModel` and reads its attributes: ``model``,
``topo``, ``n``, ``batch`` and ``local_batch`` (samples), ``profile`` (the GPU's compute
profile), ``comm``, ``out_bytes`` (bytes per pooled element), ``bottom_on_rank0``, and the
caches ``_dense_times`` and ``_bottom_rank0`` (None until first asked).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.model.llm.host import host_overhead_for
from planner.model.tables.dense import DenseTimes, dense_pass_times

__all__ = ["DensePart"]


class DensePart:
    """Dense-part costs of one model on ``n`` ranks, seconds (module docstring)."""

    def dense_times(self) -> DenseTimes:
        """The dense part on one rank, op by op (:func:`~.dense.dense_pass_times`), with the
        host floor of eager dispatch on a GPU unless the trainer says ``dispatch: graphs``."""
        if self._dense_times is None:
            self._dense_times = self.dense_times_for([t.embedding_dim for t in self.model.tables])
        return self._dense_times

    def bottom_rank0_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per rank, what running the bottom MLP on rank 0 alone adds (trainer ``bottom_mlp:
        rank0``; zeros otherwise): its forward and backward seconds on the whole global batch
        (rank 0's lookup phases: it runs where the lookups run, before the pooled all-to-all
        and after the gradients' return) and the bytes per sample it sends each peer in the
        pooled all-to-all (its output, ``bottom width × o``)."""
        if self._bottom_rank0 is None:
            z = np.zeros(self.n)
            fwd, bwd, sent = z.copy(), z.copy(), z.copy()
            if self.bottom_on_rank0:
                dt = self.dense_times_for([t.embedding_dim for t in self.model.tables],
                                          batch=self.batch)
                fwd[0] = dt.passes.get(("bottom", "fwd"), 0.0)
                bwd[0] = dt.passes.get(("bottom", "bwd"), 0.0)
                sent[0] = self.model.dense.bottom_mlp[-1] * self.out_bytes
            self._bottom_rank0 = (fwd, bwd, sent)
        return self._bottom_rank0

    def allreduced_dense_params(self) -> int:
        """Dense parameters whose gradients the data-parallel all-reduce moves: all of them,
        or without the bottom MLP's when rank 0 alone runs it."""
        d = self.model.dense
        if d is None:
            return 0
        dims = [t.embedding_dim for t in self.model.tables]
        n = d.param_count(dims)
        if self.bottom_on_rank0:
            n -= sum(i * o + o for i, o in d.layers(dims)["bottom"])
        return n

    def dense_times_for(self, dims: Sequence[int], batch: float | None = None) -> DenseTimes:
        """:meth:`dense_times` with the interaction fed by pooled widths ``dims`` (a tower
        layout's outputs instead of the tables'), for ``batch`` samples (default: a rank's)."""
        gpu = self.topo.gpu.name
        eager = self.model.trainer.dispatch == "eager" and gpu != "cpu"
        ew = self.model.trainer.elementwise_bytes if gpu != "cpu" else None
        return dense_pass_times(self.model.dense, list(dims),
                                self.local_batch if batch is None else batch,
                                optimizer=self.model.optimizer, profile=self.profile,
                                host=host_overhead_for(gpu) if eager else None,
                                elementwise_bytes=ew,
                                fused=self.model.trainer.fused and gpu != "cpu",
                                gemm_interaction=self.model.trainer.gemm_interaction,
                                sorted_index_put=gpu != "cpu",
                                a2a_copy_bytes=self._a2a_copy_bytes(dims))

    def _a2a_copy_bytes(self, dims: Sequence[int]) -> float:
        """Bytes per sample that the trainer's ``output_dist: per_peer`` copies each way: the
        pooled widths ``dims`` and a bottom output that rides the all-to-all, at ``o``."""
        if self.model.trainer.output_dist != "per_peer" or self.n == 1:
            return 0.0
        bottom = self.model.dense.bottom_mlp[-1] if self.bottom_on_rank0 else 0
        return (sum(dims) + bottom) * self.out_bytes

    def dense_costs(self) -> dict[str, float]:
        """Rank-independent dense part of a step, seconds: ``mlp_fwd_s``, ``mlp_bwd_s`` (op by
        op, :meth:`dense_times`; without a bottom MLP that rank 0 alone runs, which
        :meth:`bottom_rank0_terms` prices), ``optimizer_s`` and ``dense_allreduce_s`` (the
        all-reduced gradients at the trainer's :meth:`~.trainer.DlrmTrainer.gradient_bytes`)."""
        d = self.model.dense
        if d is None:
            return {"mlp_fwd_s": 0.0, "mlp_bwd_s": 0.0, "optimizer_s": 0.0,
                    "dense_allreduce_s": 0.0}
        dt = self.dense_times()
        on_every_rank = {k: v for k, v in dt.passes.items()
                         if not (self.bottom_on_rank0 and k[0] == "bottom")}
        fwd = sum(v for (_, ph), v in on_every_rank.items() if ph == "fwd")
        bwd = sum(v for (_, ph), v in on_every_rank.items() if ph == "bwd")
        grad = self.allreduced_dense_params() * self.model.trainer.gradient_bytes(d.dtype)
        ar = float(self.comm.time("allreduce", grad)) if self.n > 1 else 0.0
        return {"mlp_fwd_s": fwd, "mlp_bwd_s": bwd, "optimizer_s": dt.optimizer_s,
                "dense_allreduce_s": ar}
