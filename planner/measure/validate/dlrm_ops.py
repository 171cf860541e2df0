"""The collectives a DLRM run issues for one step's batch: the seeded batch itself, the dense
parameters DDP reduces, and TorchRec's calls for both (what the real run is compared with)."""

from __future__ import annotations

import numpy as np

from planner.model.tables.ids import table_ids
from planner.workloads.dlrm.torchrec_comms import torchrec_comm_ops

__all__ = ["step_batch", "dense_param_sizes", "expected_ops"]


def step_batch(cfg, step: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The global batch of ``step`` of ``cfg`` (a DLRM run config): per table its bag lengths (``batch_size``) and ids."""
    lengths, ids = [], []
    for i, t in enumerate(cfg.model.tables):
        x = table_ids(t, cfg.model.batch_size, seed=cfg.seed * 1009 + step, index=i)
        lengths.append(np.diff(x.offsets).astype(np.int64))
        ids.append(np.asarray(x.indices, dtype=np.int64))
    return lengths, ids


def dense_param_sizes(model) -> list[int]:
    """Bytes of the dense parameters in registration order (as the real run builds them)."""
    d = model.dense
    if d is None:
        return []
    dims = [t.embedding_dim for t in model.tables]
    ls = d.layers(dims)
    out = []
    for i, o in ls["bottom"]:
        out += [i * o * 4, o * 4]
    if d.interaction != "dot":
        top_in = ls["top"][0][0]
        out += [top_in * d.dcn_projection * 4] * d.dcn_layers          # u
        out += [d.dcn_projection * top_in * 4] * d.dcn_layers          # v
        out += [top_in * 4] * d.dcn_layers                             # biases
    for i, o in ls["top"]:
        out += [i * o * 4, o * 4]
    return out


def expected_ops(cfg, step: int):
    """TorchRec's collectives for ``step``'s batch of ``cfg`` (a
    :class:`~planner.measure.validate.dlrm.DLRMRunConfig`), as the simulator models them."""
    lengths, ids = step_batch(cfg, step)
    return torchrec_comm_ops(cfg.shardings, [t.embedding_dim for t in cfg.model.tables],
                             lengths, ids, world=cfg.world, local_world=cfg.local_world,
                             dense_param_sizes=dense_param_sizes(cfg.model), rebuilt=step >= 1)
