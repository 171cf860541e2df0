"""Measure eager PyTorch's host time per transformer block (``clusterplan calibrate host``):
the numbers :mod:`planner.model.llm.host` reads. A Megatron-style GPT block with tiny tensors runs
eagerly (one thread on the CPU, or on a GPU with a synchronise per run), forward, backward and
full-recompute backward, median of repeats; the YAML it writes goes to ``traces/calibration/``."""

from __future__ import annotations

import platform
import statistics
import time

import yaml

from simulator.errors import SpecError

__all__ = ["measure_host_overhead", "host_overhead_yaml"]


def measure_host_overhead(*, layers: int = 24, repeats: int = 40, warmup: int = 10,
                          device: str = "cpu") -> dict:
    """Run the microbenchmark; returns the YAML document (seconds) with its spread.

    ``device="cuda"`` runs the same tiny block on a GPU: each run ends with a synchronise, and
    with tiny kernels the wall time is the host's dispatch and launch, as a real GPU trainer
    pays it (the CPU run is the stand-in where no GPU is at hand).
    """
    try:
        import torch
    except ImportError:
        raise SpecError("torch is not installed", field="calibrate host",
                        fix="pip install -e '.[torch]' (torch 2.13.0 CPU)") from None
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device(device)
    Block = _gpt_block_class(torch)
    blocks = torch.nn.ModuleList(Block(64, 4) for _ in range(layers)).to(dev)
    x0 = torch.randn(8, 1, 64, requires_grad=True, device=dev)

    def run(mode: str) -> None:
        x = x0
        for blk in blocks:
            x = checkpoint(blk, x, use_reentrant=False) if mode == "recompute" else blk(x)
        if mode != "forward":
            x.sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    modes = ("forward", "plain", "recompute")
    times = _time_modes(run, modes, warmup=warmup, repeats=repeats, layers=layers)
    fwd, fwd_iqr = _median_and_iqr(times["forward"])
    plain, plain_iqr = _median_and_iqr(times["plain"])
    rec, rec_iqr = _median_and_iqr(times["recompute"])
    counts = {mode: _aten_ops(run, mode) / layers for mode in modes}
    return {
        "method": ("Megatron-style GPT block (h=64, 4 heads, s=8, b=1), eager PyTorch on "
                   + ("the CPU, 1 thread" if dev.type == "cpu" else
                      f"{torch.cuda.get_device_name(dev)} (synchronised per run)")
                   + "; per-block median of repeated forward, forward+backward and "
                   "full-recompute forward+backward; tiny tensors, so the time is dispatch and "
                   "launch, not arithmetic"),
        "command": "clusterplan calibrate host",
        "torch": str(torch.__version__), "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(), "device": str(dev),
        "date": time.strftime("%Y-%m-%d"),
        "per_block_s": {"forward": fwd, "backward": max(0.0, plain - fwd),
                        "recompute_extra": max(0.0, rec - plain)},
        "aten_ops_per_block": counts,
        "noise_iqr_over_median": {"forward": fwd_iqr, "forward_backward": plain_iqr,
                                  "recompute_forward_backward": rec_iqr},
        "repeats": repeats, "layers": layers,
    }


def _gpt_block_class(torch):
    """A Megatron-style GPT block (LayerNorm, fused QKV, masked softmax attention with dropout,
    GELU MLP) as an ``nn.Module`` class, built when torch is at hand."""
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, h: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            s, b, h = x.shape
            a, d = self.heads, h // self.heads
            q, k, v = self.qkv(self.ln1(x)).view(s, b, a, 3 * d).split(d, dim=-1)
            q, k, v = (t.reshape(s, b * a, d).transpose(0, 1) for t in (q, k, v))
            scores = torch.baddbmm(torch.empty(b * a, s, s, device=x.device), q,
                                   k.transpose(1, 2), beta=0.0, alpha=d ** -0.5)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            probs = F.dropout(torch.softmax(scores.masked_fill(mask, -1e4), -1), 0.1, True)
            ctx = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, h)
            x = x + F.dropout(self.out(ctx), 0.1, True)
            return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), 0.1, True)

    return Block


def _time_modes(run, modes, *, warmup: int, repeats: int,
                layers: int) -> dict[str, list[float]]:
    """Seconds per block of ``run(mode)`` for each mode, ``repeats`` times after ``warmup``.
    A training forward records the autograd graph, so it is timed with grad enabled; the
    modes take turns in every round so that drift in the machine's load hits all alike."""
    for _ in range(warmup):
        for mode in modes:
            run(mode)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode in modes:
            t0 = time.perf_counter()
            run(mode)
            times[mode].append((time.perf_counter() - t0) / layers)
    return times


def _median_and_iqr(ts: list[float]) -> tuple[float, float]:
    """The median and the inter-quartile range over the median."""
    q = statistics.quantiles(ts, n=4)
    return statistics.median(ts), (q[2] - q[0]) / statistics.median(ts)


def _aten_ops(run, mode: str) -> int:
    """ATen ops dispatched by one ``run(mode)``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    with Count() as c:
        run(mode)
    return c.ops


def host_overhead_yaml(doc: dict) -> str:
    """The document of :func:`measure_host_overhead` as the YAML file the model reads."""
    return ("# Host overhead of eager PyTorch per transformer block (seconds); "
            "see planner/model/llm/host.py\n" + yaml.safe_dump(doc, sort_keys=False))
