"""A measured profile of torch.distributed on CPUs (gloo): per-size collective times, one
core's compute rates and eager PyTorch's host time per transformer block.

Written by ``clusterplan calibrate gloo`` (:mod:`planner.measure.validate.calibrate`), read here so the
simulator can time a step the way such a machine runs it:

- **Collectives from tables.** Loopback TCP between processes that share a few cores is not a
  network of links: gloo's time per call is its own software path (copies, reductions on the
  calling core, TCP through the kernel), so a flow model of a 1 GB/s "link" misses it by 2-5×
  at small sizes (``shared/reference/gloo-on-cpu.md``). A :class:`CommTable` per kind and group
  size, measured on the machine in the same run, gives the time of one call of ``n`` bytes by
  interpolation in log-log between measured sizes (the nccl-tests byte convention of
  :mod:`simulator.collectives.plan`), and by the last measured bandwidth beyond them. An
  all-to-all given its byte matrix (a sharding plan's) is timed on ``alltoallv``, the call
  with split lists that TorchRec makes, keyed by the bytes a rank sends to the others.
- **Communication competes with compute.** A rank is a process on one core: gloo reduces,
  copies and drives TCP on CPU cores, so a collective or message does not overlap that rank's
  compute, it takes turns with it (``shared_core``). The engine gives every rank one core
  that compute ops and its measured communication hold in turn.
- **One core's compute.** The compute profile's peak is what one thread reached in the same
  run (with every other rank busy with the same work, as in a step), not the all-core peak.
- **Host time.** On a CPU the Python and dispatch work of eager PyTorch runs on the same core
  as the arithmetic, so a block pass takes host time *plus* kernel time (on a GPU it is the
  larger of the two, :mod:`planner.model.llm.host`).
- **Cores that slow each other.** Those compute times are all-busy times. Where the processes
  outnumber the cores, ranks pinned to one core share it; and a core computes faster while
  the others are idle (shared caches and memory bus): ``contention.alone_speedup``, measured
  by timing one probe on every rank at once and on each rank alone. Both are applied by
  :mod:`simulator.cpushare`.
- **Uneven all-to-alls share the cores too.** The copies and TCP of an all-to-all are CPU work
  on the shared cores, so a rank that sends more than the others is helped by their idle
  cores: ``alltoall_uneven.weight`` (measured, :mod:`planner.measure.validate.uneven_a2a`)
  places its time between the equal exchange of the mean bytes and that of the busiest rank's.
- **Skinny layers by shape.** The matmul curve is keyed by FLOPs and measured on a small
  transformer's shapes; a recommendation model's narrow layers on large batches run at a
  fraction of that rate, so their three GEMMs are timed by shape (``linear_layers``,
  :class:`~simulator.linear_table.LinearTable`).

Units: seconds, bytes, FLOP/s, as everywhere in the simulator.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from simulator.compute import ComputeProfile
from simulator.efficiency import EfficiencyCurve, monotone_time_points
from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text
from simulator.hardware import gpu_spec
from simulator.linear_table import LinearTable

__all__ = ["CommTable", "GlooProfile", "load_gloo_profile", "gloo_profile_from_dict", "COMM_KINDS"]

#: collective kinds a profile may time (simulator names), plus ``sendrecv`` for messages and
#: ``alltoallv``: the all-to-all with split lists, keyed by the bytes a rank sends to the others
COMM_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "broadcast",
              "sendrecv")


@dataclass(frozen=True, slots=True)
class CommTable:
    """Measured seconds of one call of ``kind`` on ``nranks`` processes, per size in bytes.

    ``sizes`` strictly increase; ``seconds`` are the medians measured at them (slowest rank).
    """

    kind: str
    nranks: int
    sizes: tuple[float, ...]
    seconds: tuple[float, ...]
    _lx: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _ly: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.seconds) or len(self.sizes) < 2:
            raise SpecError(f"{self.kind}: need at least two (bytes, seconds) rows",
                            field=f"comm.{self.kind}", fix="measure several sizes")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])) or self.sizes[0] <= 0:
            raise SpecError(f"{self.kind}: sizes must be positive and increasing",
                            field=f"comm.{self.kind}", fix="sort the rows by bytes")
        if any(not (s > 0 and math.isfinite(s)) for s in self.seconds):
            raise SpecError(f"{self.kind}: seconds must be positive", field=f"comm.{self.kind}",
                            fix="give the measured times")
        object.__setattr__(self, "_lx", tuple(math.log(s) for s in self.sizes))
        object.__setattr__(self, "_ly", tuple(math.log(t) for t in self.seconds))

    def time_s(self, nbytes: float) -> float:
        """Seconds for one call of ``nbytes`` (the smallest size's time below it; beyond the
        largest, that time plus the extra bytes at the last measured interval's rate)."""
        if nbytes <= self.sizes[0]:
            return self.seconds[0]
        if nbytes >= self.sizes[-1]:
            s0, s1 = self.sizes[-2], self.sizes[-1]
            t0, t1 = self.seconds[-2], self.seconds[-1]
            per_byte = max(t1 - t0, 0.0) / (s1 - s0)
            return t1 + (nbytes - s1) * per_byte
        x = math.log(nbytes)
        i = bisect.bisect_right(self._lx, x)
        x0, x1, y0, y1 = self._lx[i - 1], self._lx[i], self._ly[i - 1], self._ly[i]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True, slots=True, kw_only=True)
class GlooProfile:
    """What :mod:`planner.measure.validate.calibrate` measured (see the module docstring).

    Attributes
    ----------
    comm : Mapping[tuple[str, int], CommTable]
        Per (kind, processes) the measured table.
    compute : ComputeProfile
        One core's rates: ``gpu.peak_flops['fp32']`` the best single-thread matmul rate,
        ``gpu.hbm_bandwidth_Bps`` the best single-thread add rate, FLOP/s and bytes/s.
    host_block_s : Mapping[str, float]
        Eager PyTorch's host seconds per block pass of the validation model on this CPU:
        ``forward``, ``backward`` (tiny tensors: dispatch and autograd, not arithmetic), for
        SwiGLU blocks; ``host_block_gelu_s`` the same for GELU blocks.
    wake_penalty_s : tuple of (gap seconds, seconds)
        Extra seconds of a call whose process did no communication for ``gap`` seconds before
        it (its gloo threads slept; linear in log(gap) between points, clamped outside).
    shared_core : bool
        Communication takes turns with compute on each rank's core (see the module docstring).
    noise : Mapping[str, Any]
        Run-to-run spread recorded beside the numbers (relative, per kind).
    source : str
    """

    comm: Mapping[tuple[str, int], CommTable]
    compute: ComputeProfile
    host_block_s: Mapping[str, float]
    host_block_gelu_s: Mapping[str, float] = field(default_factory=dict)
    wake_penalty_s: tuple[tuple[float, float], ...] = ()
    shared_core: bool = True
    noise: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    #: TorchRec probe plans' measured steps (``torchrec:``, :mod:`planner.measure.validate.calibrate_dlrm`)
    torchrec: Mapping[str, Any] | None = None
    #: the co-running embedding-lookup probe (``lookup:``, read by the planner's DLRM validation)
    lookup: Mapping[str, Any] | None = None
    #: page faults of new tensors: ``(threshold bytes, bytes per second)`` (``fresh_alloc:``);
    #: None when the profile predates the probe
    fresh_alloc: tuple[float, float] | None = None
    #: FBGEMM's pooled-embedding permute timed by shape (``permute_pooled:``, read by the
    #: planner's DLRM validation); None when the profile predates the probe
    permute_pooled: Mapping[str, Any] | None = None
    #: what the measured processes' C heap did with freed memory (``measured.heap``:
    #: ``retain`` or ``system``; profiles that predate the setting ran with ``system``)
    heap: str = "system"
    #: the cores the measured processes ran on (``measured.machine.cpu_count``) and how many
    #: processes there were (``measured.processes``): with more processes than cores every
    #: compute time above is at a share of a core (:mod:`simulator.cpushare`); None: unknown
    cores: int | None = None
    processes: int | None = None
    #: how much faster a core computes while it is the only busy one than with every core
    #: busy (``contention.alone_speedup``, ≥ 1; :mod:`simulator.cpushare`); None: not measured
    alone_speedup: float | None = None
    #: where between the mean rank's and the busiest rank's bytes an uneven all-to-all's time
    #: falls (``alltoall_uneven.weight``, 0..1); None: not measured (the busiest rank's)
    alltoall_uneven_weight: float | None = None
    #: linear layers' GEMMs timed by shape (``linear_layers:``, :mod:`simulator.linear_table`);
    #: None when the profile predates the probe (the matmul curve prices them)
    linear: LinearTable | None = None

    def comm_time_s(self, kind: str, nranks: int, nbytes: float, gap_s: float = 0.0, *,
                    splits=None) -> float | None:
        """Seconds of one call, or None where this profile has no table for it; ``gap_s``:
        the longest time any member went without communication before it. ``splits``: an
        all-to-all's bytes from rank ``i`` to rank ``j`` (``nbytes`` is then its busiest
        rank's), priced at ``mean + weight · (max − mean)`` of each rank's larger of sent
        and received bytes, off the diagonal (:mod:`planner.measure.validate.uneven_a2a`), on
        the ``alltoallv`` table where the profile has one (the call with split lists)."""
        table, nbytes = self._table(kind, nranks, nbytes, splits)
        if table is None:
            return None
        if kind == "alltoall" and splits is not None and self.alltoall_uneven_weight is not None:
            nbytes *= _uneven_scale(splits, self.alltoall_uneven_weight)
        return table.time_s(nbytes) + self.wake_s(gap_s)

    def _table(self, kind: str, nranks: int, nbytes: float, splits):
        """The table that times a call and its bytes in that table's convention: an all-to-all
        with ``splits`` goes to ``alltoallv`` at its busiest rank's bytes off the diagonal."""
        if kind == "alltoall" and splits is not None:
            table = self.comm.get(("alltoallv", nranks))
            if table is not None:
                return table, _off_diagonal_max(splits)
        return self.comm.get((kind, nranks)), nbytes

    def beyond_measured(self, kind: str, nranks: int, nbytes: float, *,
                        splits=None) -> float | None:
        """The largest size measured for ``kind`` on ``nranks`` processes, bytes, when a call
        of ``nbytes`` is above it (its time is then extrapolated at the last interval's rate),
        else None."""
        table, nbytes = self._table(kind, nranks, nbytes, splits)
        return table.sizes[-1] if table is not None and nbytes > table.sizes[-1] else None

    def wake_s(self, gap_s: float) -> float:
        """Extra seconds of a call after ``gap_s`` seconds without communication."""
        pts = self.wake_penalty_s
        if not pts or gap_s <= pts[0][0]:
            return pts[0][1] * (gap_s / pts[0][0]) if pts and gap_s > 0 else 0.0
        if gap_s >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right([g for g, _ in pts], gap_s)
        (g0, e0), (g1, e1) = pts[i - 1], pts[i]
        return e0 + (e1 - e0) * math.log(gap_s / g0) / math.log(g1 / g0)


def _linear(section: Any, source: str) -> LinearTable | None:
    if not isinstance(section, Mapping) or not section.get("points"):
        return None
    return LinearTable.from_points(section["points"], source=source,
                                   field="linear_layers.points")


def _fresh_alloc(section: Any, source: str) -> tuple[float, float] | None:
    if not isinstance(section, Mapping) or section.get("Bps") is None:
        return None
    try:
        out = (float(section["threshold_bytes"]), float(section["Bps"]))
    except (KeyError, TypeError, ValueError):
        out = (float("nan"), float("nan"))
    if not (out[0] >= 0 and out[1] > 0):
        raise SpecError("fresh_alloc needs threshold_bytes >= 0 and Bps > 0", source=source,
                        field="fresh_alloc", fix="write it again with clusterplan calibrate gloo")
    return out


def gloo_profile_from_dict(doc: Mapping[str, Any], *, source: str = "<dict>") -> GlooProfile:
    """Build a profile from the mapping ``clusterplan calibrate gloo`` writes."""
    if not isinstance(doc, Mapping) or doc.get("format") != "clusterplan.gloo-profile":
        raise SpecError("not a gloo profile (format: clusterplan.gloo-profile)", source=source,
                        field="format", fix="write one with: clusterplan calibrate gloo --out FILE")
    try:
        comm = {}
        for key, rows in doc["comm"].items():
            kind, _, n = str(key).partition("@")
            if kind not in COMM_KINDS or not n.isdigit():
                raise SpecError(f"unknown table {key!r}", source=source, field=f"comm.{key}",
                                fix=f"name tables KIND@PROCESSES with KIND one of "
                                    f"{', '.join(COMM_KINDS)}")
            try:
                comm[(kind, int(n))] = CommTable(kind, int(n),
                                                 tuple(float(r[0]) for r in rows),
                                                 tuple(float(r[1]) for r in rows))
            except SpecError as exc:
                raise SpecError(exc.message, source=source, field=f"comm.{key}",
                                fix=exc.fix) from None
        c = doc["compute"]
        base = gpu_spec("cpu")
        gpu = replace(base, vendor_name=f"{base.vendor_name} (one core, measured)",
                      peak_flops={"fp32": float(c["peak_fp32_flops"])},
                      hbm_bandwidth_Bps=float(c["memory_bandwidth_Bps"]))
        prof = ComputeProfile(
            gpu=gpu,
            matmul={"fp32": EfficiencyCurve.from_points(
                monotone_time_points(c["matmul_fp32"]), source=source, field="compute.matmul_fp32")},
            memory=EfficiencyCurve.from_points(monotone_time_points(c["memory"]), source=source,
                                               field="compute.memory"),
            launch_overhead_s=float(c["launch_overhead_s"]),
            attention={"fp32": EfficiencyCurve.from_points(
                monotone_time_points(c["attention_fp32"]), source=source,
                field="compute.attention_fp32")} if c.get("attention_fp32") else {},
            attention_backward={"fp32": EfficiencyCurve.from_points(
                monotone_time_points(c["attention_backward_fp32"]), source=source,
                field="compute.attention_backward_fp32")}
            if c.get("attention_backward_fp32") else {},
            source=f"{source} (one core, measured with the other ranks busy)")
        host = {k: float(v) for k, v in doc["host_block_s"].items()}
        host_gelu = {k: float(v) for k, v in doc.get("host_block_gelu_s", {}).items()}
    except SpecError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SpecError(f"malformed gloo profile ({type(exc).__name__}: {exc})", source=source,
                        fix="write it again with: clusterplan calibrate gloo --out FILE") from None
    wake = tuple((float(g), float(e)) for g, e in doc.get("wake_penalty_s", []))
    if any(not (g > 0 and e >= 0) for g, e in wake):
        raise SpecError("wake_penalty_s rows must be [gap > 0, seconds >= 0]", source=source,
                        field="wake_penalty_s", fix="write it again with clusterplan calibrate gloo")
    return GlooProfile(comm=comm, compute=prof, host_block_s=host, host_block_gelu_s=host_gelu,
                       wake_penalty_s=tuple(sorted(wake)),
                       shared_core=bool(doc.get("shared_core", True)),
                       noise=dict(doc.get("noise", {})), source=source,
                       torchrec=doc.get("torchrec") if isinstance(doc.get("torchrec"), Mapping)
                       else None,
                       lookup=doc.get("lookup") if isinstance(doc.get("lookup"), Mapping)
                       else None, fresh_alloc=_fresh_alloc(doc.get("fresh_alloc"), source),
                       permute_pooled=doc.get("permute_pooled")
                       if isinstance(doc.get("permute_pooled"), Mapping) else None,
                       heap=_heap(doc, source), alone_speedup=_alone_speedup(doc, source),
                       alltoall_uneven_weight=_uneven_weight(doc, source),
                       linear=_linear(doc.get("linear_layers"), source), **_cores(doc, source))


def _volumes(splits) -> list[float]:
    """Each rank's larger of bytes sent and received, off the diagonal of ``splits``."""
    n = len(splits)
    sent = [sum(row[j] for j in range(n) if j != i) for i, row in enumerate(splits)]
    got = [sum(splits[i][j] for i in range(n) if i != j) for j in range(n)]
    return [max(a, b) for a, b in zip(sent, got)]


def _off_diagonal_max(splits) -> float:
    """The busiest rank's bytes off the diagonal of ``splits`` (sent or received)."""
    return float(max(_volumes(splits), default=0.0))


def _uneven_scale(splits, weight: float) -> float:
    """``(mean + weight · (max − mean)) / max`` of each rank's larger of sent and received
    bytes, off the diagonal (1 for an equal exchange or no bytes)."""
    vol = _volumes(splits)
    n = len(vol)
    top = max(vol, default=0.0)
    if top <= 0:
        return 1.0
    mean = sum(vol) / n
    return (mean + weight * (top - mean)) / top


def _uneven_weight(doc: Mapping, source: str) -> float | None:
    """``alltoall_uneven.weight`` (None where the profile predates the probe)."""
    sec = doc.get("alltoall_uneven")
    if sec is None:
        return None
    value = sec.get("weight") if isinstance(sec, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise SpecError(f"alltoall_uneven.weight must be a number from 0 to 1, not {value!r}",
                        source=source, field="alltoall_uneven.weight",
                        fix="write it again with clusterplan calibrate gloo")
    return float(value)


def _alone_speedup(doc: Mapping, source: str) -> float | None:
    """``contention.alone_speedup`` (None where the profile predates the probe)."""
    sec = doc.get("contention")
    if sec is None:
        return None
    value = sec.get("alone_speedup") if isinstance(sec, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0:
        raise SpecError(f"contention.alone_speedup must be a number >= 1, not {value!r}",
                        source=source, field="contention.alone_speedup",
                        fix="write it again with clusterplan calibrate gloo")
    return float(value)


def _cores(doc: Mapping, source: str) -> dict:
    """``cores`` and ``processes`` from the ``measured`` section (None where absent)."""
    measured = doc.get("measured") if isinstance(doc.get("measured"), Mapping) else {}
    machine = measured.get("machine") if isinstance(measured.get("machine"), Mapping) else {}
    out = {}
    for key, field_, value in (("cores", "measured.machine.cpu_count", machine.get("cpu_count")),
                               ("processes", "measured.processes", measured.get("processes"))):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise SpecError(f"{field_} must be a whole number >= 1, not {value!r}",
                            source=source, field=field_,
                            fix="write it again with clusterplan calibrate gloo")
        out[key] = value
    return out


def _heap(doc: Mapping, source: str) -> str:
    measured = doc.get("measured")
    heap = measured.get("heap", "system") if isinstance(measured, Mapping) else "system"
    if heap not in ("retain", "system"):
        raise SpecError(f"heap {heap!r} is not retain or system", source=source,
                        field="measured.heap", fix="write it again with clusterplan calibrate gloo")
    return heap


def load_gloo_profile(path: str | Path) -> GlooProfile:
    """Read a profile written by ``clusterplan calibrate gloo``."""
    return gloo_profile_from_dict(parse_yaml(read_text(path), source=str(path)), source=str(path))
