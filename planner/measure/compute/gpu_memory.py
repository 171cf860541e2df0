"""Activation memory of Llama-style transformer blocks on a GPU: the bytes a block (bf16, flash
SDPA, micro-batch 1) keeps for its backward at long sequences, and the peak over forward and
backward (``memory.csv`` of ``python -m planner.measure.tables.gpu_dlrm --only memory``, which
runs it beside the DLRM parts on a lent GPU).
"""

from __future__ import annotations

import time
from pathlib import Path

from planner.measure.compute.gpu_blocks import block_class
from planner.measure.compute.gpu_timing import CsvRows, flash_ctx, torch_module

__all__ = ["MEMORY_BLOCKS", "measure_memory"]

#: (hidden, ffn, heads, kv heads, seq, layers) of the activation-memory probe
MEMORY_BLOCKS = [(4096, 14336, 32, 8, s, 2) for s in (4096, 16384, 32768, 65536)] + \
    [(8192, 28672, 64, 8, s, 1) for s in (8192, 32768)]


def measure_memory(dev, *, quick: bool, samples: int, out: Path, deadline: float) -> int:
    """Bytes a Llama-style block (bf16, flash SDPA, micro-batch 1) keeps for backward: memory
    allocated after the forward minus before, per layer, and the peak over forward+backward."""
    del samples
    torch = torch_module()
    Block = block_class()
    rows, n = CsvRows(out / "memory.csv"), 0
    configs = [(256, 512, 4, 2, 128, 2)] if quick else MEMORY_BLOCKS
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for (h, f, heads, kv, seq, layers) in configs:
        if time.monotonic() > deadline:
            break
        blocks = torch.nn.Sequential(*[Block(h, f, heads, kv) for _ in range(layers)]) \
            .to(dev, dt)
        x = torch.randn(1, seq, h, device=dev, dtype=dt, requires_grad=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
        with flash_ctx()():
            y = blocks(x)
            kept = (torch.cuda.memory_allocated(dev) - before) if dev.type == "cuda" else 0
            y.sum().backward()
        peak = (torch.cuda.max_memory_allocated(dev) - before) if dev.type == "cuda" else 0
        rows.add(dict(hidden=h, ffn=f, heads=heads, kv_heads=kv, seq=seq, micro_batch=1,
                      layers=layers, dtype=str(dt).removeprefix("torch."),
                      kept_bytes_per_layer=kept / layers, peak_bytes=peak,
                      param_bytes=sum(p.numel() * p.element_size() for p in blocks.parameters())))
        n += 1
        del blocks, x, y
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    rows.close()
    return n
