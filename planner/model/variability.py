"""Why a synchronous step gets slower as it grows: GPUs that differ in speed, hosts that pause.

A synchronous step waits for its slowest member: a tensor-parallel group for its slowest GPU at
every block, a pipeline stage for its slowest replica (the gradient reduction waits for every
replica), the whole job for the host that paused. Draw each member from the same distribution
and the expected maximum grows with the member count, so the step slows with the GPU count
although no single GPU changed. Two such mechanisms, both off unless asked for:

**GPU speed** (:class:`GpuVariability`): a persistent compute-slowdown factor per GPU,
``exp(σ·Z)`` (median 1, the GPU the kernel timings describe), times ``straggler_factor`` on
the GPUs of a host that is a straggler (probability ``straggler_fraction`` per host).

* σ = 1.5 %: Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in
  Large-Scale, Accelerator-Rich Systems", SC 2022 (arXiv 2208.11035), measured GPUs of one SKU
  on Summit, Vortex, Frontera, Longhorn (V100) and Corona (MI60), over 90 % of each cluster:
  8 % average performance variation (22 % at most), outliers up to 1.5× slower than the median
  GPU. We read the 8 % as the whisker-to-whisker spread of their box plots (Q1 − 1.5 IQR to
  Q3 + 1.5 IQR, ±2.70 σ of a normal, 5.4 σ in all), so σ = 8 % / 5.4 = 1.48 %. (Read as the
  full range of a few thousand GPUs, about 7 σ, it would be 1.1 %.)
* Straggler hosts, off by default: MegaScale (Jiang et al., NSDI 2024) found about 0.5 % of
  machines to be computational stragglers about 10 % slower, and removing them gave about 0.7 %
  MFU. The two figures do not fit a synchronous step: at their scale (over 1,000 hosts) a few
  stragglers are almost surely present, and a host 10 % slower all step long would cost about
  10 % of the step, not 1.3 %; so the 10 % cannot have held for the whole step. Applied as a
  whole-step factor it would overstate the loss, hence off unless given
  (``straggler_fraction=0.005, straggler_factor=1.10`` reproduces the figures as stated).

**Host stalls** (:class:`HostStalls`): each training process (one per GPU, as torchrun and the
Megatron launchers start them) pauses once in a while for reasons of its own (Python's
automatic full garbage collection, a slow data-loader fetch); the others wait for it at the
next collective. Per step, the job waits for the longest pause of any process, which is how
the step time is charged (a lower bound: pauses that fall between different synchronisation
points of a step would add up instead). Two distributions:

* ``gc`` (default): a process pauses ``duration_s`` once every ``period_steps`` steps at a
  phase of its own, i.e. with probability 1 / ``period_steps`` in a given step. Defaults
  1.45 s every 265 steps: staggered full CPython collections measured in a production trainer
  (marin-community/marin issue 9205: 1.43–1.50 s to scan 4.67 M long-lived objects, one every
  258–273 updates on each rank), which matches CPython's own measurement of about 0.3 µs per
  tracked object for a full collection (python/cpython issue 100403: 325 ns). The pause scales
  with the trainer's heap: give ``duration_s`` = 0.3 µs × its long-lived objects. torchtitan
  (pytorch/torchtitan PR 148) gained about 1.5 % per iteration on 512 GPUs by collecting on
  every rank at the same step, the same mechanism in a PyTorch trainer; Megatron-LM offers the
  same remedy (``--manual-gc``, off by default).
* ``exponential``: a pause of mean ``mean_s`` every step (memoryless jitter; the expected
  maximum over P processes is ``mean_s × H_P``, the P-th harmonic number).

Draws are counter-based (:mod:`simulator.hashing`): a GPU's factor depends on the seed and its
(pp, dp, cp, tp) coordinates only, and a step's pause on the seed, the step and the process's
coordinates, so a job with more data-parallel replicas contains the smaller job's draws and
its expected maxima can only grow. Same inputs, same numbers.

>>> v = GpuVariability(sigma=0.015, straggler_fraction=0.0)
>>> round(v.expected_max(1), 4), v.expected_max(64) < v.expected_max(4096)
(1.0001, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from simulator.errors import SpecError
from simulator.hashing import uniform

from planner.model.llm.layout import Layout

__all__ = ["STALL_MODELS", "GpuVariability", "HostStalls", "layout_coords"]

STALL_MODELS = ("gc", "exponential")

#: stream ids keeping the draws of different quantities apart under one seed
_GPU, _HOST, _STALL = 1, 2, 3


def layout_coords(layout: Layout, ranks: np.ndarray) -> dict[str, np.ndarray]:
    """(tp, cp, dp, pp) coordinates of every rank in ``ranks`` (vectorised
    :meth:`Layout.coords`)."""
    r = np.asarray(ranks, dtype=np.int64).copy()
    out = {}
    for ax in layout.order.split("-"):
        size = getattr(layout, ax)
        out[ax] = r % size
        r //= size
    return out


def _keys(layout: Layout, ranks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Draw keys of ``ranks``: their (pp, dp, cp, tp) coordinates, outermost first."""
    c = layout_coords(layout, ranks)
    return c["pp"], c["dp"], c["cp"], c["tp"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuVariability:
    """Per-GPU compute slowdown: lognormal spread ``sigma`` (of ln factor) around the median
    GPU, and straggler hosts (``straggler_fraction`` of hosts, ``straggler_factor`` slower).
    Defaults and their sources: see the module docstring. ``seed`` picks the draw."""

    sigma: float = 0.0148
    straggler_fraction: float = 0.0
    straggler_factor: float = 1.10
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.sigma < 1):
            raise SpecError(f"GPU speed spread σ {self.sigma} is not in [0, 1)",
                            field="--gpu-sigma", fix="give e.g. 0.015 (1.5 %)")
        if not (0 <= self.straggler_fraction <= 1) or self.straggler_factor < 1:
            raise SpecError("straggler hosts need a fraction in [0, 1] and a factor ≥ 1",
                            field="--straggler-hosts", fix="write e.g. 0.005 and 1.10")

    def to_dict(self) -> dict:
        """The settings as plain JSON values."""
        return asdict(self)

    def factors(self, layout: Layout, ranks: np.ndarray, host_first: np.ndarray) -> np.ndarray:
        """Slowdown factor of each rank in ``ranks`` (≥ 0; 1 is the median GPU).
        ``host_first[i]``: the first rank on the host of ``ranks[i]`` (its host's draw key)."""
        z = ndtri(uniform(self.seed, _GPU, *_keys(layout, ranks)))
        f = np.exp(self.sigma * z)
        if self.straggler_fraction > 0:
            slow = uniform(self.seed, _HOST, *_keys(layout, host_first)) < self.straggler_fraction
            f = np.where(slow, f * self.straggler_factor, f)
        return f

    def cdf(self, x: np.ndarray, gpus_per_host: int = 1) -> np.ndarray:
        """P(max factor of the ``gpus_per_host`` GPUs of one host ≤ x)."""
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore"):
            def lognormal(v):
                if self.sigma == 0:
                    return (v >= 1.0).astype(float)
                return ndtr(np.log(v) / self.sigma)
            p = self.straggler_fraction
            return ((1 - p) * lognormal(x) ** gpus_per_host
                    + p * lognormal(x / self.straggler_factor) ** gpus_per_host)

    def expected_max(self, n_gpus: int, gpus_per_host: int = 1) -> float:
        """E[max factor over ``n_gpus`` GPUs in hosts of ``gpus_per_host``], by integrating
        the order statistic's distribution: E[M] = ∫ (1 − F(x)^{hosts}) dx from 0 (factors
        are positive). Independent of the seed; what :meth:`factors` samples on average."""
        hosts = max(1, n_gpus // gpus_per_host)
        hi = float(self.straggler_factor if self.straggler_fraction > 0 else 1.0) \
            * np.exp(9 * self.sigma)
        x = np.linspace(0.0, hi, 20001)[1:]
        tail = 1.0 - self.cdf(x, gpus_per_host) ** hosts
        return float(np.trapezoid(tail, x) + tail[0] * x[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStalls:
    """Per-step pauses of the training processes (see the module docstring): ``model`` gc
    (``duration_s`` once every ``period_steps`` steps) or exponential (mean ``mean_s`` per
    step); ``steps`` sampled steps are averaged; ``seed`` picks the draw."""

    model: str = "gc"
    duration_s: float = 1.45
    period_steps: float = 265.0
    mean_s: float = 0.005
    steps: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in STALL_MODELS:
            raise SpecError(f"unknown host stall model {self.model!r}", field="--stall-model",
                            fix=f"use one of: {', '.join(STALL_MODELS)}")
        if self.duration_s < 0 or self.period_steps < 1 or self.mean_s < 0 or self.steps < 1:
            raise SpecError("host stalls need a duration ≥ 0, a period ≥ 1 step, a mean ≥ 0 "
                            "and at least one sampled step", field="--stall-duration",
                            fix="write e.g. --stall-duration 1.45s --stall-period 265")

    def to_dict(self) -> dict:
        """The settings as plain JSON values (seconds)."""
        return asdict(self)

    def draws(self, layout: Layout, ranks: np.ndarray, step: int) -> np.ndarray:
        """Pause (s) of each process in ``ranks`` in step ``step``."""
        u = uniform(self.seed, _STALL, step, *_keys(layout, ranks))
        if self.model == "gc":
            return np.where(u < 1.0 / self.period_steps, self.duration_s, 0.0)
        return -self.mean_s * np.log(u)

    def sampled_stall_s(self, layout: Layout, ranks: np.ndarray) -> float:
        """Mean over ``steps`` sampled steps of the longest pause among ``ranks`` (s): what each
        step waits for."""
        return float(np.mean([self.draws(layout, ranks, k).max() for k in range(self.steps)]))

    def expected_stall_s(self, processes: int) -> float:
        """The closed form of :meth:`sampled_stall_s` for ``processes`` independent processes
        (s): ``duration × (1 − (1 − 1/period)^P)`` (gc), ``mean × H_P`` (exponential)."""
        if self.model == "gc":
            return self.duration_s * (1.0 - (1.0 - 1.0 / self.period_steps) ** processes)
        return self.mean_s * float(np.sum(1.0 / np.arange(1, processes + 1)))
