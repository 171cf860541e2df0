"""The longest sequence a layout trains, with and without token-wise activation swap (MEMO,
papers.md §6): a search over ``seq_len`` for the largest that fits in GPU memory (and, with
offload, whose mandatory swapped tensors fit in host memory), and the step there.

>>> from simulator.topology import load_topology
>>> from planner.model.llm.spec import load_llm_spec, parse_parallel
>>> spec = load_llm_spec("llama3-8b")
>>> out = longest_sequence(spec, parse_parallel("tp=8,pp=1,dp=1"), load_topology("dgx-h100"),
...                        step=16384, limit=2**20)
>>> out["seq_len"] % 16384, out["fits"]
(0, True)
"""

from __future__ import annotations

from dataclasses import replace

from simulator.topology import Topology

from planner.llm.metrics import LLMResult, simulate_llm
from planner.model.llm.spec import LLMSpec, ParallelSpec

__all__ = ["longest_sequence", "fits"]


def fits(res: LLMResult) -> bool:
    """GPU memory holds the step and, with offload, host memory holds what it swaps."""
    o = res.plan.info.get("offload")
    return res.memory.fits and (o is None or o.host_bytes <= o.host_bytes_per_gpu)


def _at(spec: LLMSpec, seq: int) -> LLMSpec:
    return replace(spec, model=replace(spec.model, seq_len=seq))


def longest_sequence(spec: LLMSpec, parallel: ParallelSpec, topo: Topology, *,
                     step: int = 8192, limit: int = 2**23) -> dict:
    """The largest ``seq_len`` (a multiple of ``step`` tokens, at most ``limit``) whose step fits;
    ``{"seq_len", "fits", "result"}`` (``seq_len`` 0 and no result when not even ``step`` fits).
    Memory grows with the sequence, so a bisection finds it."""
    lo, hi = 0, limit // step                       # in units of step: lo fits, hi + 1 does not
    best = None
    res = simulate_llm(_at(spec, step * hi), parallel, topo)
    if fits(res):
        return {"seq_len": step * hi, "fits": True, "result": res}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        res = simulate_llm(_at(spec, step * mid), parallel, topo)
        if fits(res):
            lo, best = mid, res
        else:
            hi = mid
    return {"seq_len": step * lo, "fits": best is not None, "result": best}
