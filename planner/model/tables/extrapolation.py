"""Where a cost model's lookup times come from outside what was measured, one line each for
the output's ``extrapolated`` list: the CPU profile of another host, a GPU's constants taken
from another kind, priors on a kind never measured, inputs outside the fitted ranges, and a
sparse-gradient path priced from its bytes alone."""

from __future__ import annotations

from planner.model.tables.gpu_lookup import gpu_lookup_file

__all__ = ["lookup_extrapolated"]


def lookup_extrapolated(cost) -> list[str]:
    """The lines for ``cost`` (a :class:`~.cost.CostModel`): one per input (dim, pooling,
    batch) outside the measured range, one when the CPU profile was measured on another kind
    of host, one saying the constants are priors because this device kind was never measured,
    and one when the trainer's sparse-gradient path, timed from its bytes alone, prices the
    lookups."""
    lines = _measurement_lines(cost)
    if cost.sparse_grad is not None:
        lines.append("the sparse-gradient embedding path (trainer embedding_update: "
                     f"{cost.model.trainer.embedding_update}) is priced from its bytes at "
                     "the measured gather and streaming bandwidths: its kernels were never "
                     "timed")
    return lines


def _measurement_lines(cost) -> list[str]:
    model, fit = cost.model, cost.fit_range
    profile = cost.device_profile
    if profile is not None and profile.other_host:
        return [f"the CPU profile {profile.source} was measured on another "
                f"host: {profile.other_host}; `clusterplan calibrate embedding` "
                "measures this one (a few minutes)"] + (
            fit.outside(model) if fit is not None else [])
    gl = cost.gpu_lookup
    if gl is not None and gl.transferred:
        return [f"lookup constants measured on {gl.measured_on} ({gl.kernel}), applied as "
                f"fractions of {gl.gpu}'s HBM bandwidth: no lookup measurement of {gl.gpu} "
                "(measure one with python -m planner.measure.tables.gpu_dlrm and run "
                "`clusterplan calibrate gpu-embedding`)"] + fit.outside(model)
    if gl is not None and gl.backward_from and cost.sparse_grad is None:
        return [f"lookup backward constants measured on {gl.backward_from}, applied to "
                f"{gl.gpu}: its own backward was measured with a kernel that waits for the "
                "host, which FBGEMM's does not (traces/calibration/"
                f"{gpu_lookup_file(gl.gpu)})"] + fit.outside(model)
    if fit is not None:
        return fit.outside(model)
    cfg = cost.config
    if cfg.device_profile is None:
        return []
    return [f"lookup constants are priors (HBM efficiency {cfg.hbm_efficiency:g}, "
            f"{cfg.lookup_overhead_bytes:g} B per lookup): no embedding measurement "
            f"of {cost.topo.gpu.name} (measure one and run `clusterplan calibrate "
            "gpu-embedding`)"]
