"""How a transformer's layers, parameters, gradient buckets and pipeline activations divide
over the ranks of a TP/CP/PP/DP layout: exact counts per rank, shared by the simulated step
(:mod:`planner.workloads.llm.step`) and the real run that validates it
(:mod:`planner.measure.validate.llm_worker`)."""

from __future__ import annotations

from planner.model.llm.kernels import bytes_per_element
from planner.model.llm.spec import LLMSpec, ParallelSpec

__all__ = ["dp_bucket_elements", "rank_params", "vstage_layer_offsets",
           "p2p_activation_bytes"]


def dp_bucket_elements(elements: int, buckets: int) -> list[int]:
    """Elements of each gradient bucket: ``buckets`` near-equal slices of a flat buffer of
    ``elements`` (the last micro-batch's backward fills them in order).

    >>> dp_bucket_elements(10, 4)
    [2, 3, 2, 3]
    """
    if buckets <= 0:
        return []
    return [(j + 1) * elements // buckets - j * elements // buckets for j in range(buckets)]


def rank_params(spec: LLMSpec, p: ParallelSpec, chunk_layers: list[list[int]], s: int,
                c: int) -> int:
    """Parameters one tensor-parallel rank holds for chunk ``c`` of stage ``s``, exactly:
    per block two norm weights (replicated over TP) plus 1/tp of the QKV, output and MLP
    matrices (K and V heads replicated when tp exceeds their count); the vocabulary-parallel
    input embedding on the first virtual stage; the final norm and the vocabulary-parallel
    output layer (untied) on the last. The vocabulary is padded up to a multiple of tp."""
    m = spec.model
    h, f, tp = m.hidden_size, m.ffn_hidden_size, p.tp
    kv = m.num_kv_heads * m.head_dim
    mats = 3 if m.ffn == "swiglu" else 2
    kv_local = m.head_dim if tp > m.num_kv_heads else kv // tp
    per_layer = 2 * h + h * (h // tp) + 2 * h * kv_local + (h // tp) * h + mats * h * (f // tp)
    n = chunk_layers[s][c] * per_layer
    vs, nv = c * p.pp + s, p.pp * p.vpp
    vocab_local = -(-m.vocab_size // tp)
    if vs == 0:
        n += vocab_local * h
    if vs == nv - 1:
        n += vocab_local * h + h
    return n


def vstage_layer_offsets(chunk_layers: list[list[int]], pp: int, vpp: int) -> list[int]:
    """Global index of the first block of each virtual stage ``c·pp + s`` (blocks are
    contiguous in virtual-stage order, as Megatron and torchtitan place them).

    >>> vstage_layer_offsets([[2, 1], [2, 1]], pp=2, vpp=2)
    [0, 2, 4, 5]
    """
    out, n = [], 0
    for vs in range(pp * vpp):
        out.append(n)
        n += chunk_layers[vs % pp][vs // pp]
    return out


def p2p_activation_bytes(spec: LLMSpec, p: ParallelSpec, *, sequence_parallel: bool,
                         scatter_gather: bool | None = None,
                         expanded: bool = False) -> tuple[float, bool]:
    """Bytes of one pipeline send (activation or its gradient) per TP rank, and whether the
    receiver all-gathers it over TP (an explicit op; expanded step only).

    ``scatter_gather=None`` keeps each mode's assumption (see :func:`build_step`): 1/tp in the
    folded step; in the expanded step 1/tp with sequence parallelism (the activation is
    sequence-sharded already), the whole activation without."""
    m, t = spec.model, spec.training
    e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
    T = t.micro_batch_size * m.seq_len / p.cp
    if scatter_gather is None:
        scatter_gather = sequence_parallel if expanded else True
    sliced = scatter_gather or (expanded and sequence_parallel)
    gather = expanded and scatter_gather and not sequence_parallel and p.tp > 1
    return (T * m.hidden_size * e / p.tp if sliced else T * m.hidden_size * e), gather
