"""Host (CPU) time an eager PyTorch trainer spends issuing one transformer block's kernels.

A GPU runs asynchronously behind its host: the CPU walks the Python module, dispatches every
aten op and launches its kernel, then moves on. When a block's kernels are tiny (small hidden
size, micro-batch 1, high TP) the GPU finishes each kernel before the host has issued the next,
and a pass takes the host's time instead of the GPU's: ``max(gpu_s, host_s)`` per block pass.
vTrain's single-node Megatron-DeepSpeed runs show that floor (about 2–3 ms per block and
micro-batch for forward + recompute + backward, independent of size at small work).

Which file: machines of a GPU kind with a fitted or measured host of their own read
``traces/calibration/host-overhead-<gpu>.yaml`` (:func:`host_file_for`): the A100's is fitted by
``clusterplan calibrate steps`` to vTrain's single-node Megatron-DeepSpeed runs (15.5 µs per
aten op). Every other kind reads the CPU stand-in below.

The stand-in is *measured*, by :func:`planner.measure.compute.host.measure_host_overhead`: a Megatron-style GPT block
(pre-LN, fused QKV, baddbmm scores, masked softmax, dropout, bmm, output projection, GELU MLP,
residuals; sequence-first layout) with tiny tensors, run eagerly on the CPU with one thread,
forward, backward and full-recompute backward (``torch.utils.checkpoint``), median of repeats.
With tiny tensors a CPU op costs its dispatch plus a ~µs kernel, about what an eager GPU op
costs its host (dispatch plus cudaLaunchKernel); the measurement therefore stands in for the
host side of a GPU run. It depends on the CPU and the PyTorch version: re-measure with
``clusterplan calibrate host`` on the training cluster's hosts. CUDA graphs and
``torch.compile`` remove most of it; pass ``host=None`` to model such a trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text

__all__ = ["HostOverhead", "load_host_overhead", "host_overhead_for", "host_file_for"]

DEFAULT = "host-overhead-torch-eager.yaml"


@dataclass(frozen=True, slots=True)
class HostOverhead:
    """Host seconds per transformer block and micro-batch, by pass."""

    forward_s: float          # one block forward
    backward_s: float         # one block backward (autograd), without recompute
    recompute_s: float        # extra host time of full recompute (re-run forward, checkpoint)
    source: str = ""
    forward_ops: float = 53.0     # aten ops a block's forward dispatches (the probe's count)
    backward_ops: float = 84.0    # aten ops of its backward (autograd nodes and accumulation)

    def __post_init__(self) -> None:
        for k in ("forward_s", "backward_s", "recompute_s"):
            v = getattr(self, k)
            if not v >= 0:
                raise SpecError(f"{k} must be non-negative seconds, got {v!r}", field=k,
                                fix="re-measure with `clusterplan calibrate host`")
        for k in ("forward_ops", "backward_ops"):
            if not getattr(self, k) > 0:
                raise SpecError(f"{k} must be a positive op count, got {getattr(self, k)!r}",
                                field=f"aten_ops_per_block.{k.split('_')[0]}",
                                fix="regenerate the file with `clusterplan calibrate host --out FILE`")

    @property
    def forward_op_s(self) -> float:
        """Host seconds per aten op of a forward pass (block time / ops it dispatches)."""
        return self.forward_s / self.forward_ops

    @property
    def backward_op_s(self) -> float:
        """Host seconds per aten op of a backward pass."""
        return self.backward_s / self.backward_ops

    def backward_pass_s(self, recompute: str) -> float:
        """Host seconds of one block's backward pass under the given recompute mode."""
        return self.backward_s + (self.recompute_s if recompute == "full" else 0.0)


@lru_cache(maxsize=None)
def load_host_overhead(name: str = DEFAULT) -> HostOverhead:
    """The measured host overhead shipped in ``traces/calibration/``, or a file path."""
    path = Path(name) if ("/" in name or Path(name).exists()) else \
        resources.files("traces") / "calibration" / name
    where = str(path) if isinstance(path, Path) else f"traces/calibration/{name}"
    if isinstance(path, Path):
        text = read_text(path, missing_fix="run `clusterplan calibrate host --out FILE`")
    else:
        try:
            text = path.read_text()
        except OSError as e:
            raise SpecError(f"cannot read host-overhead file ({e.strerror})", source=where,
                            fix="run `clusterplan calibrate host --out FILE`") from None
    doc = parse_yaml(text, source=where)
    try:
        per = doc["per_block_s"]
        ops = doc.get("aten_ops_per_block") or {}
        fwd_ops = float(ops.get("forward", 53.0))
        bwd_ops = float(ops["backward"]) if "backward" in ops else (
            float(ops["plain"]) - fwd_ops if "plain" in ops else 84.0)
        return HostOverhead(forward_s=float(per["forward"]), backward_s=float(per["backward"]),
                            recompute_s=float(per["recompute_extra"]),
                            source=f"{where}: {doc.get('method', '')}".strip(),
                            forward_ops=fwd_ops, backward_ops=bwd_ops)
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(f"malformed host-overhead file ({e})", source=where,
                        field="per_block_s",
                        fix="regenerate it with `clusterplan calibrate host --out FILE`") from None


def host_file_for(gpu: str) -> str:
    """The host-overhead file for machines of GPU kind ``gpu``: ``host-overhead-<gpu>.yaml`` in
    ``traces/calibration/`` where one was fitted or measured on such machines, else the CPU
    stand-in :data:`DEFAULT`."""
    own = f"host-overhead-{gpu}.yaml"
    return own if (resources.files("traces") / "calibration" / own).is_file() else DEFAULT


def host_overhead_for(gpu: str) -> HostOverhead:
    """The host floor of eager PyTorch on machines of GPU kind ``gpu`` (see :func:`host_file_for`)."""
    return load_host_overhead(host_file_for(gpu))
