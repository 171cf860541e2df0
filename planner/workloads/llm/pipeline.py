"""The op graph of one training step's pipeline: the passes of every stage in schedule order,
their pipeline sends, the data-parallel gradient reductions and the optimizer.

:class:`StepBuilder` adds them to a :class:`simulator.workload.Workload` for
:func:`planner.workloads.llm.step.build_step`, one representative rank per stage (see that
module's docstring), with each pass's time from :mod:`planner.workloads.llm.passes` or, with
expanded collectives, op by op through :class:`planner.workloads.llm.emit.PassEmitter`. Sizes
are bytes, times seconds.
"""

from __future__ import annotations

from simulator.errors import SpecError
from simulator.workload import Workload

from planner.model.llm.layout import Layout
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.workloads.llm.emit import PassEmitter
from planner.workloads.llm.partition import dp_bucket_elements, rank_params

__all__ = ["StepBuilder"]


class StepBuilder:
    """Adds one step's ops to a workload, stage by stage: FSDP weight gathers, the passes of
    the pipeline schedule with their sends, the DP gradient reductions and the optimizer.
    Sizes are bytes, times seconds; ``emit`` (expanded collectives) emits passes op by op."""

    def __init__(self, w: Workload, spec: LLMSpec, p: ParallelSpec, lay: Layout,
                 reps: list[int], chunk_layers: list, fwd_s: list, bwd_s: list, *, micro: int,
                 weight_bytes: int, grad_bytes: int, dp_buckets: int, act_bytes: float,
                 p2p_gather: bool, emit: PassEmitter | None, expanded: bool,
                 pp_blocking: bool = False, reduce_after: bool = False,
                 mb_times: list | None = None) -> None:
        self.w, self.spec, self.p, self.reps = w, spec, p, reps
        self.chunk_layers, self.fwd_s, self.bwd_s, self.micro = chunk_layers, fwd_s, bwd_s, micro
        self.e_w, self.grad_bytes, self.dp_buckets = weight_bytes, grad_bytes, dp_buckets
        self.act, self.p2p_gather, self.emit, self.expanded = act_bytes, p2p_gather, emit, expanded
        self.nv = p.pp * p.vpp
        self.zero3 = p.fsdp in ("zero3", "hsdp")
        self.dp_reduce = "allreduce" if p.fsdp == "none" else "reducescatter"
        # context-parallel ranks hold the same weights: gradients are reduced (and FSDP
        # shards kept) over the dp·cp ranks of a TP position, as Megatron-Core and torchtitan do
        self.dp_groups = {s: [sorted(lay.rank(tp=i, cp=j, dp=d, pp=s)
                                     for j in range(p.cp) for d in range(p.dp))
                              for i in range(p.tp)]
                          for s in range(p.pp)}
        self.gathered: dict[tuple[int, int, str], list[int]] = {}
        self.done: dict[tuple[str, int, int], int] = {}     # (kind, vstage, mb) -> op id
        self.first_b: dict[tuple[int, int], bool] = {}
        self.last_ops: dict[int, list[int]] = {s: [] for s in range(p.pp)}
        self.dp_ops: dict[int, list[int]] = {s: [] for s in range(p.pp)}
        # pipeline sends, issued by the sender as its pass ends: (kind, sender vstage, mb) -> op;
        # ``pp_blocking``: a rank's next pass waits for its send (synchronous p2p)
        self.reduce_after = reduce_after and not expanded
        self.sent: dict[tuple[str, int, int], int] = {}
        self.pp_blocking = pp_blocking
        self.blocked: dict[int, int] = {}
        self.mb_times = mb_times        # per micro-batch (fwd_s, bwd_s) tables, or None

    def pass_s(self, kind: str, s: int, c: int, mb: int) -> float:
        """Seconds of pass ``kind`` (F/B) of micro-batch ``mb`` on chunk ``c`` of stage ``s``."""
        fwd, bwd = self.mb_times[mb] if self.mb_times else (self.fwd_s, self.bwd_s)
        return (fwd if kind == "F" else bwd)[s][c]

    def chunk_params(self, s: int, c: int) -> float:
        """Parameters held per rank in chunk ``c`` of stage ``s`` (DP traffic, optimizer)."""
        p, m = self.p, self.spec.model
        if self.expanded:
            return float(rank_params(self.spec, p, self.chunk_layers, s, c))
        n = self.chunk_layers[s][c] * m.layer_params_per_rank(p.ep)
        vs = c * p.pp + s
        if vs == 0 or vs == p.pp * p.vpp - 1:
            n += m.embedding_params
        return n / p.tp

    def dp_collectives(self, kind: str, s: int, size: float, deps: list[int],
                       name: str) -> list[int]:
        """One ``kind`` of ``size`` bytes per DP·CP group of stage ``s`` (none without)."""
        if self.p.dp * self.p.cp == 1 or size <= 0:
            return []
        # nccl-tests sizes: the full per-rank buffer (gradients in, parameters out)
        return [self.w.collective(kind, g, size, name=name, stream="dp", deps=deps,
                                  category="dp")
                for g in self.dp_groups[s]]

    def fsdp_gathers(self) -> None:
        """FSDP (ZeRO-3): gather each chunk's weights before its first forward."""
        if not self.zero3:
            return
        p = self.p
        for s in range(p.pp):
            for c in range(p.vpp):
                self.gathered[(s, c, "F")] = self.dp_collectives(
                    "allgather", s, self.chunk_params(s, c) * self.e_w, [],
                    f"fsdp gather s{s}c{c}")

    def passes(self, items: dict[int, list]) -> None:
        """Emit every stage's schedule ``items`` (kind, micro-batch, chunk), each pass once
        the pass it receives from on the neighbouring stage has been emitted."""
        p = self.p
        pos = {s: 0 for s in range(p.pp)}
        remaining = sum(len(v) for v in items.values())
        while remaining:
            progressed = False
            for s in range(p.pp):
                while pos[s] < len(items[s]):
                    kind, mb, c = items[s][pos[s]]
                    vs = c * p.pp + s
                    if not self._ready(kind, vs, mb):
                        break
                    oid = self._forward(s, c, mb) if kind == "F" else self._backward(s, c, mb)
                    self.done[(kind, vs, mb)] = oid
                    self._send(kind, s, vs, mb, oid)
                    self.last_ops[s].append(oid)
                    pos[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise SpecError("pipeline schedule cannot make progress", field="parallel",
                                fix="report this configuration as a bug")

    def _ready(self, kind: str, vs: int, mb: int) -> bool:
        """Whether the pass that feeds pass ``kind`` of micro-batch ``mb`` on virtual stage
        ``vs`` (the previous stage's forward, the next stage's backward) has been emitted."""
        if kind == "F":
            return vs == 0 or ("F", vs - 1, mb) in self.done
        return vs == self.nv - 1 or ("B", vs + 1, mb) in self.done

    def _send(self, kind: str, s: int, vs: int, mb: int, oid: int) -> None:
        """The pipeline send of pass ``kind`` (activation forward, gradient backward) that ends
        with op ``oid`` on virtual stage ``vs`` of stage ``s``; none at the pipeline's ends."""
        dst = vs + 1 if kind == "F" else vs - 1
        if not 0 <= dst < self.nv:
            return
        what = "act" if kind == "F" else "grad"
        sid = _p2p(self.w, self.p, self.reps, vs, dst, self.act, oid,
                   f"{what} mb{mb}" + (f" v{dst}" if self.emit else ""))
        self.sent[(kind, vs, mb)] = sid
        if self.pp_blocking and sid != oid:
            self.blocked[s] = sid

    def _stage_deps(self, s: int) -> list[int]:
        """What stage ``s``'s next pass waits for besides its data: its last blocking send."""
        sid = self.blocked.pop(s, None)
        return [] if sid is None else [sid]

    def _forward(self, s: int, c: int, mb: int) -> int:
        """The forward of micro-batch ``mb`` on chunk ``c`` of stage ``s``; its op id."""
        p, w, emit = self.p, self.w, self.emit
        vs = c * p.pp + s
        deps: list[int] = self._stage_deps(s)
        if vs > 0:
            deps.append(self.sent[("F", vs - 1, mb)])
        deps += self.gathered.get((s, c, "F"), [])
        if emit:
            return emit.forward(s, c, mb, deps, gather=self.p2p_gather and vs > 0)
        return w.compute(self.reps[s], f"F mb{mb} c{c}", duration_s=self.pass_s("F", s, c, mb),
                         deps=deps, category="fwd")

    def _backward(self, s: int, c: int, mb: int) -> int:
        """The backward of micro-batch ``mb`` on chunk ``c`` of stage ``s`` (the last one's
        with the DP gradient reductions); its op id."""
        p, w, emit = self.p, self.w, self.emit
        vs = c * p.pp + s
        deps: list[int] = self._stage_deps(s)
        if vs < self.nv - 1:
            deps.append(self.sent[("B", vs + 1, mb)])
        deps.append(self.done[("F", vs, mb)])
        if self.zero3 and not self.first_b.get((s, c)):
            self.first_b[(s, c)] = True
            deps += self.dp_collectives("allgather", s, self.chunk_params(s, c) * self.e_w, [],
                                        f"fsdp regather s{s}c{c}")
        last_mb = mb == self.micro - 1
        if emit:
            return self._expanded_backward(s, c, mb, deps, last_mb)
        if last_mb and p.dp * p.cp > 1 and not self.reduce_after:
            return self._bucketed_backward(s, c, mb, deps)
        return w.compute(self.reps[s], f"B mb{mb} c{c}", duration_s=self.pass_s("B", s, c, mb),
                         deps=deps, category="bwd")

    def _expanded_backward(self, s: int, c: int, mb: int, deps: list[int],
                           last_mb: bool) -> int:
        """A backward emitted op by op, its gradients reduced in buckets as they land."""
        p = self.p
        vs = c * p.pp + s
        k = max(1, min(self.dp_buckets, self.chunk_layers[s][c])) \
            if last_mb and p.dp * p.cp > 1 else 0
        sizes = dp_bucket_elements(round(self.chunk_params(s, c)), k)

        def reduce(j: int, dep: int) -> list[int]:
            return self.dp_collectives(self.dp_reduce, s, sizes[j] * self.grad_bytes, [dep],
                                       f"grads s{s}c{c}b{j}")
        oid, reduced = self.emit.backward(s, c, mb, deps, buckets=k, reduce=reduce,
                                          gather=self.p2p_gather and vs < self.nv - 1)
        self.dp_ops[s] += reduced
        return oid

    def _bucketed_backward(self, s: int, c: int, mb: int, deps: list[int]) -> int:
        """The last micro-batch's backward in buckets, each reduced as it lands; the last
        bucket's op id."""
        k = max(1, min(self.dp_buckets, self.chunk_layers[s][c]))
        prev = None
        for j in range(k):
            oid = self.w.compute(self.reps[s], f"B mb{mb} c{c} bucket{j}",
                                 duration_s=self.pass_s("B", s, c, mb) / k,
                                 deps=deps if prev is None else [prev], category="bwd")
            prev = oid
            self.dp_ops[s] += self.dp_collectives(self.dp_reduce, s,
                                                  self.chunk_params(s, c) * self.grad_bytes / k,
                                                  [oid], f"grads s{s}c{c}b{j}")
        return oid

    def optimizer_steps(self) -> None:
        """The optimizer step (and ZeRO-1/2 parameter all-gather) on each stage."""
        p = self.p
        for s in range(p.pp):
            params = sum(self.chunk_params(s, c) for c in range(p.vpp))
            last = self.last_ops[s][-1:] + self._stage_deps(s)
            if self.reduce_after:    # one reduction of the whole gradient buffer
                self.dp_ops[s] += self.dp_collectives(self.dp_reduce, s,
                                                      params * self.grad_bytes, last,
                                                      f"grads s{s}")
            shard = p.dp * p.cp if p.fsdp != "none" else 1
            opt = self.w.compute(self.reps[s], "optimizer", bytes_moved=30 * params / shard,
                                 deps=self.dp_ops[s] + last, category="optimizer")
            if p.fsdp in ("zero1", "zero2"):
                self.dp_collectives("allgather", s, params * self.e_w, [opt],
                                    f"param gather s{s}")


def _p2p(w: Workload, p: ParallelSpec, reps: list[int], src_vs: int, dst_vs: int, nbytes: float,
         dep: int, name: str) -> int:
    a, b = reps[src_vs % p.pp], reps[dst_vs % p.pp]
    if a == b:
        return dep
    return w.sendrecv(a, b, nbytes, name=name, stream=f"p2p {a}->{b}", deps=[dep],
                      category="pp")
