"""One rank of an LLM plan's validation run: trains the scaled model for real.

The rank takes its coordinates from the plan's layout (:class:`planner.model.llm.layout.Layout`,
Megatron order by default), builds the chunks of its pipeline stage with its 1/tp of every
block, and runs ``warmup + steps`` training steps, each executing the stage's schedule from
:func:`planner.model.llm.schedule.schedule` (the simulator's own): receive (blocking), pass,
send (``isend``, completed at the end of the step); after the last micro-batch's backward of
each chunk, its gradients (fp32, a flat buffer in backward order) are all-reduced over the DP
group in :func:`planner.workloads.llm.partition.dp_bucket_elements` buckets; then AdamW (foreach
ops). A barrier separates steps (not part of any step's record). Every communication call goes
through :class:`planner.measure.validate.comm.Recorder`.

It runs in a process of the validation pool (:mod:`planner.measure.validate.worker`).
"""

from __future__ import annotations

import datetime

from planner.measure.runner import init_group
from planner.measure.validate.comm import Progress, Recorder
from planner.measure.validate.config import RunConfig
from planner.measure.validate.rank_steps import (
    inject_fault,
    pin_main_thread,
    timed_steps,
    unpin,
)
from planner.model.llm.layout import Layout
from planner.model.llm.schedule import schedule
from planner.model.llm.stages import chunk_layer_counts
from planner.workloads.llm.partition import (
    dp_bucket_elements,
    vstage_layer_offsets,
)

__all__ = ["run_rank"]


def run_rank(rank: int, cfg: RunConfig, rdzv: str, progress: Progress, report, state: dict) -> dict:
    """Run job ``cfg`` as ``rank``: join its process groups, build this rank's chunks, time
    ``warmup + steps`` training steps (and a profiled one), then leave; the rank's record."""

    import torch
    import torch.distributed as dist

    from planner.measure.validate.model import param_count
    torch.set_num_threads(1)
    p = cfg.parallel
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    progress.begin(rank, "init_process_group", -1)
    init_group(cfg.backend, rank, cfg.world, rdzv, cfg.timeout_s)
    progress.end(rank)
    lay = Layout(p.tp, p.cp, p.dp, p.pp, cfg.order)
    pgs = _new_groups(lay, rank, timeout)
    report("ready", None)
    pin_main_thread(rank)
    stage = _Stage(rank, cfg, lay, pgs, Recorder(rank, progress), state)
    steps, trace = timed_steps(stage.rec, stage.run_step, cfg, rank)
    state["step"] = -2
    dist.destroy_process_group()
    unpin()
    chunks = stage.chunks
    return {"rank": rank, "coords": stage.co, "events": stage.rec.events, "steps": steps,
            "losses": stage.losses, "params": {c: param_count(chunks[c]) for c in chunks},
            "trace": trace}


def _new_groups(lay: Layout, rank: int, timeout) -> dict[tuple[int, ...], object]:
    """Create every TP and DP process group of more than one rank (every rank creates every
    group, in the same order, as torch.distributed requires); those ``rank`` is in, by ranks."""
    import torch.distributed as dist

    pgs: dict[tuple[int, ...], object] = {}
    for axis in ("tp", "dp"):
        seen: set[tuple[int, ...]] = set()
        for r in range(lay.world):
            g = tuple(lay.group(axis, r))
            if len(g) > 1 and g not in seen:
                seen.add(g)
                pg = dist.new_group(ranks=list(g), timeout=timeout)
                if rank in g:
                    pgs[g] = pg
    return pgs


class _Stage:
    """One rank's part of the pipeline: its chunks (1/tp of each of their blocks) and the
    schedule it runs each step, with the pipeline messages, the DP gradient all-reduce and
    the optimizer; ``losses`` gets each step's summed loss on the last stage."""

    def __init__(self, rank: int, cfg: RunConfig, lay: Layout, pgs: dict, rec: Recorder,
                 state: dict) -> None:
        from planner.measure.validate.model import TPGroup, build_chunk
        p, m, t = cfg.parallel, cfg.spec.model, cfg.spec.training
        self.rank, self.cfg, self.lay, self.pgs = rank, cfg, lay, pgs
        self.rec, self.state = rec, state
        self.p, self.m = p, m
        co = self.co = lay.coords(rank)
        s = self.s = co["pp"]
        self.tp_ranks, self.dp_ranks = tuple(lay.group("tp", rank)), tuple(lay.group("dp", rank))
        tp = self.tp = TPGroup(rec, pgs.get(self.tp_ranks), self.tp_ranks, rank)
        nv = self.nv = p.pp * p.vpp
        self.M = cfg.microbatches
        chunk_layers = self.chunk_layers = chunk_layer_counts(m.layers, p.pp, p.vpp)
        offsets = vstage_layer_offsets(chunk_layers, p.pp, p.vpp)
        self.chunks = {}
        for c in range(p.vpp):
            vs = c * p.pp + s
            layers = range(offsets[vs], offsets[vs] + chunk_layers[s][c])
            self.chunks[c] = build_chunk(m, tp, layers, first=vs == 0, last=vs == nv - 1,
                                         recompute=t.activation_recompute,
                                         seed=cfg.seed + 1000 * vs + tp.index)
        self.items = schedule(cfg.schedule, p.pp, self.M, s, p.vpp)
        b, seq, h = self.b, self.seq, self.h = t.micro_batch_size, m.seq_len, m.hidden_size
        self.sg = sg = cfg.p2p_scatter_gather and p.tp > 1
        self.sent = b * seq * h // p.tp if sg else b * seq * h   # elements of one pipeline message
        self.flat_bufs: dict = {}
        self.adam: dict = {}
        self.losses: list[float] = []

    def peer(self, vs: int) -> int:
        """The rank holding virtual stage ``vs`` at this rank's TP, CP and DP coordinates."""
        co = self.co
        return self.lay.rank(tp=co["tp"], cp=co["cp"], dp=co["dp"], pp=vs % self.p.pp)

    def batch(self, step: int, mb: int):
        """Inputs and targets (token ids) of micro-batch ``mb`` of ``step`` on this replica."""
        import torch
        cfg, b, seq = self.cfg, self.b, self.seq
        g = torch.Generator().manual_seed(cfg.seed * 7919 + step * 104729 + self.co["dp"] * 131
                                          + mb)
        tokens = torch.randint(0, self.m.vocab_size, (b, seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    def receive(self, vs_from: int, name: str, tag: int):
        """Receive one pipeline message from virtual stage ``vs_from`` (blocking)."""
        import torch
        buf = torch.empty(self.sent)
        self.rec.recv(buf, self.peer(vs_from), name, tag)
        return buf

    def whole(self, buf, what: str):
        """The received activation or gradient, all-gathered over TP under scatter-gather."""
        if self.sg:
            import torch
            rec = self.rec
            full = torch.empty(self.b * self.seq * self.h)
            rec.all_gather(full, buf, self.tp.pg, self.tp_ranks, f"tp p2p gather {what} {rec.tag}",
                           "tp")
            buf = full
        return buf.view(self.b, self.seq, self.h).detach()

    def transmit(self, x, vs_to: int, name: str, tag: int) -> None:
        """Send ``x`` (its 1/tp slice under scatter-gather) to virtual stage ``vs_to``."""
        x = x.detach().reshape(-1)
        if self.sg:
            x = x.chunk(self.p.tp)[self.tp.index]
        self.rec.send(x.contiguous().clone(), self.peer(vs_to), name, tag)

    def reduce_grads(self, c: int) -> None:
        """All-reduce chunk ``c``'s gradients over DP in buckets and average them."""
        import torch
        p, s, rec, dp_ranks = self.p, self.s, self.rec, self.dp_ranks
        # a persistent flat buffer per chunk, as Megatron's contiguous gradient buffer (a new
        # one each step would page-fault megabytes of fresh memory on every step)
        params = list(self.chunks[c].parameters())
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
        flat = self.flat_bufs.get(c)
        if flat is None:
            flat = self.flat_bufs[c] = torch.empty(sum(q.numel() for q in params))
        torch.cat([g.reshape(-1).float() for g in reversed(grads)], out=flat)
        k = max(1, min(self.cfg.dp_buckets, self.chunk_layers[s][c]))
        o = 0
        for j, n in enumerate(dp_bucket_elements(flat.numel(), k)):
            rec.all_reduce(flat[o:o + n], self.pgs[dp_ranks], dp_ranks, f"grads s{s}c{c}b{j}",
                           "dp")
            o += n
        flat /= p.dp
        o = 0
        for q in reversed(params):
            n = q.numel()
            q.grad = flat[o:o + n].view_as(q)
            o += n

    def optimizer_step(self) -> None:
        """AdamW on fp32 states with multi-tensor (foreach) ops, as the simulator's optimizer
        op models a trainer's fused Adam (torch.optim would import torch._dynamo)."""
        import torch
        adam = self.adam
        params = [q for ch in self.chunks.values() for q in ch.parameters() if q.grad is not None]
        if not params:
            return
        grads = [q.grad for q in params]
        if "m" not in adam:
            adam["m"] = [torch.zeros_like(q) for q in params]
            adam["v"] = [torch.zeros_like(q) for q in params]
            adam["t"] = 0
        adam["t"] += 1
        b1, b2, lr, eps, wd = 0.9, 0.95, 1e-3, 1e-8, 0.01
        m_, v_ = adam["m"], adam["v"]
        torch._foreach_mul_(params, 1.0 - lr * wd)
        torch._foreach_lerp_(m_, grads, 1.0 - b1)
        torch._foreach_mul_(v_, b2)
        torch._foreach_addcmul_(v_, grads, grads, 1.0 - b2)
        denom = torch._foreach_sqrt(v_)
        torch._foreach_div_(denom, (1.0 - b2 ** adam["t"]) ** 0.5)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, m_, denom, -lr / (1.0 - b1 ** adam["t"]))

    def run_step(self, step: int) -> None:
        """One training step: the schedule's forward and backward passes, the DP gradient
        reduction after each chunk's last backward, then the optimizer."""
        import torch
        rec, cfg, rank = self.rec, self.cfg, self.rank
        rec.step = self.state["step"] = step
        rec.note(f"step {step} start")
        if cfg.fault is not None and cfg.fault.rank == rank and cfg.fault.step == step:
            inject_fault(cfg.fault.kind, rank, step)
        for ch in self.chunks.values():
            for q in ch.parameters():
                q.grad = None
        saved: dict = {}
        total = 0.0
        for kind, mb, c in self.items:
            if kind == "F":
                loss = self._forward(step, mb, c, saved)
                if loss is not None:
                    total += loss
            else:
                self._backward(mb, c, saved)
        rec.wait_sends()
        rec.note(f"optimizer step {step}")
        with torch.no_grad():
            self.optimizer_step()
        if self.s == (self.nv - 1) % self.p.pp:
            self.losses.append(total)

    def _forward(self, step: int, mb: int, c: int, saved: dict) -> float | None:
        """Forward pass of micro-batch ``mb`` through chunk ``c``: its input received (or read
        from the batch), its output sent on; the loss where the chunk is the model's last."""
        vs = c * self.p.pp + self.s
        if vs > 0:
            buf = self.receive(vs - 1, f"act mb{mb} v{vs}", 2 * vs)
        self.rec.begin_pass("F", mb, c)
        if vs == 0:
            x = self.batch(step, mb)[0]
        else:
            x = self.whole(buf, "F").requires_grad_(True)
        out = self.chunks[c](x)
        loss = None
        if vs == self.nv - 1:
            out = self.chunks[c].loss(out, self.batch(step, mb)[1], self.M)
            loss = float(out.detach())
        else:
            self.transmit(out, vs + 1, f"act mb{mb} v{vs + 1}", 2 * (vs + 1))
        saved[(mb, c)] = (x, out)
        return loss

    def _backward(self, mb: int, c: int, saved: dict) -> None:
        """Backward pass of micro-batch ``mb`` through chunk ``c``: the output gradient
        received, the input gradient sent back; after the last micro-batch, the DP reduction."""
        p, nv = self.p, self.nv
        vs = c * p.pp + self.s
        x, out = saved.pop((mb, c))
        if vs < nv - 1:
            buf = self.receive(vs + 1, f"grad mb{mb} v{vs}", 2 * vs + 1)
        self.rec.begin_pass("B", mb, c)
        g = self.whole(buf, "B") if vs < nv - 1 else None
        out.backward(g)
        if vs > 0:
            self.transmit(x.grad, vs - 1, f"grad mb{mb} v{vs - 1}", 2 * (vs - 1) + 1)
        if mb == self.M - 1 and p.dp > 1:
            self.reduce_grads(c)
