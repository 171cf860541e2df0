"""The constants of the analytic embedding cost model (:class:`CostConfig`) and the measured
CPU profile that replaces them on this machine's topology (:func:`device_profile_for`)."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.topology import Topology

from planner.model.tables.cpu_profile import BackwardTerms, CpuProfile, load_cpu_profile

__all__ = ["CostConfig", "device_profile_for"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CostConfig:
    """Constants of the analytic model (priors, not measurements; see :mod:`.cost`).

    Attributes
    ----------
    hbm_efficiency : float
        Fraction of HBM bandwidth embedding gathers reach.
    lookup_overhead_bytes : float
        Per-lookup cost expressed as extra bytes at that bandwidth.
    repeat_hit_ratio : float
        Probability that a repeated access of a row within a batch hits on-chip cache.
    backward_multiplier : float
        Backward lookup time / forward lookup time.
    id_bytes, length_bytes : int
        Bytes per id (int64) and per (sample, feature) length entry (int32).
    shard_overhead_s : float
        Fixed time per shard per pass (table setup inside the fused kernel), seconds.
    kernel_launch_s : float or None
        Launch time of one TBE kernel, seconds; None uses the GPU compute profile's.
    reserve_fraction : float
        Fraction of HBM kept free (TorchRec's heuristic reservation).
    row_walk_bytes, page_reach_bytes : float
        Address-translation cost of a first touch: each distinct row a shard touches costs
        ``row_walk_bytes · log2(max(1, shard bytes / page_reach_bytes))`` extra bytes at the
        lookup bandwidth (a TLB miss and page walk, which grow with the table's footprint).
        0 for GPUs (the prior); fitted in the CPU profile.
    bag_bytes : float
        Per pooled output (bag) in the forward, whatever its ids, as extra bytes at the lookup
        bandwidth (its offsets read, its output row started): 0 for GPUs (the prior), fitted in
        the CPU profile, where a pooling-1 table pays it on every id.
    device_profile : str or None
        ``"auto"``: on a CPU topology, the measured CPU profile (:func:`load_cpu_profile`)
        replaces the lookup constants above and the collective fits; a path: that profile file;
        None: the priors everywhere. GPU topologies are unaffected.
    lookup_time_scale : float
        Multiplies every lookup time (bandwidth term, per-shard overhead and launch alike):
        the slowdown of lookups measured under the run's own conditions, e.g. ranks sharing
        cores and caches (:mod:`planner.measure.validate.calibrate_dlrm`'s lookup probe). 1.0 here.
    backward : BackwardTerms or None
        The backward lookup term by term (the CPU profile's; replaces ``backward_multiplier``
        for sparse shards); None: ``backward_multiplier`` × the forward.
    """

    hbm_efficiency: float = 0.8
    lookup_overhead_bytes: float = 64.0
    repeat_hit_ratio: float = 0.8
    backward_multiplier: float = 2.0
    id_bytes: int = 8
    length_bytes: int = 4
    shard_overhead_s: float = 2e-6
    kernel_launch_s: float | None = None
    reserve_fraction: float = 0.15
    row_walk_bytes: float = 0.0
    page_reach_bytes: float = 1048576.0
    bag_bytes: float = 0.0
    device_profile: str | None = "auto"
    lookup_time_scale: float = 1.0
    backward: BackwardTerms | None = None


def device_profile_for(topo: Topology, cfg: CostConfig) -> CpuProfile | None:
    """The measured CPU profile that replaces ``cfg``'s lookup constants on ``topo``: on a CPU
    topology, the installed one (``device_profile="auto"``) or the file it names; None on a
    GPU topology or with ``device_profile=None``."""
    if cfg.device_profile is None or topo.gpu.name != "cpu":
        return None
    if cfg.device_profile == "auto":
        return load_cpu_profile(None)
    return load_cpu_profile(str(cfg.device_profile))
