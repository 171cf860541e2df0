"""Token-wise activation swap and recompute for long contexts (MEMO, Zhao et al. SIGMOD 2025;
papers.md §6).

A block keeps *skeletal* tensors from its forward for its backward (planner/model/llm/
activations.py). MEMO always offloads two of them to host memory, the block input ``S_in`` and
the attention output ``S_attn``, and of the others (``S_oth``) offloads a fraction ``α`` of the
tokens and drops the rest; before the block's backward it loads what it offloaded and recomputes
the dropped tokens, which needs no attention (its output was kept). The largest ``α`` that
neither stalls the forward nor overflows host memory (§6.3's linear program, in closed form)::

    α* = clip(min[(B·T_layer − S_in − S_attn) / S_oth, (M_host/(n − 2) − S_in − S_attn) / S_oth],
              0, 1)

``B`` the GPU's device-to-host bandwidth with every GPU of the node copying at once, ``T_layer``
one block's forward, ``M_host`` the host memory per GPU, ``n`` the blocks (the last two go
straight to their backward and are not offloaded). The swap runs on its own copy streams, two
GPU buffers deep (the simulated step issues it so: planner/workloads/llm/emit.py).

The spec section (under ``training:``; ``activation_recompute`` must be ``none``)::

    offload: {alpha: auto}        # or a fraction in [0, 1]

>>> alpha_closed_form(copy_Bps=50e9, layer_s=0.1, host_bytes=1e12, layers=32,
...                   s_in=1e9, s_attn=1e9, s_oth=14e9)
(0.2142, 'pcie')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import SpecError
from simulator.validation import Fields

__all__ = ["OffloadSpec", "OffloadPlan", "parse_offload", "alpha_closed_form", "skeletal_split",
           "host_copy_Bps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSpec:
    """``training.offload``: ``alpha`` the offloaded share of the other skeletal tokens, or
    ``None`` for MEMO's closed form."""

    alpha: float | None = None

    def to_dict(self) -> dict:
        return {"alpha": "auto" if self.alpha is None else self.alpha}


def parse_offload(f: Fields) -> OffloadSpec:
    f.check_keys({"alpha"})
    raw = f.data.get("alpha", "auto")
    if raw == "auto" or raw is None:
        return OffloadSpec()
    alpha = f.float("alpha", minimum=0.0, maximum=1.0)
    if not math.isfinite(alpha):
        raise f.err("alpha", f"alpha {raw!r} is not a fraction", "write auto or 0..1")
    return OffloadSpec(alpha=alpha)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadPlan:
    """What one block swaps and recomputes, per TP/CP rank; bytes and seconds."""

    alpha: float
    bound: str              # what set alpha: pcie, host memory, given, none needed
    s_in: float
    s_attn: float
    s_oth: float
    copy_Bps: float         # device-to-host (and back) bandwidth per GPU, all GPUs copying
    host_bytes_per_gpu: float
    layers: int

    @property
    def swap_bytes(self) -> float:
        """Bytes one offloaded block moves each way."""
        return self.s_in + self.s_attn + self.alpha * self.s_oth

    @property
    def full_bytes(self) -> float:
        """Skeletal bytes of one block (what it keeps without offload)."""
        return self.s_in + self.s_attn + self.s_oth

    @property
    def swap_s(self) -> float:
        return self.swap_bytes / self.copy_Bps

    @property
    def host_bytes(self) -> float:
        """Host memory the offloaded blocks hold per GPU."""
        return max(0, self.layers - 2) * self.swap_bytes

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "bound": self.bound, "swap_bytes_per_layer": self.swap_bytes,
                "skeletal_bytes_per_layer": self.full_bytes, "copy_Bps": self.copy_Bps,
                "swap_s_per_layer": self.swap_s, "host_bytes": self.host_bytes,
                "host_bytes_per_gpu": self.host_bytes_per_gpu}


def alpha_closed_form(*, copy_Bps: float, layer_s: float, host_bytes: float, layers: int,
                      s_in: float, s_attn: float, s_oth: float) -> tuple[float, str]:
    """(α*, the binding constraint: ``pcie``, ``host memory``, or none when both allow
    offloading everything), rounded down to 4 places."""
    mandatory = s_in + s_attn
    if s_oth <= 0:
        return 1.0, "none needed"
    by_pcie = (copy_Bps * layer_s - mandatory) / s_oth
    by_host = (host_bytes / max(1, layers - 2) - mandatory) / s_oth
    bound = "pcie" if by_pcie <= by_host else "host memory"
    if min(by_pcie, by_host) >= 1.0:
        bound = "none (everything offloaded)"
    # rounded down, so that the swap never needs more than the bound allows
    return math.floor(min(1.0, max(0.0, min(by_pcie, by_host))) * 1e4) / 1e4, bound


def skeletal_split(terms: dict[str, float]) -> tuple[float, float, float]:
    """(S_in, S_attn, S_oth) of a block's kept tensors (:func:`block_terms` with no recompute):
    the block input, the attention output, and the rest."""
    s_in = terms.get("norm1_input", 0.0)
    s_attn = terms.get("attn_out", 0.0)
    return s_in, s_attn, sum(terms.values()) - s_in - s_attn


def host_copy_Bps(params: dict, pcie_efficiency: float) -> float:
    """A GPU's host-copy bandwidth (bytes/s per direction) with every GPU of its node copying:
    the PCIe line rate at the topology's PCIe efficiency, divided among the GPUs that share one
    uplink (``node.host_links``)."""
    gpus = int(params.get("gpus_per_node", 1))
    share = min(1.0, int(params.get("host_links", gpus)) / gpus)
    return float(params.get("pcie_Bps", 0.0)) * pcie_efficiency * share


def check_offload(spec_source: str, recompute: str, pp: int) -> None:
    """Settings MEMO's swap does not combine with (SpecError, exit 2)."""
    if recompute != "none":
        raise SpecError(f"activation_recompute {recompute} with offload: token-wise swap "
                        "replaces recomputation", source=spec_source,
                        field="training.activation_recompute",
                        fix="set activation_recompute: none with offload")
    if pp > 1:
        raise SpecError(f"offload with pp={pp}: stage-aware swap is not modelled yet",
                        source=spec_source, field="training.offload",
                        fix="use pp=1 (MEMO trains with TP/SP and CP), or drop offload")
