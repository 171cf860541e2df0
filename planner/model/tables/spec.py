"""Embedding-model specs for sharding, as dataclasses: tables (:class:`TableSpec`), the dense
part (:class:`DenseSpec`), and the model with its batch size, optimizer and trainer
(:class:`ModelSpec`). Reading them from a YAML file, a CSV of tables or a built-in name, and the
formats, are :mod:`planner.model.tables.spec_file`'s.

**Reuse bins** are dlrm_datasets' (and NeuroShard's) 17 features: over the distinct rows a
batch touches, the fraction whose access count lies in (0,1], (1,2], (2,4], …, (2^14, 2^15] and
(2^15, ∞). They sum to 1 (all zeros: an unused table).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from simulator.errors import SpecError

from planner.model.tables.compression import A2ACompression
from planner.model.tables.shards import ShardingType
from planner.model.tables.trainer import DlrmTrainer

__all__ = ["TableSpec", "DenseSpec", "ModelSpec", "PRECISION_BYTES", "OPTIMIZERS",
           "INTERACTIONS", "NUM_REUSE_BINS", "DEFAULT_BATCH"]

PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
OPTIMIZERS = ("sgd", "adam", "adagrad", "rowwise_adagrad")
INTERACTIONS = ("dot", "dcnv2")
NUM_REUSE_BINS = 17
DEFAULT_BATCH = 65536


@dataclass(frozen=True, slots=True, kw_only=True)
class TableSpec:
    """One embedding table.

    Attributes
    ----------
    name : str
    num_embeddings : int
        Rows (hash size).
    embedding_dim : int
        Columns.
    pooling_factor : float
        Mean ids looked up per sample (multi-hot size).
    reuse_bins : tuple of 17 float, or None
        Row-weighted reuse histogram (see the module docstring).
    zipf_exponent : float or None
        Alternative access distribution: row ``i`` (1-based) is drawn with probability
        ∝ ``i ** -zipf_exponent``.
    precision : str
        Weight precision: fp32, fp16 or bf16.
    sharding_types : tuple of ShardingType, or None
        Types this table may use (None: any).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    reuse_bins: tuple[float, ...] | None = None
    zipf_exponent: float | None = None
    precision: str = "fp32"
    sharding_types: tuple[ShardingType, ...] | None = None

    @property
    def bytes_per_element(self) -> int:
        return PRECISION_BYTES[self.precision]

    @property
    def weight_bytes(self) -> int:
        """rows × dim × precision, bytes."""
        return self.num_embeddings * self.embedding_dim * self.bytes_per_element

    def allows(self, t: ShardingType) -> bool:
        return self.sharding_types is None or t in self.sharding_types


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseSpec:
    """The dense part of a DLRM: bottom MLP, interaction, top MLP (sizes are layer widths)."""

    num_dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    interaction: str = "dot"
    dcn_layers: int = 3
    dcn_projection: int = 512
    dtype: str = "fp32"

    def layers(self, embedding_dims: Sequence[int]) -> dict[str, list[tuple[int, int]]]:
        """(in, out) of every matrix per block: ``bottom``, ``interaction``, ``top``.

        ``dot`` interaction: pairwise dot products of the bottom output and the pooled
        embeddings (all of one width), F·(F−1)/2 features concatenated with the bottom output;
        modelled as one F×d by d×F product. ``dcnv2``: the concatenation of the bottom output
        and all embeddings through ``dcn_layers`` low-rank cross layers (two matrices each).
        """
        bottom, prev = [], self.num_dense_features
        for w in self.bottom_mlp:
            bottom.append((prev, w))
            prev = w
        b_out = prev
        f = len(embedding_dims) + 1
        inter: list[tuple[int, int]] = []
        if self.interaction == "dot":
            width = int(round(sum(embedding_dims) / max(1, len(embedding_dims)))) or b_out
            inter.append((width, f * f))        # F×F Gram matrix: F·F·d multiply-adds/sample
            top_in = f * (f - 1) // 2 + b_out
        else:
            top_in = b_out + sum(embedding_dims)
            for _ in range(self.dcn_layers):
                inter += [(top_in, self.dcn_projection), (self.dcn_projection, top_in)]
        top, prev = [], top_in
        for w in self.top_mlp:
            top.append((prev, w))
            prev = w
        return {"bottom": bottom, "interaction": inter, "top": top}

    def param_count(self, embedding_dims: Sequence[int]) -> int:
        """Weights and biases of the MLPs (and DCN layers); dot interaction has none."""
        ls = self.layers(embedding_dims)
        n = sum(i * o + o for i, o in ls["bottom"] + ls["top"])
        if self.interaction == "dcnv2":
            n += sum(i * o for i, o in ls["interaction"])
            n += self.dcn_layers * ls["interaction"][-1][1]          # cross-layer biases
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A recommendation model to shard: tables, optional dense part, batch, optimizer."""

    name: str
    tables: tuple[TableSpec, ...]
    dense: DenseSpec | None = None
    batch_size: int = DEFAULT_BATCH
    optimizer: str = "sgd"
    comm_precision: str = "fp32"
    source: str = ""
    description: str = ""
    trainer: DlrmTrainer = field(default_factory=DlrmTrainer)
    compression: A2ACompression | None = None      # the all-to-all's (compression.py)

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def total_weight_bytes(self) -> int:
        return sum(t.weight_bytes for t in self.tables)

    def canonical(self) -> dict:
        """The content that determines a plan, as plain JSON types (no source, no text)."""
        def tab(t: TableSpec) -> dict:
            return {"name": t.name, "num_embeddings": t.num_embeddings,
                    "embedding_dim": t.embedding_dim, "pooling_factor": t.pooling_factor,
                    "reuse_bins": list(t.reuse_bins) if t.reuse_bins is not None else None,
                    "zipf_exponent": t.zipf_exponent, "precision": t.precision,
                    "sharding_types": [s.value for s in t.sharding_types]
                    if t.sharding_types is not None else None}
        dense = None
        if self.dense is not None:
            d = self.dense
            dense = {"num_dense_features": d.num_dense_features, "bottom_mlp": list(d.bottom_mlp),
                     "top_mlp": list(d.top_mlp), "interaction": d.interaction,
                     "dcn_layers": d.dcn_layers, "dcn_projection": d.dcn_projection,
                     "dtype": d.dtype}
        doc = {"name": self.name, "batch_size": self.batch_size, "optimizer": self.optimizer,
               "comm_precision": self.comm_precision, "dense": dense,
               "tables": [tab(t) for t in self.tables]}
        if self.trainer != DlrmTrainer():       # hashes of specs without a trainer: unchanged
            doc["trainer"] = self.trainer.to_dict()
        if self.compression is not None:
            doc["a2a_compression"] = self.compression.to_dict()
        return doc

    def sha256(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def with_overrides(self, *, batch_size: int | None = None,
                       optimizer: str | None = None) -> "ModelSpec":
        kw: dict[str, Any] = {}
        if batch_size is not None:
            kw["batch_size"] = batch_size
        if optimizer is not None:
            if optimizer not in OPTIMIZERS:
                raise SpecError(f"unknown optimizer {optimizer!r}", source="--optimizer",
                                fix=f"use one of: {', '.join(OPTIMIZERS)}")
            kw["optimizer"] = optimizer
        return replace(self, **kw) if kw else self
