"""One rank of a DLRM validation run: TorchRec's DistributedModelParallel on gloo, for real.

The rank builds an ``EmbeddingBagCollection`` of the plan's tables (on ``meta``) and the model
spec's dense part (bottom MLP, dot or DCNv2 interaction, top MLP; sized exactly as
:meth:`planner.model.tables.spec.DenseSpec.param_count` counts it), wraps them in
``DistributedModelParallel`` with the plan loaded by
:func:`planner.export.torchrec_load.load_sharding_plan`, and trains ``warmup + steps`` steps
(forward, backward, FBGEMM's fused exact SGD for the sharded tables, plain SGD for the dense and
data-parallel parameters) on :func:`planner.measure.validate.dlrm.step_batch`.

Every collective TorchRec issues goes through :class:`planner.measure.validate.comm.Recorder`: the
``torch.distributed`` functions TorchRec 1.8.0 calls on CPU (``all_to_all_single``,
``reduce_scatter_tensor``, ``all_gather_into_tensor``, ``all_reduce`` and the rest, patched on
the module in this process) and the two DDPs' gradient all-reduces (a comm hook on each: the
dense part's, and the one ``ShardedEmbeddingBagCollection`` puts around data-parallel lookups,
which reduce in C++ otherwise). Each record has its process group (``world``, ``intra`` or
``cross``, by the group object), kind, bytes and all-to-all split sizes in bytes.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings

from planner.export.torchrec_load import load_sharding_plan
from planner.measure.runner import init_group
from planner.measure.validate.comm import Recorder
from planner.measure.validate.dlrm_ops import step_batch
from planner.measure.validate.lookup_probe import time_together
from planner.measure.validate.rank_steps import inject_fault, pin_main_thread, timed_steps, unpin

__all__ = ["run_rank", "run_plans", "start_rank", "open_tap", "Trainer", "probe_host",
           "HOST_PROBES"]

PATCHED = ("all_to_all_single", "all_to_all", "all_reduce", "reduce_scatter",
           "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor", "broadcast",
           "all_gather_object", "broadcast_object_list", "reduce", "scatter", "gather")
KIND = {"all_to_all_single": "alltoall", "all_to_all": "alltoall", "all_reduce": "allreduce",
        "reduce_scatter": "reducescatter", "reduce_scatter_tensor": "reducescatter",
        "all_gather": "allgather", "all_gather_into_tensor": "allgather"}


def _nbytes(t) -> int:
    return int(t.numel() * t.element_size())


class _Tap:
    """Patches ``torch.distributed`` so every call is recorded with its group and splits."""

    def __init__(self, rec: Recorder, dist, world: int, lws: int) -> None:
        self.rec, self.dist, self.world, self.lws = rec, dist, world, lws
        self.splits: list[tuple] = []          # parallel to rec.events
        self.waits: list[float] = []           # likewise; 0 (async calls are not waited here)
        self.tag = ""
        self.saved = {}
        for name in PATCHED:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self.saved[name] = fn
            setattr(dist, name, self._wrap(name, fn, inspect.signature(fn)))

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.dist, name, fn)

    def channel(self, group) -> tuple[str, tuple]:
        d = self.dist
        if group is None or group is d.group.WORLD:
            return "world", tuple(range(self.world))
        ranks = tuple(d.get_process_group_ranks(group))
        if ranks == tuple(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) <= self.lws \
                and ranks[0] % self.lws == 0:
            return "intra", ranks
        return "cross", ranks

    def _wrap(self, name, fn, sig):
        import torch

        def call(*a, **k):
            try:
                args = sig.bind(*a, **k).arguments
            except TypeError:
                args = dict(k)
            ch, ranks = self.channel(args.get("group"))
            kind = KIND.get(name, name)
            send = recv = ()
            if name == "all_to_all_single":
                out, inp = args["output"], args["input"]
                n = len(ranks)
                per = inp.element_size() * (inp[0].numel() if inp.dim() > 1 else 1)
                isz = args.get("input_split_sizes") or [inp.shape[0] // n] * n
                osz = args.get("output_split_sizes") or [out.shape[0] // n] * n
                send = tuple(int(x) * per for x in isz)
                recv = tuple(int(x) * per for x in osz)
                nbytes = sum(send)
            elif name in ("reduce_scatter_tensor",):
                nbytes = _nbytes(args["input"])
            elif name in ("all_gather_into_tensor",):
                nbytes = _nbytes(args["output_tensor"])
            elif name == "all_reduce":
                nbytes = _nbytes(args["tensor"])
            else:
                ts = [v for v in args.values() if isinstance(v, torch.Tensor)]
                nbytes = sum(_nbytes(t) for t in ts)
            label = f"{ch} {name}" + (f" {self.tag}" if self.tag else "")
            out = self.rec._call(kind, nbytes, ranks, label, ch, lambda: fn(*a, **k))
            self.splits.append((send, recv))
            self.waits.append(0.0)
            return out
        return call


def _dense_model(model, configs, torch, nn):
    """The DLRM: sharded EBC first (its graph is older), then bottom MLP, interaction, top."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    d = model.dense
    dims = [t.embedding_dim for t in model.tables]

    class DCN(nn.Module):
        def __init__(self, width: int, proj: int, layers: int) -> None:
            super().__init__()
            self.u = nn.ModuleList(nn.Linear(width, proj, bias=False) for _ in range(layers))
            self.v = nn.ModuleList(nn.Linear(proj, width, bias=False) for _ in range(layers))
            self.b = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(layers))

        def forward(self, x0):
            x = x0
            for u, v, b in zip(self.u, self.v, self.b):
                x = x0 * (v(u(x)) + b) + x
            return x

    def mlp(widths, first):
        layers, prev = [], first
        for i, w in enumerate(widths):
            layers.append(nn.Linear(prev, w))
            if i < len(widths) - 1:
                layers.append(nn.ReLU())
            prev = w
        return nn.Sequential(*layers), prev

    class DLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
            self.keys = [c.feature_names[0] for c in configs]
            if d is None:
                self.bottom = self.inter = self.top = None
                return
            self.bottom, b_out = mlp(d.bottom_mlp, d.num_dense_features)
            f = len(dims) + 1
            if d.interaction == "dot":
                self.inter = None
                top_in = f * (f - 1) // 2 + b_out
            else:
                top_in = b_out + sum(dims)
                self.inter = DCN(top_in, d.dcn_projection, d.dcn_layers)
            self.top, _ = mlp(d.top_mlp, top_in)

        def forward(self, dense_x, kjt, coef):
            pooled = self.ebc(kjt)
            if self.top is None:
                emb = pooled.to_dict()
                return sum((emb[k] * c).sum() for k, c in zip(self.keys, coef)) / len(coef[0])
            z = self.bottom(dense_x)
            emb = pooled.to_dict()
            if self.inter is None:
                x = torch.stack([z] + [emb[k] for k in self.keys], dim=1)
                gram = torch.bmm(x, x.transpose(1, 2))
                i, j = torch.triu_indices(x.shape[1], x.shape[1], offset=1)
                feat = torch.cat([z, gram[:, i, j]], dim=1)
            else:
                feat = self.inter(torch.cat([z] + [emb[k] for k in self.keys], dim=1))
            out = self.top(feat)
            return (out.float() ** 2).mean()

    return DLRM()


def _ddps(model, nn) -> list:
    """The DDPs in ``model``: DMP's own (around the dense part) and the ones
    ``ShardedEmbeddingBagCollection`` keeps in its ``_lookups`` list (data-parallel tables)."""
    out, seen = [], set()
    for mod in model.modules():
        for m in [mod, *(getattr(mod, "_lookups", None) or [])]:
            if isinstance(m, nn.parallel.DistributedDataParallel) and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


def _reset_torchrec_globals() -> None:
    """Forget what TorchRec caches per process: the intra/cross-host groups (of an earlier
    job's process group, destroyed since) and whether collective validation was agreed on
    (otherwise only the ranks new to the pool would broadcast it, and the others hang)."""
    import torchrec.distributed.collective_utils as cu
    import torchrec.distributed.comm as tc
    for mod, name, value in ((tc, "_INTRA_PG", None), (tc, "_CROSS_PG", None),
                             (cu, "_INITIALIZED", False)):
        if hasattr(mod, name):
            setattr(mod, name, value)


#: lookup probes back to back before the warm-up and again after the last step
HOST_PROBES = 3


def probe_host(dist, rank: int, progress) -> list[float]:
    """This rank's seconds of :data:`HOST_PROBES` lookup probes, every rank at once: how fast
    the host runs now, against the calibration's ``lookup.measured_s``."""
    progress.begin(rank, "host probe", -1)
    try:
        return [time_together(dist) for _ in range(HOST_PROBES)]
    finally:
        progress.end(rank)


def _hook_ddps(ddps: list, dist, torch, tap, world: int) -> None:
    """Make each DDP bucket's all-reduce a blocking, recorded call tagged ``dense`` (the
    dense model's) or ``dp-tables`` (a data-parallel lookup's), so the recorded time is the
    all-reduce's (DDP waits on the future)."""
    def hook(tag, bucket):
        buf = bucket.buffer()
        tap.tag = tag
        try:
            dist.all_reduce(buf)
        finally:
            tap.tag = ""
        fut = torch.futures.Future()
        fut.set_result(buf.div_(world))
        return fut
    for ddp in ddps:
        dense = type(ddp.module).__name__ == "DLRM"      # else a data-parallel lookup
        ddp.register_comm_hook("dense" if dense else "dp-tables", hook)


def _local_batch(cfg, rank: int, step: int, torch, KeyedJaggedTensor):
    """This rank's share of ``step``'s seeded batch (:func:`step_batch`): dense features,
    the ids as a ``KeyedJaggedTensor``, and the loss's random coefficients per table."""
    m, B = cfg.model, cfg.local_batch
    lo, hi = rank * B, (rank + 1) * B
    lengths, ids = step_batch(cfg, step)
    ls, vs = [], []
    for ln, x in zip(lengths, ids):
        off = [0, *ln.cumsum().tolist()]
        ls.append(torch.from_numpy(ln[lo:hi].copy()))
        vs.append(torch.from_numpy(x[off[lo]:off[hi]].copy()))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{t.name}" for t in m.tables],
                                              values=torch.cat(vs), lengths=torch.cat(ls))
    g = torch.Generator().manual_seed(cfg.seed * 31 + step * 977 + rank)
    nd = m.dense.num_dense_features if m.dense is not None else 1
    coef = [torch.randn(B, t.embedding_dim, generator=g) for t in m.tables]
    return torch.randn(B, nd, generator=g), kjt, coef


def _quiet_process(rank: int, local_world: int) -> None:
    """Silence TorchRec's warnings and logs in this rank's process, and set the local rank
    and world size TorchRec reads from the environment."""
    warnings.simplefilter("ignore")
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    # TorchRec 1.8 asks torch.fx whether it is tracing, which logs a deprecation per process
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world)
    os.environ["LOCAL_RANK"] = str(rank % local_world)


def start_rank(rank: int, cfg, rdzv: str, progress, report) -> None:
    """Quiet the process, join the run's gloo group (one thread per rank) and import
    TorchRec with its per-process caches forgotten."""
    _quiet_process(rank, cfg.local_world)
    import torch
    torch.set_num_threads(1)
    progress.begin(rank, "init_process_group", -1)
    init_group(cfg.backend, rank, cfg.world, rdzv, cfg.timeout_s)
    progress.end(rank)
    report("ready", None)
    progress.begin(rank, "import torchrec", -1)
    import torchrec  # noqa: F401  (timed here, not inside the first plan's build)
    _reset_torchrec_globals()
    progress.end(rank)


class Trainer:
    """One plan's model on this rank, ready to train: its DMP built from ``cfg``'s plan, its
    DDPs' all-reduces recorded, its batches made. ``tap`` records every call while this
    trainer is :meth:`active`; several trainers of one run share the tap."""

    def __init__(self, rank: int, cfg, progress, state: dict, tap: "_Tap") -> None:
        import torch
        import torch.distributed as dist
        from torch import nn
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.types import ShardingPlan
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        self.rank, self.cfg, self.state, self.tap = rank, cfg, state, tap
        self.rec = Recorder(rank, progress)
        self.splits: list[tuple] = []
        self.waits: list[float] = []
        m = cfg.model
        configs = [EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings,
                                      embedding_dim=t.embedding_dim,
                                      feature_names=[f"f_{t.name}"]) for t in m.tables]
        plan = load_sharding_plan(cfg.torchrec_plan, world_size=cfg.world, tables=configs,
                                  local_world_size=cfg.local_world, device="cpu")
        plan = ShardingPlan({"ebc": plan.plan[""]})
        self.active()
        torch.manual_seed(cfg.seed)
        sharder = EmbeddingBagCollectionSharder(
            fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": cfg.lr})
        self.model = DistributedModelParallel(_dense_model(m, configs, torch, nn),
                                              device=torch.device("cpu"), plan=plan,
                                              sharders=[sharder])
        # the DDPs reduce in C++: a hook makes each bucket's all-reduce a recorded call
        self.ddps = _ddps(self.model, nn)
        _hook_ddps(self.ddps, dist, torch, tap, cfg.world)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.torch, self.kjt = torch, KeyedJaggedTensor
        # inputs are made before the timed steps, as a data loader prefetches them (the
        # dense features' randn alone took ~2 ms of an 80 ms step); the same batches as before
        n_batches = cfg.warmup + cfg.steps + (1 if cfg.trace_dir else 0)
        self.batches = {s: self.batch(s) for s in range(n_batches)}
        self.losses: list[float] = []

    def active(self) -> "Trainer":
        """Record the calls from now on into this trainer's records."""
        self.tap.rec, self.tap.splits, self.tap.waits = self.rec, self.splits, self.waits
        return self

    def batch(self, step: int):
        return _local_batch(self.cfg, self.rank, step, self.torch, self.kjt)

    def run_step(self, step: int) -> None:
        """One training step: forward, backward, the dense parameters' SGD (the sharded
        tables' fused optimizer runs in their backward)."""
        cfg, rec, torch = self.cfg, self.rec, self.torch
        rec.step = self.state["step"] = step
        rec.note(f"step {step} start")
        if cfg.fault is not None and cfg.fault.rank == self.rank and cfg.fault.step == step:
            inject_fault(cfg.fault.kind, self.rank, step)
        dense_x, kjt, coef = self.batches.pop(step) if step in self.batches else self.batch(step)
        for p in self.params:
            p.grad = None
        rec.note(f"forward {step}")
        loss = self.model(dense_x, kjt, coef)
        rec.note(f"backward {step}")
        loss.backward()
        rec.note(f"optimizer {step}")
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-cfg.lr)
        self.losses.append(float(loss.detach()))

    def result(self, steps: list, trace, probe: list) -> dict:
        """What the rank reports of this plan (the parent's :func:`validate_dlrm` reads it)."""
        events = [ev + sp + (w,) for ev, sp, w in zip(self.rec.events, self.splits, self.waits)]
        return {"rank": self.rank, "events": events, "steps": steps, "losses": self.losses,
                "trace": trace, "ddps": len(self.ddps), "host_probe_s": probe}


def open_tap(cfg):
    """The call recorder patched into ``torch.distributed`` for a run of ``cfg``'s world."""
    import torch.distributed as dist
    return _Tap(None, dist, cfg.world, cfg.local_world)


def run_plans(rank: int, cfg, plans, rdzv: str, progress, report, state: dict, train):
    """This rank's run of ``plans`` (one :class:`Trainer` each, ``cfg`` the run's settings):
    build them, probe the host, ``train(trainers)`` (what it returns: their timed steps), probe
    again; returns the trainers, that and the probes' seconds."""
    import torch.distributed as dist
    start_rank(rank, cfg, rdzv, progress, report)
    tap = open_tap(cfg)
    try:
        jobs = [Trainer(rank, c, progress, state, tap) for c in plans]
        pin_main_thread(rank)          # TorchRec's groups (and their gloo threads) exist now
        probe = probe_host(dist, rank, progress) if cfg.host_probe else []
        timed = train(jobs)
        state["step"] = -2
        if cfg.host_probe:
            probe += probe_host(dist, rank, progress)
    finally:
        tap.restore()
    dist.destroy_process_group()
    unpin()
    return jobs, timed, probe


def run_rank(rank: int, cfg, rdzv: str, progress, report, state: dict) -> dict:
    """This rank's run of one plan: build, probe the host, warm up, time the steps."""
    def train(jobs):
        return timed_steps(jobs[0].rec, jobs[0].run_step, cfg, rank)
    jobs, (steps, trace), probe = run_plans(rank, cfg, [cfg], rdzv, progress, report, state,
                                            train)
    return jobs[0].result(steps, trace, probe)
