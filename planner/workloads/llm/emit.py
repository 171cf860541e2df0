"""The expanded step's passes: every TP/CP collective of a stage representative's forward and
backward as its own op, in the order a Megatron-style trainer issues them
(:func:`planner.workloads.llm.step.build_step` with ``expand_collectives=True``)."""

from __future__ import annotations

from simulator.workload import Workload

from planner.model.llm.kernels import bytes_per_element
from planner.model.llm.layout import Layout
from planner.model.llm.offload import OffloadPlan
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.workloads.llm.partition import vstage_layer_offsets

__all__ = ["PassEmitter"]


class _Chain:
    """Ops issued one after another on a representative's compute stream."""

    def __init__(self, deps: list[int]) -> None:
        self.deps = list(deps)
        self.last: int | None = None

    def add(self, oid: int | None) -> None:
        if oid is not None:
            self.deps, self.last = [oid], oid


class PassEmitter:
    """Forward and backward passes of a stage representative with explicit TP/CP collectives.

    Op names (a real run names what it issues the same way, see ``planner/measure/validate``):
    ``F|B mb<m> c<c>`` marks a pass (zero duration, category ``pass``); compute ops are
    ``F|R|B mb<m> c<c> l<layer>`` (R: the full-recompute forward) and ``... embed|logits``;
    collectives are ``tp attn|mlp F|R|B mb<m> c<c> l<layer>`` (all-reduces), ``sp attn|mlp
    in|out ...`` (sequence-parallel all-gathers and reduce-scatters), ``cp kv|dkv ...``,
    ``tp embed F``, ``tp xent max|target|sumexp F`` (fp32 per token: the vocabulary-parallel
    cross entropy), ``tp logits B`` and ``tp p2p gather F|B`` (scatter-gather)."""

    def __init__(self, w: Workload, spec: LLMSpec, p: ParallelSpec, lay: Layout,
                 reps: list[int], detail: dict, chunk_layers: list[list[int]], *,
                 sequence_parallel: bool, offload: OffloadPlan | None = None) -> None:
        m, t = spec.model, spec.training
        self.w, self.p, self.reps, self.d = w, p, reps, detail
        e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
        T = t.micro_batch_size * m.seq_len / p.cp
        self.act = T * m.hidden_size * e
        self.xent = T * 4
        self.kv = p.cp * 2 * T * m.num_kv_heads * m.head_dim * e / min(p.tp, m.num_kv_heads)
        self.sp = sequence_parallel and p.tp > 1
        self.full = t.activation_recompute == "full"
        self.groups = {"tp": [lay.group("tp", r) for r in reps],
                       "cp": [lay.group("cp", r) for r in reps]}
        self.chunk_layers = chunk_layers
        self.offsets = vstage_layer_offsets(chunk_layers, p.pp, p.vpp)
        self.nv = p.pp * p.vpp
        self.offload = offload
        self.d2h: dict[tuple[str, int], int] = {}    # (pass tag, layer) -> its swap-out op
        self.b_end: dict[tuple[str, int], int] = {}  # (pass tag, layer) -> its backward's end

    def _swapped(self, layer: int) -> bool:
        """Whether ``layer`` is offloaded: all but the last two blocks (MEMO, pp = 1)."""
        return self.offload is not None and 0 <= layer < self.offload.layers - 2

    def _layers(self, s: int, c: int) -> range:
        first = self.offsets[c * self.p.pp + s]
        return range(first, first + self.chunk_layers[s][c])

    def _comp(self, s: int, ch: _Chain, name: str, seconds: float, category: str) -> None:
        ch.add(self.w.compute(self.reps[s], name, duration_s=seconds, deps=ch.deps,
                              category=category))

    def _coll(self, s: int, ch: _Chain, axis: str, kind: str, size: float, name: str) -> None:
        g = self.groups[axis][s]
        if len(g) > 1:
            cat = "tp" if axis == "tp" else "cp"
            ch.add(self.w.collective(kind, g, size, name=name, stream="compute", deps=ch.deps,
                                     category=cat))

    def _block_forward(self, s: int, ch: _Chain, ps: str, tag: str, layer: int) -> None:
        at = f"{ps} {tag} l{layer}"
        if self.p.cp > 1:
            self._coll(s, ch, "cp", "allgather", self.kv, f"cp kv {at}")
        seconds = self.d["layer_fwd_s" if ps == "F" else "layer_recompute_s"][s]
        cat = "fwd" if ps == "F" else "bwd"
        if self.sp:
            self._comp(s, ch, at, seconds, cat)
            for part in ("attn", "mlp"):
                self._coll(s, ch, "tp", "allgather", self.act, f"sp {part} in {at}")
                self._coll(s, ch, "tp", "reducescatter", self.act, f"sp {part} out {at}")
        elif len(self.groups["tp"][s]) > 1:
            # the attention half, its all-reduce, the MLP half, its all-reduce (as a real
            # block runs them; a call after compute costs more than one right after another)
            frac = self.d["layer_attn_frac_f"][s]
            self._comp(s, ch, at, seconds * frac, cat)
            self._coll(s, ch, "tp", "allreduce", self.act, f"tp attn {at}")
            self._comp(s, ch, f"{at} mlp", seconds * (1.0 - frac), cat)
            self._coll(s, ch, "tp", "allreduce", self.act, f"tp mlp {at}")
        else:
            self._comp(s, ch, at, seconds, cat)

    def _block_backward(self, s: int, ch: _Chain, tag: str, layer: int) -> None:
        if self.full:
            self._block_forward(s, ch, "R", tag, layer)
        at = f"B {tag} l{layer}"
        if self.p.cp > 1:
            self._coll(s, ch, "cp", "allgather", self.kv, f"cp kv {at}")
        seconds = self.d["layer_bwd_s"][s]
        split = not self.sp and len(self.groups["tp"][s]) > 1
        mlp_part = seconds * (1.0 - self.d["layer_attn_frac_b"][s]) if split else seconds
        self._comp(s, ch, at, mlp_part, "bwd")
        if self.sp:
            self._coll(s, ch, "tp", "allgather", self.act, f"sp mlp out {at}")
            self._coll(s, ch, "tp", "reducescatter", self.act, f"sp mlp in {at}")
        else:
            self._coll(s, ch, "tp", "allreduce", self.act, f"tp mlp {at}")
        if split:
            self._comp(s, ch, f"{at} attn", seconds - mlp_part, "bwd")
        if self.p.cp > 1:
            self._coll(s, ch, "cp", "reducescatter", self.kv, f"cp dkv {at}")
        if self.sp:
            self._coll(s, ch, "tp", "allgather", self.act, f"sp attn out {at}")
            self._coll(s, ch, "tp", "reducescatter", self.act, f"sp attn in {at}")
        else:
            self._coll(s, ch, "tp", "allreduce", self.act, f"tp attn {at}")

    def _swap_in(self, s: int, ch: _Chain, tag: str, layer: int) -> None:
        """Load ``layer``'s offloaded tensors once the backward two blocks later has freed their
        buffer, then recompute its dropped tokens (no attention) before its backward."""
        o = self.offload
        deps = [self.d2h[(tag, layer)]] + ([self.b_end[(tag, layer + 2)]]
                                           if (tag, layer + 2) in self.b_end else [])
        h2d = self.w.compute(self.reps[s], f"H2D {tag} l{layer}", duration_s=o.swap_s,
                             stream="h2d", deps=deps, category="offload")
        ch.deps = ch.deps + [h2d]
        linear = max(0.0, self.d["layer_fwd_s"][s] - self.d["layer_attention_s"][s][0])
        self._comp(s, ch, f"R {tag} l{layer} tokens", (1.0 - o.alpha) * linear, "bwd")

    def forward(self, s: int, c: int, mb: int, deps: list[int], *, gather: bool) -> int:
        vs, tag = c * self.p.pp + s, f"mb{mb} c{c}"
        ch = _Chain(deps)
        self._comp(s, ch, f"F {tag}", 0.0, "pass")
        if gather:
            self._coll(s, ch, "tp", "allgather", self.act, f"tp p2p gather F {tag}")
        if vs == 0:
            self._comp(s, ch, f"F {tag} embed", self.d["embed_fwd_s"], "fwd")
            self._coll(s, ch, "tp", "reducescatter" if self.sp else "allreduce", self.act,
                       f"{'sp' if self.sp else 'tp'} embed F {tag}")
        for layer in self._layers(s, c):
            if self._swapped(layer - 2):          # its buffer is drained two blocks later
                ch.deps = ch.deps + [self.d2h[(tag, layer - 2)]]
            self._block_forward(s, ch, "F", tag, layer)
            if self._swapped(layer):
                self.d2h[(tag, layer)] = self.w.compute(
                    self.reps[s], f"D2H {tag} l{layer}", duration_s=self.offload.swap_s,
                    stream="d2h", deps=[ch.last], category="offload")
        if vs == self.nv - 1:
            if self.sp:
                self._coll(s, ch, "tp", "allgather", self.act, f"sp logits in F {tag}")
            self._comp(s, ch, f"F {tag} logits", self.d["logits_fwd_s"], "fwd")
            for what in ("max", "target", "sumexp"):
                self._coll(s, ch, "tp", "allreduce", self.xent, f"tp xent {what} F {tag}")
        return ch.last

    def backward(self, s: int, c: int, mb: int, deps: list[int], *, buckets: int, reduce,
                 gather: bool) -> tuple[int, list[int]]:
        """The pass; with ``buckets`` > 0 its blocks in that many groups, ``reduce(j, op)``
        issuing gradient bucket ``j`` after group ``j``. Returns (last op, bucket ops)."""
        vs, tag = c * self.p.pp + s, f"mb{mb} c{c}"
        ch = _Chain(deps)
        self._comp(s, ch, f"B {tag}", 0.0, "pass")
        if gather:
            self._coll(s, ch, "tp", "allgather", self.act, f"tp p2p gather B {tag}")
        if vs == self.nv - 1:
            self._comp(s, ch, f"B {tag} logits", self.d["logits_bwd_s"], "bwd")
            if self.sp:
                self._coll(s, ch, "tp", "reducescatter", self.act, f"sp logits in B {tag}")
            else:
                self._coll(s, ch, "tp", "allreduce", self.act, f"tp logits B {tag}")
        layers = list(reversed(self._layers(s, c)))
        ends: set[int] = set()
        if buckets:
            base, extra = divmod(len(layers), buckets)
            i = 0
            for j in range(buckets):
                i += base + (1 if j < extra else 0)
                ends.add(i)
        reduced: list[int] = []
        j = 0
        for i, layer in enumerate(layers, 1):
            if self._swapped(layer):
                self._swap_in(s, ch, tag, layer)
            self._block_backward(s, ch, tag, layer)
            self.b_end[(tag, layer)] = ch.last
            if i in ends and i < len(layers):
                reduced += reduce(j, ch.last)
                j += 1
        if vs == 0:
            self._comp(s, ch, f"B {tag} embed", self.d["embed_bwd_s"], "bwd")
            if self.sp:
                self._coll(s, ch, "tp", "allgather", self.act, f"sp embed B {tag}")
        if buckets:
            reduced += reduce(j, ch.last)
        return ch.last, reduced
