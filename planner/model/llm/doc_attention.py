"""Attention work of packed documents on each context-parallel rank (WLB-LLM §5.4).

A packed sequence carries document masks: a query attends only to earlier keys of its own
document. Context parallelism gives each of ``cp`` ranks two of ``2·cp`` chunks, ``i`` and
``2cp − 1 − i`` (Llama-3-style all-gather CP; rank ``i``'s kernel sees its queries and every key
before them):

``sequence``
    Chunks of the whole packed sequence: balanced for one document, not for many.
``document``
    Each document cut into ``2·cp`` chunks, rank ``i`` taking chunks ``i`` and ``2cp − 1 − i`` of
    every document: equal work everywhere, but short documents give short query chunks.

Work is counted in query-key pairs (one pair = ``4·head_dim`` FLOPs per head, forward). A flash
kernel computes whole tiles of 128 queries by 128 keys: a piece of ``q`` queries whose keys run
``k`` before it costs ``Q·K + Q·(Q + 128)/2`` pairs with ``Q``, ``K`` rounded up to 128 (the
diagonal tiles computed whole), against ``q·k + q(q + 1)/2`` useful ones. The measured flash
kernels (``traces/measured/*/doc-attention/chunks.csv``) run at a rate ∝ queries below one tile,
which this padding reproduces.

>>> useful, padded = rank_pairs([8192], cp=2, sharding="sequence")
>>> [round(float(u) / (8192 * 8193 / 2), 3) for u in useful]
[0.5, 0.5]
>>> useful, _ = rank_pairs([6144, 1024, 1024], cp=2, sharding="sequence")
>>> round(float(max(useful) / (sum(useful) / 2)), 2)     # one long document and two short ones
1.68
>>> useful, _ = rank_pairs([6144, 1024, 1024], cp=2, sharding="document")
>>> round(float(max(useful) / (sum(useful) / 2)), 2)
1.0
"""

from __future__ import annotations

import numpy as np

__all__ = ["rank_pairs", "TILE"]

#: queries (and keys) per flash-attention tile
TILE = 128


def _pad(x: np.ndarray) -> np.ndarray:
    return np.ceil(x / TILE) * TILE


def _pieces_pairs(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Useful and tile-padded query-key pairs of pieces of ``q`` queries with ``k`` keys of
    their document before them (causal inside the piece)."""
    useful = q * k + q * (q + 1) / 2
    Q = _pad(q)
    padded = np.where(q > 0, Q * _pad(k) + Q * (Q + TILE) / 2, 0.0)
    return useful, padded


def rank_pairs(docs: list[int], *, cp: int, sharding: str) -> tuple[np.ndarray, np.ndarray]:
    """(useful, padded) query-key pairs per CP rank (arrays of ``cp``) of one packed sequence
    of documents ``docs`` (tokens each)."""
    d = np.asarray(docs, dtype=float)
    if sharding == "document":
        return _per_document(d, cp)
    if sharding != "sequence":
        raise ValueError(f"sharding must be sequence or document, got {sharding!r}")
    return _per_sequence(d, cp)


def _chunk_owner(cp: int) -> np.ndarray:
    """Rank of each of the ``2·cp`` chunks."""
    j = np.arange(2 * cp)
    return np.where(j < cp, j, 2 * cp - 1 - j)


def _per_document(d: np.ndarray, cp: int) -> tuple[np.ndarray, np.ndarray]:
    c = d / (2 * cp)                                        # chunk length per document
    j = np.arange(2 * cp)
    q = np.broadcast_to(c[:, None], (d.size, 2 * cp))
    k = c[:, None] * j[None, :]
    useful, padded = _pieces_pairs(q, k)
    owner = _chunk_owner(cp)
    return (np.bincount(owner, useful.sum(0), minlength=cp),
            np.bincount(owner, padded.sum(0), minlength=cp))


def _per_sequence(d: np.ndarray, cp: int) -> tuple[np.ndarray, np.ndarray]:
    total = d.sum()
    size = total / (2 * cp)
    starts = np.concatenate([[0.0], np.cumsum(d)[:-1]])     # document starts in the sequence
    ends = starts + d
    a = np.arange(2 * cp)[:, None] * size                   # chunk bounds (2cp × 1)
    b = a + size
    qa, qb = np.maximum(a, starts[None, :]), np.minimum(b, ends[None, :])
    q = np.maximum(qb - qa, 0.0)
    k = np.where(q > 0, qa - starts[None, :], 0.0)
    useful, padded = _pieces_pairs(q, k)
    owner = _chunk_owner(cp)
    return (np.bincount(owner, useful.sum(1), minlength=cp),
            np.bincount(owner, padded.sum(1), minlength=cp))
