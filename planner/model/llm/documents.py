"""Variable-length documents in a training spec: their length distribution and how they are packed
and sharded (WLB-LLM, Wang et al. OSDI 2025; papers.md §5).

Packed sequences carry document masks, so a micro-batch's attention work is the sum of its
documents' causal attentions (∝ d²) while everything else is ∝ tokens: equal tokens, unequal work.
The spec section (under ``training:``)::

    documents:
      lengths: wlb-llm          # a built-in distribution, or a CSV file: doc_len[,count]
      packing: original         # original | fixed | wlb
      window: 1                 # fixed: global batches packed together (1, 2, 4, 8 ...)
      queues: 2                 # wlb: outlier queues (0: no delay)
      thresholds: []            # wlb: queue lower bounds, tokens (default seq/2^(queues+1-i))
      max_tokens: 0             # wlb: tokens a micro-batch may hold (0: the sequence length)
      cp_sharding: sequence     # sequence | document | adaptive
      batches: 32               # global batches sampled for the step-time distribution
      seed: 0

Built-in length distributions (tokens; every document at least 1 token):

``wlb-llm``
    A body uniform on [1, 6,250] (97.25% of documents) and a log-normal tail (μ = 9.96, σ = 0.93
    in ln tokens, median ≈ 21k) above it, cut at 131,072: the summary statistics of the
    document-length sample that DistCA (hao-ai-lab/DistCA, ``dist_wlbllm.json``, 99,519 lengths)
    publishes as WLB-LLM's distribution. Mean ≈ 3,960 tokens; documents shorter than 64k hold
    87% of the tokens, as the paper says of its data (> 75% below half the context).
``lognormal``
    ln(length) ~ N(ln 2,048, 1.2): a single heavy-tailed family, for contrast.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import read_text
from simulator.validation import Fields

__all__ = ["DocumentSpec", "parse_documents", "LengthSampler", "length_sampler", "BUILTIN",
           "PACKINGS", "CP_SHARDINGS"]

PACKINGS = ("original", "fixed", "wlb")
CP_SHARDINGS = ("sequence", "document", "adaptive")
BUILTIN = ("wlb-llm", "lognormal")
MAX_DOC_TOKENS = 2**24


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentSpec:
    """What ``training.documents`` says; lengths in tokens."""

    lengths: str = "wlb-llm"
    packing: str = "original"
    window: int = 1
    queues: int = 2
    thresholds: tuple[int, ...] = ()
    max_tokens: int = 0
    cp_sharding: str = "sequence"
    batches: int = 32
    seed: int = 0
    histogram: tuple[tuple[int, float], ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("histogram")
        d["thresholds"] = list(self.thresholds)
        return d


def parse_documents(f: Fields, *, seq_len: int, base: Path | None = None) -> DocumentSpec:
    """``training.documents`` (``f``) of a model whose sequences hold ``seq_len`` tokens; a
    relative CSV path is read from ``base`` (the spec's folder)."""
    f.check_keys({"lengths", "packing", "window", "queues", "thresholds", "max_tokens",
                  "cp_sharding", "batches", "seed"})
    lengths = f.str("lengths", "wlb-llm")
    hist: tuple = ()
    if lengths not in BUILTIN:
        path = Path(lengths)
        hist = _read_histogram(str(base / path if base and not path.is_absolute() else path),
                               f.path("lengths"))
    spec = DocumentSpec(
        lengths=lengths, packing=f.str("packing", "original", choices=PACKINGS),
        window=f.int("window", 1, minimum=1, maximum=64), queues=f.int("queues", 2, minimum=0,
                                                                        maximum=8),
        thresholds=tuple(_thresholds(f)), max_tokens=f.int("max_tokens", 0, minimum=0),
        cp_sharding=f.str("cp_sharding", "sequence", choices=CP_SHARDINGS),
        batches=f.int("batches", 32, minimum=1, maximum=100_000), seed=f.int("seed", 0),
        histogram=hist)
    if spec.max_tokens and spec.max_tokens < seq_len:
        raise f.err("max_tokens", f"max_tokens {spec.max_tokens} is below the sequence length "
                    f"{seq_len}", "write 0 (the sequence length) or at least model.seq_len")
    if spec.thresholds and len(spec.thresholds) != spec.queues:
        raise f.err("thresholds", f"{len(spec.thresholds)} thresholds for {spec.queues} queues",
                    "give one lower bound per queue, or none for the defaults")
    if list(spec.thresholds) != sorted(set(spec.thresholds)):
        raise f.err("thresholds", f"thresholds {list(spec.thresholds)} are not increasing",
                    "list the queues' lower bounds from short to long")
    too_long = [d for d, _ in hist if d > max(seq_len, spec.max_tokens)]
    if too_long:
        raise f.err("lengths", f"document length {too_long[0]} in {lengths} is above the "
                    f"sequence length {seq_len}", "cut documents to model.seq_len tokens "
                    "(or raise documents.max_tokens)")
    return spec


def _thresholds(f: Fields) -> list[int]:
    raw = f.data.get("thresholds", [])
    if not isinstance(raw, list):
        raise f.err("thresholds", f"thresholds must be a list, got {raw!r}",
                    "write e.g. thresholds: [16384, 32768]")
    out = []
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise f.err(f"thresholds[{i}]", f"threshold {v!r} is not a positive whole number",
                        "write token counts, e.g. [16384, 32768]")
        out.append(v)
    return out


def _read_histogram(path: str, field_name: str) -> tuple[tuple[int, float], ...]:
    """A CSV of ``doc_len[,count]`` rows (header optional) as ((length, weight), ...)."""
    if not path.endswith(".csv"):
        raise SpecError(f"unknown length distribution {path!r}", field=field_name,
                        fix=f"use one of {', '.join(BUILTIN)} or a .csv of doc_len[,count]")
    text = read_text(path, field=field_name)
    rows: dict[int, float] = {}
    for i, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or (i == 1 and not row[0].strip().lstrip("-").isdigit()):
            continue
        try:
            d = int(row[0])
            w = float(row[1]) if len(row) > 1 and row[1].strip() else 1.0
        except ValueError:
            raise SpecError(f"line {i}: {row!r} is not doc_len[,count]", source=path,
                            field=field_name, fix="write whole token counts and counts") from None
        if not (1 <= d <= MAX_DOC_TOKENS) or not (math.isfinite(w) and w >= 0):
            raise SpecError(f"line {i}: length {d} or count {w} out of range", source=path,
                            field=field_name, fix=f"lengths 1..{MAX_DOC_TOKENS}, counts ≥ 0")
        rows[d] = rows.get(d, 0.0) + w
    if not rows or sum(rows.values()) <= 0:
        raise SpecError("no documents in the file", source=path, field=field_name,
                        fix="write one doc_len[,count] row per length")
    return tuple(sorted(rows.items()))


class LengthSampler:
    """Draws document lengths (tokens) from one distribution with its own seeded generator."""

    def __init__(self, draw, seed: int) -> None:
        self._draw, self.rng = draw, np.random.default_rng(seed)
        self._ahead: list[int] = []           # drawn, not yet handed out (dataset order)

    def draw(self, n: int) -> np.ndarray:
        return np.maximum(1, self._draw(self.rng, n)).astype(np.int64)

    def stream(self, tokens: int, cap: int) -> list[int]:
        """The next documents in dataset order, just enough to hold at least ``tokens``
        tokens, each cut to ``cap`` (a loader cuts longer documents at the sequence length)."""
        out: list[int] = []
        total = 0
        while total < tokens:
            if not self._ahead:
                self._ahead = self.draw(256).tolist()
            d = min(self._ahead.pop(0), cap)
            out.append(d)
            total += d
        return out


def length_sampler(spec: DocumentSpec) -> LengthSampler:
    """The sampler of ``spec.lengths`` seeded with ``spec.seed``."""
    if spec.lengths == "wlb-llm":
        def draw(rng, n):
            tail = rng.random(n) < 0.0275
            body = rng.integers(1, 6251, n)
            ln = np.exp(rng.normal(9.96, 0.93, n))
            return np.where(tail, np.clip(ln, 6251, 131072), body).astype(np.int64)
    elif spec.lengths == "lognormal":
        def draw(rng, n):
            return np.exp(rng.normal(math.log(2048), 1.2, n)).astype(np.int64)
    else:
        lengths = np.array([d for d, _ in spec.histogram], dtype=np.int64)
        p = np.array([w for _, w in spec.histogram], dtype=float)
        p /= p.sum()

        def draw(rng, n):
            return rng.choice(lengths, size=n, p=p)
    return LengthSampler(draw, spec.seed)
