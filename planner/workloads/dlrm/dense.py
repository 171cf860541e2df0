"""The dense part of a DLRM step (bottom MLP, interaction, top MLP) as FLOPs per rank; its ops
and their times are :mod:`planner.model.tables.dense`'s."""

from __future__ import annotations

from planner.model.tables.task import Problem

__all__ = ["mlp_flops"]


def mlp_flops(problem: Problem) -> dict[str, float]:
    """FLOPs of one forward pass of the dense MLPs on one rank (``bottom``, ``top`` with the
    interaction) and the dense parameter count (``params``); zeros for a model without them."""
    d = problem.model.dense
    if d is None:
        return {"bottom": 0.0, "top": 0.0, "params": 0.0}
    dims = [t.embedding_dim for t in problem.model.tables]
    b = problem.cost.local_batch
    ls = d.layers(dims)
    bottom = sum(2.0 * b * i * o for i, o in ls["bottom"])
    top = sum(2.0 * b * i * o for i, o in ls["interaction"] + ls["top"])
    return {"bottom": bottom, "top": top, "params": float(d.param_count(dims))}
