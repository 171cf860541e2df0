"""NeuroShard's cost networks in torch, the gradient-boosting baseline, training and metrics.

- :class:`ComputeNet`: a table-feature MLP (``F → 128 → 32``, ReLU) applied to every table of a
  device, summed over the tables, then a head ``32 → 64 → 1``. It predicts log(ms) of the fused
  forward+backward TBE time (trained with MSE on the log, so relative errors are what it
  minimises; NeuroShard trains MSE on ms).
- :class:`CommNet`: an MLP ``in → 128 → 64 → 32 → 16 → D``; the forward net reads dim sums ‖
  straggler waits (2D inputs), the backward net the dim sums (D inputs); both predict per-device
  ms.
- Baseline: scikit-learn's ``HistGradientBoostingRegressor`` on a fixed-length summary of the
  table multiset (:func:`~.features.aggregate_vector`), also on log(ms).

:func:`train` splits the compute combinations 80/10/10 by sample id (the test combinations are
never seen in training; the validation tenth picks the best epoch), trains both models and
reports MAPE and Kendall's tau on the test tenth, and the spread of the noise pairs.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from simulator.errors import SpecError

from planner.costmodel.dataset import load_dataset, split_ids
from planner.costmodel.features import NUM_FEATURES, aggregate_vector, table_matrix
from planner.machine import require_torch

__all__ = ["ComputeNet", "ComputeEnsemble", "CommNet", "train", "mape", "kendall_tau"]


def _torch():
    return require_torch("the learned cost model")


def _mlp(sizes: Sequence[int], *, last_relu: bool):
    nn = _torch().nn
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def ComputeNet(num_features: int = NUM_FEATURES, hidden: int = 128, embed: int = 32,
               head: int = 64, kind: str = "additive"):
    """Build the compute-cost network (a ``torch.nn.Module``; see the module docstring).

    ``kind="neuroshard"``: NeuroShard's sum of table embeddings → MLP head. ``kind="additive"``
    (the default, and what is shipped): the same table MLP, but each table's embedding maps to
    a positive time ``exp(w·z + b)`` and the device's time is their sum plus a learned kernel
    overhead — a fused kernel's time is close to additive over its tables, and this form
    extrapolates from 1 to 20 tables where the pooled head does not (see README).
    """
    torch = _torch()
    if kind not in ("neuroshard", "additive"):
        raise ValueError(f"unknown compute net kind {kind!r}")

    class _ComputeNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kind = kind
            self.register_buffer("mean", torch.zeros(num_features))
            self.register_buffer("std", torch.ones(num_features))
            self.table = _mlp([num_features, hidden, embed], last_relu=True)
            if kind == "neuroshard":
                self.head = _mlp([embed, head, 1], last_relu=False)
            else:
                self.out = torch.nn.Linear(embed, 1)
                self.overhead = torch.nn.Parameter(torch.tensor(0.0))

        def forward(self, x, mask):
            """x: (batch, tables, F) raw features; mask: (batch, tables) 1 for real tables.
            Returns log(ms)."""
            z = self.table((x - self.mean) / self.std)
            if self.kind == "neuroshard":
                return self.head((z * mask.unsqueeze(-1)).sum(dim=1)).squeeze(-1)
            per = torch.exp(self.out(z).squeeze(-1)) * mask
            return torch.log(per.sum(dim=1) + torch.exp(self.overhead))

    return _ComputeNet()


def ComputeEnsemble(members: int):
    """``members`` additive :func:`ComputeNet` s trained from different initialisations; the
    prediction is the mean of their log(ms) (a geometric mean of times). Averaging cuts the
    part of the held-out error that comes from one net's initialisation and mini-batch order
    (on the shipped data: single nets 4.3–6.3% MAPE, five averaged 4.6–5.2%)."""
    torch = _torch()

    class _Ensemble(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kind = "additive-ensemble"
            self.members = torch.nn.ModuleList(ComputeNet() for _ in range(members))

        def forward(self, x, mask):
            return torch.stack([m(x, mask) for m in self.members]).mean(dim=0)

    return _Ensemble()


def CommNet(inputs: int, devices: int):
    """Build a communication network ``inputs → 128 → 64 → 32 → 16 → devices``."""
    torch = _torch()

    class _CommNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.ones(inputs))
            self.mlp = _mlp([inputs, 128, 64, 32, 16, devices], last_relu=False)

        def forward(self, x):
            return self.mlp(x / self.scale)

    return _CommNet()


# ---------------------------------------------------------------------------------------------
# metrics

def mape(pred, true) -> float:
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / np.abs(true)))


def kendall_tau(pred, true) -> float:
    """Kendall's tau (scipy.stats imported here: it costs every `plan` ~0.5 s otherwise)."""
    from scipy.stats import kendalltau

    return float(kendalltau(pred, true).statistic)


def pad(mats: Sequence[np.ndarray]):
    """Stack variable-length (tables, F) matrices into (N, T, F) and a (N, T) mask."""
    torch = _torch()
    t = max(1, max(m.shape[0] for m in mats))
    x = np.zeros((len(mats), t, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((len(mats), t), dtype=np.float32)
    for i, m in enumerate(mats):
        x[i, :len(m)] = m
        mask[i, :len(m)] = 1
    return torch.from_numpy(x), torch.from_numpy(mask)


# ---------------------------------------------------------------------------------------------
# training

def _fit(model, inputs, target, val_inputs, val_target, *, epochs: int, lr: float, seed: int,
         batch_size: int = 32, weight_decay: float = 0.0):
    """Adam with a cosine schedule, mini-batches, MSE; keeps the best validation epoch."""
    torch = _torch()
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, epochs))
    gen = torch.Generator().manual_seed(seed)
    mse = torch.nn.functional.mse_loss
    n = len(target)
    best, best_state = math.inf, None
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            opt.zero_grad()
            loss = mse(model(*[t[idx] for t in inputs]), target[idx])
            loss.backward()
            opt.step()
        sched.step()
        model.eval()
        with torch.no_grad():
            v = float(mse(model(*val_inputs), val_target))
        if v < best:
            best = v
            best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return best


def train_compute_net(mats, y_ms, tr, va, *, seed: int = 0, epochs: int = 300, lr: float = 1e-3,
                      kind: str = "additive"):
    """Train :func:`ComputeNet` on log(ms); returns the model."""
    torch = _torch()
    torch.manual_seed(seed)
    net = ComputeNet(kind=kind)
    allx = np.concatenate([mats[i] for i in tr])
    net.mean.copy_(torch.tensor(allx.mean(axis=0), dtype=torch.float32))
    net.std.copy_(torch.tensor(np.maximum(allx.std(axis=0), 1e-3), dtype=torch.float32))
    xt, mt = pad([mats[i] for i in tr])
    xv, mv = pad([mats[i] for i in va])
    yt = torch.tensor(np.log(y_ms[tr]), dtype=torch.float32)
    yv = torch.tensor(np.log(y_ms[va]), dtype=torch.float32)
    _fit(net, (xt, mt), yt, (xv, mv), yv, epochs=epochs, lr=lr, seed=seed)
    return net


def train_comm_net(x, y, tr, va, *, seed: int = 0, epochs: int = 300, lr: float = 1e-3):
    torch = _torch()
    torch.manual_seed(seed)
    net = CommNet(x.shape[1], y.shape[1])
    net.scale.copy_(torch.tensor(np.maximum(np.abs(x[tr]).mean(axis=0), 1e-3),
                                 dtype=torch.float32))
    xt = torch.tensor(x[tr], dtype=torch.float32)
    xv = torch.tensor(x[va], dtype=torch.float32)
    yt = torch.tensor(np.log(y[tr]), dtype=torch.float32)
    yv = torch.tensor(np.log(y[va]), dtype=torch.float32)
    _fit(net, (xt,), yt, (xv,), yv, epochs=epochs, lr=lr, seed=seed, batch_size=16)
    return net


def additive_members(net) -> list | None:
    """The additive nets whose log-times ``net`` averages (itself when single), or None when
    ``net`` is not additive (its device time is then not a sum of per-table terms)."""
    members = list(net.members) if hasattr(net, "members") else [net]
    return members if all(getattr(m, "kind", None) == "additive" for m in members) else None


def table_terms(members, mat: np.ndarray) -> np.ndarray:
    """Per table and member, the additive term ``exp(w·z + b)`` in ms: (tables, members)."""
    torch = _torch()
    x = torch.from_numpy(np.asarray(mat, dtype=np.float32))
    with torch.no_grad():
        cols = [torch.exp(m.out(m.table((x - m.mean) / m.std)).squeeze(-1)) for m in members]
    return torch.stack(cols, dim=1).numpy().astype(float)


def member_overheads(members) -> np.ndarray:
    """Per member, the learned kernel overhead ``exp(overhead)`` in ms."""
    return np.array([float(m.overhead.detach().exp()) for m in members])


def predict_compute(net, mats) -> np.ndarray:
    torch = _torch()
    with torch.no_grad():
        x, m = pad(mats)
        return np.exp(net(x, m).numpy().astype(float))


def train(data_path, *, seed: int = 0, epochs: int = 300, ensemble: int = 5,
          log=print) -> dict:
    """Train both compute models (and the comm nets when there is comm data) on one data file.
    The shipped compute model is an ensemble of ``ensemble`` additive nets (:func:`ComputeEnsemble`;
    1: a single net).

    Returns ``{"metrics": …, "compute_net": module, "fwd_net": …, "bwd_net": …, "data": Dataset}``.
    """
    from sklearn.ensemble import HistGradientBoostingRegressor
    t0 = time.perf_counter()
    ds = load_dataset(data_path)
    n = len(ds.records)
    if n < 10:
        raise SpecError(f"{data_path}: {n} compute samples are too few to train on",
                        source=str(data_path), fix="collect ≥ 10 samples (--samples)")
    mats = [table_matrix(r, batch=ds.batch) for r in ds.records]
    tr, va, te = split_ids(n, seed)
    y = ds.total_ms
    if ensemble < 1:
        raise ValueError(f"ensemble must be ≥ 1, got {ensemble}")
    members = [train_compute_net(mats, y, tr, va, seed=seed * 100 + k, epochs=epochs,
                                 kind="additive") for k in range(ensemble)]
    if ensemble == 1:
        net = members[0]
    else:
        net = ComputeEnsemble(ensemble)
        for slot, m in zip(net.members, members):
            slot.load_state_dict(m.state_dict())
        net.eval()
    p_net = predict_compute(net, [mats[i] for i in te])
    p_members = [predict_compute(m, [mats[i] for i in te]) for m in members]
    ns_net = train_compute_net(mats, y, tr, va, seed=seed, epochs=epochs, kind="neuroshard")
    p_ns = predict_compute(ns_net, [mats[i] for i in te])
    p_tr = predict_compute(net, [mats[i] for i in tr])
    agg = np.stack([aggregate_vector(r, batch=ds.batch) for r in ds.records])
    gb = HistGradientBoostingRegressor(max_iter=500, learning_rate=0.05, random_state=seed,
                                       early_stopping=False, min_samples_leaf=5)
    gb.fit(agg[np.concatenate([tr, va])], np.log(y[np.concatenate([tr, va])]))
    p_gb = np.exp(gb.predict(agg[te]))
    metrics = {
        "samples": n, "train": len(tr), "validation": len(va), "test": len(te),
        "batch": ds.batch,
        "compute_net": {"kind": "additive", "members": ensemble,
                        "test_mape": mape(p_net, y[te]),
                        "test_kendall_tau": kendall_tau(p_net, y[te]),
                        "train_mape": mape(p_tr, y[tr]),
                        "member_test_mape": [mape(p, y[te]) for p in p_members]},
        "neuroshard_net": {"kind": "neuroshard", "test_mape": mape(p_ns, y[te]),
                           "test_kendall_tau": kendall_tau(p_ns, y[te])},
        "hist_gradient_boosting": {"test_mape": mape(p_gb, y[te]),
                                   "test_kendall_tau": kendall_tau(p_gb, y[te])},
        "test_ms_range": [float(y[te].min()), float(y[te].max())],
    }
    if ds.noise:
        a = np.array(ds.noise)
        rel = np.abs(a[:, 0] - a[:, 1]) / a.mean(axis=1)
        metrics["noise_pairs"] = {"pairs": len(a), "mean_rel_diff": float(rel.mean()),
                                  "median_rel_diff": float(np.median(rel)),
                                  "max_rel_diff": float(rel.max()),
                                  "mape_round1_vs_round0": mape(a[:, 1], a[:, 0]),
                                  "kendall_tau_round1_vs_round0": kendall_tau(a[:, 1], a[:, 0]),
                                  "column": ds.target}
        if ds.noise_alt:
            b = np.array(ds.noise_alt)
            metrics["noise_pairs"][f"{ds.alt}_mape_round1_vs_round0"] = mape(b[:, 1], b[:, 0])
    metrics["target"] = f"median over {ds.passes} pass(es) of {ds.target}"
    out = {"metrics": metrics, "compute_net": net, "neuroshard_net": ns_net, "fwd_net": None,
           "bwd_net": None, "data": ds}
    m = len(ds.comm_sums)
    if m >= 10:
        ctr, cva, cte = split_ids(m, seed + 1)
        xf = np.concatenate([ds.comm_sums, ds.comm_waits], axis=1)
        fnet = train_comm_net(xf, ds.comm_fwd, ctr, cva, seed=seed, epochs=epochs)
        bnet = train_comm_net(ds.comm_sums, ds.comm_bwd, ctr, cva, seed=seed, epochs=epochs)
        torch = _torch()
        with torch.no_grad():
            pf = np.exp(fnet(torch.tensor(xf[cte], dtype=torch.float32)).numpy())
            pb = np.exp(bnet(torch.tensor(ds.comm_sums[cte], dtype=torch.float32)).numpy())
        # baseline for the comm nets: every rank's mean over the training set (as a floor)
        metrics["comm"] = {
            "devices": int(ds.comm_sums.shape[1]), "samples": m, "test": len(cte),
            "fwd_net": {"test_mape": mape(pf.ravel(), ds.comm_fwd[cte].ravel()),
                        "test_kendall_tau": kendall_tau(pf.ravel(), ds.comm_fwd[cte].ravel())},
            "bwd_net": {"test_mape": mape(pb.ravel(), ds.comm_bwd[cte].ravel()),
                        "test_kendall_tau": kendall_tau(pb.ravel(), ds.comm_bwd[cte].ravel())},
        }
        out["fwd_net"], out["bwd_net"] = fnet, bnet
    metrics["train_wall_s"] = time.perf_counter() - t0
    return out
