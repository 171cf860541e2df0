"""Planners behind one interface (:class:`~planner.sharding.protocols.Planner`:
``plan(task, devices, *, seed, time_limit_s) -> Plan``).

====================  ==========================================================================
name                  what it does
====================  ==========================================================================
``random``            each table table-wise on a random device with room (seeded)
``size``              NeuroShard baselines: sort tables by a key, largest first, each onto the
``dim``               device with the smallest sum of that key that still has room
``lookup``            (size = rows·dim, dim, lookup = dim·pooling, size_lookup =
``size_lookup``       dim·pooling·log10(rows)); table-wise only
``greedy``            LPT on the analytic step cost (each synchronised phase's slowest rank,
                      summed): heavy tables cut into column parts or spread over a host, each
                      unit onto the rank that keeps the step cost lowest
``local_search``      ``greedy``, then moves, swaps, splits and merges that lower the step cost;
                      ``--planner-set start=NAME`` starts from another planner's plan instead
                      (``start=torchrec``: TorchRec's plan, never left worse by our cost)
``mip``               PuLP/CBC: minimise the step cost under memory caps over
                      table-wise, column-wise (2/4/8 parts), row-wise, data-parallel (and
                      table-row-wise across hosts); warm-started from ``local_search``
``memory_balanced``   NVIDIA distributed-embeddings' placement (DeepLearningExamples' TF2 DLRM):
                      tables over 10¹⁰ elements cut into column slices, all dealt largest
                      first in a snake over the ranks (even counts, no cost model)
``dle_pytorch``       DeepLearningExamples' PyTorch DLRM placement: rank 0 keeps the bottom MLP
                      (and no table above 4 ranks), the tables whole in buckets of at most
                      ⌈T / k⌉, largest first into the bucket with the fewest rows
``hugectr_auto``      HugeCTR's ``auto`` / ``hier_auto`` plan (the MLPerf DLRM-DCNv2
                      submissions' ``SHARDING_PLAN``): hot tables split by key over 2, 4, 8
                      ... GPUs (``subset_row_wise``; ``hierarchical_row_wise`` over whole
                      nodes under ``hier_auto``), small ones replicated, by its own cost of
                      hotness, shards held and memory (``--planner-set KEY=VALUE``)
``torchrec``          TorchRec's own ``EmbeddingShardingPlanner``, run for real (needs
                      ``make setup-torchrec``); its plan converted back and costed by our model
``best``              the lowest predicted of ``greedy``'s, ``local_search``'s and ``mip``'s
                      plans, unless it is faster than TorchRec's plan (``incumbent``;
                      ``none`` for no incumbent) with probability below ``confidence`` (0.9)
                      under the lookup fit's own error: then TorchRec's (:mod:`.best`)
``neuroshard``        NeuroShard's grid search (table-wise) and column-halving beam search over
                      the learned cost model shipped in ``planner/costmodel``, then a local
                      search on the full learned objective (moves, swaps, non-halving column
                      splits, row-wise for hot tables; ``planner/costmodel/README.md``);
                      on a device kind no weights were trained on, ``local_search`` on the
                      analytic model, with a warning
====================  ==========================================================================

Every planner falls back to row-wise for a table that fits no single device, when row-wise is
allowed; a table that fits nowhere under the allowed types raises
:class:`~planner.model.tables.feasible.InfeasibleError` (exit code 2 in the CLI) naming the fix.
"""

from __future__ import annotations

from simulator.errors import SpecError

from planner.costmodel.planner import NeuroShardPlanner
from planner.sharding.baselines import KeyGreedyPlanner
from planner.sharding.best import CONFIDENCE, BestPlanner
from planner.sharding.dle_pytorch import DlePyTorchPlanner
from planner.sharding.greedy import GreedyPlanner
from planner.sharding.hugectr_auto import HugeCtrAutoPlanner
from planner.sharding.local_search import LocalSearchPlanner
from planner.sharding.memory_balanced import MemoryBalancedPlanner
from planner.sharding.mip import MipPlanner
from planner.sharding.protocols import Planner
from planner.sharding.random_placement import RandomPlanner
from planner.sharding.torchrec_planner import TorchRecPlanner

__all__ = ["PLANNER_NAMES", "BEST_CANDIDATES", "get_planner"]

PLANNER_NAMES = ("random", "size", "dim", "lookup", "size_lookup", "greedy", "local_search", "mip",
                 "memory_balanced", "dle_pytorch", "hugectr_auto", "torchrec", "neuroshard",
                 "best")
#: the planners ``best`` runs and picks the lowest predicted plan of
BEST_CANDIDATES = ("greedy", "local_search", "mip")


def get_planner(name: str, **options) -> Planner:
    """The planner called ``name`` (see the module docstring); ``options`` go to its constructor."""
    if name == "random":
        return RandomPlanner(**options)
    if name in ("size", "dim", "lookup", "size_lookup"):
        return KeyGreedyPlanner(name, **options)
    if name == "greedy":
        return GreedyPlanner(**options)
    if name == "local_search":
        if isinstance(options.get("start"), str):
            options["start"] = _start_planner(options["start"])
        return LocalSearchPlanner(**options)
    if name == "mip":
        return MipPlanner(**options)
    if name == "memory_balanced":
        return MemoryBalancedPlanner(**options)
    if name == "dle_pytorch":
        return DlePyTorchPlanner(**options)
    if name == "hugectr_auto":
        return HugeCtrAutoPlanner(**options)
    if name == "torchrec":
        return TorchRecPlanner(**options)
    if name == "neuroshard":
        options.setdefault("fallback", LocalSearchPlanner())
        return NeuroShardPlanner(**options)
    if name == "best":
        return _best_planner(**options)
    raise SpecError(f"unknown planner {name!r}", source="--planner",
                    fix=f"use one of: {', '.join(PLANNER_NAMES)}")


def _best_planner(incumbent: str = "torchrec", confidence: float = CONFIDENCE) -> Planner:
    """``best`` over :data:`BEST_CANDIDATES`, keeping ``incumbent``'s plan (``none``: no
    incumbent) unless ours beats it with probability ``confidence``."""
    if incumbent != "none" and (incumbent not in PLANNER_NAMES or incumbent == "best"):
        raise SpecError(f"best cannot keep the plan of {incumbent!r}", source="--planner-set",
                        field="incumbent", fix="name a planner, e.g. incumbent=torchrec, or "
                                               "incumbent=none")
    inc = None if incumbent == "none" else (incumbent, get_planner(incumbent))
    return BestPlanner({n: get_planner(n) for n in BEST_CANDIDATES}, inc, confidence)


def _start_planner(name: str) -> Planner:
    """The planner whose plan ``local_search`` starts from (its ``start`` setting)."""
    if name not in PLANNER_NAMES or name == "local_search":
        raise SpecError(f"local_search cannot start from {name!r}", source="--planner-set",
                        field="start", fix="name another planner, e.g. start=torchrec: "
                        + ", ".join(n for n in PLANNER_NAMES if n != "local_search"))
    return get_planner(name)
