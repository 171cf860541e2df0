"""How a transformer's blocks split over pipeline stages and their virtual-stage chunks.

Blocks divide evenly, the remainder going to the middle stages (the first stage also holds the
embedding, the last the logits and loss). ``trim`` takes that many blocks off the first and the
last stage (Llama 3's balance, Megatron-Core's ``--decoder-first/last-pipeline-num-layers``):
the end stages get ``⌊(layers + 2·trim)/pp⌋ − trim`` blocks each and the middle stages share
the rest evenly (with two stages there is no middle, and trimming changes nothing); with interleaving
the trimmed blocks come off the first chunk of the first stage and the last chunk of the last.

>>> stage_layers(126, 16, trim=1)[:3], stage_layers(126, 16, trim=1)[-1]
([7, 8, 8], 7)
>>> chunk_layer_counts(10, pp=2, vpp=2)
[[3, 2], [3, 2]]
>>> chunk_layer_counts(126, pp=16, vpp=2, trim=1)[0], chunk_layer_counts(126, 16, 2, trim=1)[15]
([3, 4], [4, 3])
"""

from __future__ import annotations

from simulator.errors import SpecError

__all__ = ["stage_layers", "chunk_layer_counts"]


def _even(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    out = [base] * parts
    for i in range(extra):
        out[(parts // 2 + i) % parts] += 1
    return out


def stage_layers(layers: int, pp: int, trim: int = 0) -> list[int]:
    """Blocks per pipeline stage."""
    if trim == 0 or pp == 1:
        return _even(layers, pp)
    end = (layers + 2 * trim) // pp - trim
    out = [end] + (_even(layers - 2 * end, pp - 2) if pp > 2 else []) + [end]
    if pp == 2:
        out = _even(layers, 2)
    if min(out) < 0 or sum(out) != layers:
        raise SpecError(f"trimming {trim} blocks off the first and last of {pp} stages leaves "
                        f"a stage with {min(out)} of the {layers} blocks",
                        field="trainer.trim_first_last_stage",
                        fix="lower trim_first_last_stage or pp")
    return out


def chunk_layer_counts(layers: int, pp: int, vpp: int, trim: int = 0) -> list[list[int]]:
    """Blocks of each (stage, chunk): :func:`stage_layers` per stage, split over its ``vpp``
    chunks with the remainder on the first ones (trimmed blocks off the end chunks)."""
    out = []
    for s, n in enumerate(stage_layers(layers, pp, trim)):
        cut = trim if pp > 1 and s in (0, pp - 1) else 0
        base, extra = divmod(n + cut, vpp)
        row = [base + (1 if c < extra else 0) for c in range(vpp)]
        if cut and s == 0:
            row[0] -= cut
        elif cut:
            row[-1] -= cut
        if min(row) < 0:
            raise SpecError(f"trimming {trim} blocks leaves a chunk of stage {s} with "
                            f"{min(row)} blocks", field="trainer.trim_first_last_stage",
                            fix="lower trim_first_last_stage or vpp")
        out.append(row)
    return out
