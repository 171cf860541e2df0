"""Run a tower layout with TorchRec's own ``ShardedEmbeddingTowerCollection`` (gloo, CPU).

TorchRec 1.8.0's tower sharding runs on CPU processes with gloo when the sharder gets
``device=None``: with ``device=cpu`` it passes ``device_ids=[cpu]`` to the towers'
``DistributedDataParallel``, which refuses CPU modules. Its interaction module must hold a
parameter (DDP refuses a module without one), so the identity here is ``x · one`` with a
learnable scalar ``one = 1``. ``LOCAL_WORLD_SIZE`` sets the ranks per host (TorchRec's
``intra_and_cross_node_pg``).

:func:`run_torchrec_towers` spawns the processes, builds the ``EmbeddingTowerCollection`` of the
export's towers (:mod:`planner.export.dmt`), shards it with the exported ``ParameterSharding``
s, copies seeded full weights into the local shards, runs one forward pass on each rank's seeded
ids and returns TorchRec's output beside a local reference (the same weights, sum pooling,
towers concatenated by host, then tower index — TorchRec's output order).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from planner.export.dmt import to_parameter_shardings
from planner.measure.dmt.spawn import spawn_gloo
from planner.measure.runner import init_group

__all__ = ["run_torchrec_towers"]


def _worker(rank: int, payload, rdzv: str, outdir: str, timeout_s: float) -> None:
    doc, tables, world, per_host, batch, seed = payload
    os.environ["LOCAL_WORLD_SIZE"] = str(per_host)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        init_group("gloo", rank, world, rdzv, timeout_s)
        out, ref = _forward(rank, doc, tables, batch, seed, torch, dist)
        np.savez(Path(outdir) / f"rank{rank}.npz", out=out, ref=ref)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:
        (Path(outdir) / f"rank{rank}.err").write_text(f"{type(exc).__name__}: {exc}")
        raise


def _forward(rank, doc, tables, batch, seed, torch, dist):
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embedding_tower_sharding import EmbeddingTowerCollectionSharder
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


    class _Identity(torch.nn.Module):
        """The tower's pooled embeddings by key in the tower's table order (the sharded
        collection's KeyedTensor lists its keys in shard order), times a parameter of 1."""

        def __init__(self, keys) -> None:
            super().__init__()
            self.keys = list(keys)
            self.one = torch.nn.Parameter(torch.ones(()))

        def forward(self, kt):
            return torch.cat([kt[k] for k in self.keys], 1) * self.one

    gen = torch.Generator().manual_seed(seed)
    weights = {name: torch.randn(rows, dim, generator=gen) for name, (rows, dim, _) in
               tables.items()}
    towers = [EmbeddingTower(EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=t, embedding_dim=tables[t][1], num_embeddings=tables[t][0],
                           feature_names=[f"f_{t}"]) for t in tw]),
        _Identity([f"f_{t}" for t in tw]))
        for tw in doc["towers"]]
    etc = EmbeddingTowerCollection(towers)
    plan = to_parameter_shardings(doc, device_type="cpu")
    for p in plan.values():
        p.compute_kernel = "dense"
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = EmbeddingTowerCollectionSharder().shard(etc, plan, env, None)
    with torch.no_grad():
        for key, t in sharded.state_dict().items():
            if isinstance(t, ShardedTensor):
                name = key.split(".")[-2]
                for sh in t.local_shards():
                    o, s = sh.metadata.shard_offsets, sh.metadata.shard_sizes
                    sh.tensor.copy_(weights[name][o[0]:o[0] + s[0], o[1]:o[1] + s[1]])
    names = [t for tw in doc["towers"] for t in tw]
    rng = np.random.default_rng(seed * 1000 + rank)
    lengths, values = [], []
    for t in names:
        ln = rng.poisson(tables[t][2], size=batch)
        lengths.append(ln)
        values.append(rng.integers(0, tables[t][0], size=int(ln.sum())))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{t}" for t in names], values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths)))
    out = sharded(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    pooled = {}
    for t, ln, v in zip(names, lengths, values):
        off = np.concatenate([[0], np.cumsum(ln)])
        pooled[t] = torch.stack([weights[t][torch.from_numpy(v[off[i]:off[i + 1]])].sum(0)
                                 for i in range(batch)])
    # TorchRec concatenates by host, then tower order within the host
    order = sorted(range(len(doc["towers"])), key=lambda k: (doc["tower_hosts"][k], k))
    ref = torch.cat([pooled[t] for k in order for t in doc["towers"][k]], 1)
    return out.detach().numpy(), ref.numpy()


def run_torchrec_towers(doc: dict, tables: dict, *, world: int, per_host: int, batch: int = 8,
                        seed: int = 0, timeout_s: float = 150.0) -> list[dict]:
    """Per rank ``{out, ref}``: TorchRec's tower output and the local reference.

    ``doc`` is :func:`planner.export.dmt.tower_sharding_plan`'s output; ``tables`` maps each
    table name to ``(rows, dim, mean pooling)``.
    """
    return spawn_gloo(_worker, world, (doc, tables, world, per_host, batch, seed),
                      timeout_s=timeout_s)
