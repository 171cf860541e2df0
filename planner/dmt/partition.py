"""Tower Partitioner: group features into towers by learned affinity, with balanced tower cost.

Steps (reconstructed, not confirmed by the DMT paper, whose partitioner is not public;
papers.md §3.4):

1. **Co-access statistics.** A matrix of per-sample feature activity (samples × features: how
   many ids each feature has in each sample). Specs carry none, so :func:`synthetic_coaccess`
   draws a seeded sample with latent interest groups (features of one group are active
   together), or the caller passes a measured one.
2. **Affinity** ``A_ij = |corr(activity_i, activity_j)|`` (zero diagonal).
3. **Feature embeddings**: the spectral embedding of ``A`` (top eigenvectors of
   ``D^-1/2 A D^-1/2``, rows normalised) — features that are accessed together land close.
4. **Clustering**: k-means (SciPy's, four seeded k-means++ starts) into ``T`` clusters.
5. **Balance**: a PuLP/CBC MIP assigns every feature to one tower, maximising each feature's
   mean affinity to its tower's cluster, subject to tower cost ≤ ``(1 + ε)·W/T`` and the tower
   memory cap; warm-started from a repair of the clusters (moves of the least-attached features
   out of over-full towers) and falling back to it when CBC finds nothing better within a node
   budget planned from the model's size (deterministic: the clock only stops runaway solves). The
   MIP also caps each tower's pooled width (Σ dims) near the mean: a tower's cross-host
   exchange grows with its width, so a wide tower would be the bottleneck sender.
   Tower cost ``w_f`` is the feature's analytic lookup time forward and backward for the global
   batch (:mod:`planner.model.tables.cost`, table-wise), which is what a tower's host spends on it.
6. **Towers → hosts**: ``ceil(T/H)`` towers at most per host, longest tower first onto the
   least-loaded host.

Baselines: ``random`` (a shuffled round-robin: equal counts, costs ignored) and ``balanced``
(longest-processing-time on cost, affinity ignored). Metrics: :func:`imbalance` (max/mean − 1
of tower costs) and :func:`affinity_kept` (share of the total affinity inside towers).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from simulator.errors import SpecError

from planner.dmt.tower_mip import tower_mip
from planner.model.dmt.layout import TowerLayout, host_groups, make_layout
from planner.model.dmt.module import TowerModuleSpec
from planner.model.tables.features import F_BWD, F_FWD, F_MEM
from planner.model.tables.shards import Shard, ShardingType
from planner.model.tables.spec import ModelSpec
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["synthetic_coaccess", "affinity_matrix", "spectral_embedding", "feature_costs",
           "partition_features", "assign_hosts", "imbalance", "affinity_kept",
           "PartitionResult", "partition_layout", "METHODS", "resolve_towers"]

METHODS = ("affinity", "balanced", "random")


def synthetic_coaccess(model: ModelSpec, *, samples: int = 2048, groups: int | None = None,
                       seed: int = 0) -> np.ndarray:
    """A seeded sample of per-feature activity, ``samples × F`` (float32 id counts).

    Each feature belongs to one of ``groups`` latent interest groups (default ``max(2, F//8)``);
    each sample has sparse interest weights over the groups (Gamma(0.3), normalised), and
    feature ``f`` of group ``k`` has ``Poisson(L_f · (0.2 + 0.8·groups·z_k))`` ids, so its mean
    is its pooling factor and features of one group rise and fall together.
    """
    F = model.num_tables
    k = int(groups) if groups else max(2, F // 8)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xD317]))
    member = rng.integers(0, k, size=F)
    z = rng.gamma(0.3, size=(samples, k))
    z /= np.maximum(z.sum(axis=1, keepdims=True), 1e-12)
    L = np.array([max(t.pooling_factor, 1e-3) for t in model.tables])
    lam = L[None, :] * (0.2 + 0.8 * k * z[:, member])
    return rng.poisson(lam).astype(np.float32)


def affinity_matrix(activity: np.ndarray) -> np.ndarray:
    """``|corr|`` between feature columns, zero diagonal (constant columns: no affinity)."""
    x = np.asarray(activity, dtype=float)
    x = x - x.mean(axis=0)
    sd = np.sqrt((x * x).mean(axis=0))
    ok = sd > 0
    y = np.zeros_like(x)
    y[:, ok] = x[:, ok] / sd[ok]
    a = np.abs(y.T @ y) / max(len(x), 1)
    np.fill_diagonal(a, 0.0)
    return np.clip(a, 0.0, 1.0)


def spectral_embedding(a: np.ndarray, dims: int) -> np.ndarray:
    """Rows: one unit vector per feature from the top ``dims`` eigenvectors of the normalised
    affinity."""
    d = a.sum(axis=1)
    inv = 1.0 / np.sqrt(np.maximum(d, 1e-12))
    m = a * inv[:, None] * inv[None, :]
    vals, vecs = np.linalg.eigh(m)
    k = max(1, min(dims, len(a)))
    e = vecs[:, -k:]
    n = np.linalg.norm(e, axis=1, keepdims=True)
    return e / np.maximum(n, 1e-12)


def kmeans(points: np.ndarray, k: int, *, seed: int = 0, starts: int = 4, iterations: int = 50
           ) -> tuple[np.ndarray | None, float]:
    """Labels of ``points`` (rows) in ``k`` clusters and their inertia (sum of squared
    distances to the centroids): SciPy's k-means from ``starts`` seeded k-means++ starts, the
    lowest inertia kept; (None, inf) when every start leaves a cluster empty."""
    from scipy.cluster.vq import ClusterError, kmeans2
    best, best_inertia = None, math.inf
    for start in range(starts):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), start, 0x4B4D]))
        try:
            centroids, labels = kmeans2(points, k, iter=iterations, minit="++",
                                        missing="raise", rng=rng)
        except ClusterError:
            continue
        inertia = float(((points - centroids[labels]) ** 2).sum())
        if inertia < best_inertia - 1e-12:
            best, best_inertia = labels.astype(int), inertia
    return best, best_inertia


def feature_costs(task: ShardingTask, devices: int) -> tuple[np.ndarray, np.ndarray]:
    """Per feature: lookup seconds forward + backward for the global batch (table-wise), and
    memory bytes (weights and optimizer state)."""
    problem = prepare(task, devices)
    cm = problem.cost
    w, m = [], []
    for i, t in enumerate(task.model.tables):
        f = cm.shard_features(i, Shard(0, 0, 0, t.num_embeddings, t.embedding_dim),
                              ShardingType.TABLE_WISE)
        w.append(f[F_FWD] + f[F_BWD])
        m.append(f[F_MEM])
    return np.array(w), np.array(m)


def imbalance(costs: Sequence[float]) -> float:
    """max / mean − 1 of tower costs (0: perfectly balanced)."""
    c = np.asarray(costs, dtype=float)
    return float(c.max() / c.mean() - 1.0) if len(c) and c.mean() > 0 else 0.0


def affinity_kept(a: np.ndarray, labels: Sequence[int]) -> float:
    """Share of the total pairwise affinity whose two features share a tower."""
    lab = np.asarray(labels)
    same = lab[:, None] == lab[None, :]
    tot = a.sum()
    return float((a * same).sum() / tot) if tot > 0 else 0.0


def _lpt(w: np.ndarray, T: int) -> np.ndarray:
    lab = np.empty(len(w), dtype=int)
    load = np.zeros(T)
    for f in sorted(range(len(w)), key=lambda i: (-w[i], i)):
        t = int(np.argmin(load))
        lab[f] = t
        load[t] += w[f]
    return lab


def _repair(lab: np.ndarray, w: np.ndarray, s: np.ndarray, cap: float, T: int,
            max_iter: int = 100000) -> np.ndarray:
    """Move features out of towers over ``cap`` (least affinity lost first), then swap pairs;
    returns a labelling within ``cap`` when one was found this way (else the best reached)."""
    lab = lab.copy()
    load = np.bincount(lab, weights=w, minlength=T).astype(float)
    for _ in range(max_iter):
        src = int(np.argmax(load))
        if load[src] <= cap + 1e-15:
            break
        members = np.flatnonzero(lab == src)
        best = None
        for f in (members if len(members) > 1 else []):
            room = load + w[f] <= cap + 1e-15
            room[src] = False
            if not room.any():
                continue
            gain = np.where(room, s[f] - s[f, src], -np.inf)
            t = int(np.argmax(gain))
            key = (gain[t], -w[f])
            if best is None or key > best[0]:
                best = (key, f, t)
        if best is None:
            # swap: a heavy member of src with a lighter feature elsewhere that fits both sides
            done = False
            for f in sorted(members, key=lambda i: -w[i]):
                for g in np.argsort(w):
                    t = lab[g]
                    if t == src or w[g] >= w[f]:
                        continue
                    if load[t] - w[g] + w[f] <= cap + 1e-15:
                        lab[f], lab[g] = t, src
                        load[src] += w[g] - w[f]
                        load[t] += w[f] - w[g]
                        done = True
                        break
                if done:
                    break
            if not done:
                break
            continue
        _, f, t = best
        lab[f] = t
        load[src] -= w[f]
        load[t] += w[f]
    return lab


def resolve_towers(towers: int | str, num_features: int, hosts: int) -> int:
    """``auto`` → one tower per host (at most one per feature); a number as given."""
    if towers in (None, "auto"):
        return max(1, min(hosts, num_features))
    try:
        k = int(towers)
    except (TypeError, ValueError):
        raise SpecError(f"--towers must be auto or a whole number, got {towers!r}",
                        source="--towers", fix="pass --towers auto or e.g. --towers 4") from None
    if not 1 <= k <= num_features:
        raise SpecError(f"--towers {k} is outside 1..{num_features} (one table at least per "
                        "tower)", source="--towers", fix=f"use 1..{num_features} or auto")
    return k


def partition_features(a: np.ndarray | None, w: np.ndarray, T: int, *, method: str = "affinity",
                       mem: np.ndarray | None = None, mem_cap: float = math.inf,
                       epsilon: float = 0.05, seed: int = 0, time_limit_s: float = 5.0,
                       embed_dims: int | None = None, width: np.ndarray | None = None
                       ) -> tuple[np.ndarray, dict]:
    """Labels (tower of each feature) and notes for one of :data:`METHODS`.

    ``width`` (the features' embedding dims): the affinity MIP also keeps every tower's pooled
    width within ``(1 + max(ε, 1/ceil(F/T)))`` of the mean (at most about one feature above
    it), since a tower's cross-host exchange grows with its width; dropped (and noted) when
    CBC finds no assignment within both caps in its budget.
    """
    F = len(w)
    mem = np.zeros(F) if mem is None else np.asarray(mem, dtype=float)
    notes: dict = {"method": method, "towers": T}
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x70E4]))
    if method not in METHODS:
        raise SpecError(f"unknown partitioner {method!r}", source="--partitioner",
                        fix=f"use one of: {', '.join(METHODS)}")
    if T == 1:
        return np.zeros(F, dtype=int), notes
    if method == "random":
        lab = np.empty(F, dtype=int)
        lab[rng.permutation(F)] = np.arange(F) % T
        return lab, notes
    lpt = _lpt(w, T)
    if method == "balanced":
        return lpt, notes
    if a is None:
        raise SpecError("the affinity partitioner needs co-access statistics", source="coaccess",
                        fix="pass a samples × features activity matrix")
    t0 = time.perf_counter()
    clusters, inertia = kmeans(spectral_embedding(a, embed_dims or T), T, seed=seed)
    if clusters is None:
        notes["kmeans"] = "no clustering without an empty cluster: the cost-balanced start"
        clusters = lpt
    # s[f, t]: mean affinity of f to the other members of cluster t
    onehot = np.eye(T)[clusters]
    counts = onehot.sum(axis=0)
    s = (a @ onehot) / np.maximum(counts - onehot, 1.0)
    W = w.sum()
    cap = (1.0 + epsilon) * W / T
    lpt_max = np.bincount(lpt, weights=w, minlength=T).max()
    if lpt_max > cap:
        notes["balance_target_relaxed"] = f"{lpt_max / (W / T) - 1:.4f} (LPT's; a feature " \
                                          "or the mix is too coarse for the target)"
        cap = lpt_max
    start = _repair(clusters, w, s, cap, T)
    if np.bincount(start, weights=w, minlength=T).max() > cap * (1 + 1e-9):
        start = lpt
    if math.isfinite(mem_cap) and np.bincount(start, weights=mem, minlength=T).max() > mem_cap:
        start = _lpt(mem, T)
    obj0 = float(s[np.arange(F), start].sum())
    lab, status = start, "repair"
    if F * T <= 60000 and time_limit_s > 0:
        tries = []
        if width is not None:
            width = np.asarray(width, dtype=float)
            eps_w = max(epsilon, 1.0 / math.ceil(F / T))
            tries.append((1.0 + eps_w) * width.sum() / T)
        tries.append(math.inf)
        for wcap in tries:
            got, st = tower_mip(s, w, mem, cap, mem_cap, start, time_limit_s=time_limit_s,
                                seed=seed, width=width, width_cap=wcap)
            if got is None:
                notes.setdefault("mip_not_used", []).append(st)
                continue
            load = np.bincount(got, weights=w, minlength=T)
            ok_w = not math.isfinite(wcap) or np.bincount(
                got, weights=width, minlength=T).max() <= wcap * (1 + 1e-9)
            better = float(s[np.arange(F), got].sum()) >= obj0 - 1e-9 or math.isfinite(wcap)
            if load.max() <= cap * (1 + 1e-6) and ok_w and better:
                lab, status = got, f"mip ({st})"
                if math.isfinite(wcap):
                    notes["width_cap"] = float(wcap)
                break
        if width is not None and "width_cap" not in notes:
            notes["width_cap"] = "dropped (no assignment within both caps in the MIP's budget)"
    notes.update({"solver": status, "kmeans_inertia": inertia if clusters is not lpt else None,
                  "balance_cap_s": float(cap), "wall_s": time.perf_counter() - t0})
    return lab, notes


def assign_hosts(tower_costs: Sequence[float], hosts: int) -> list[int]:
    """Host of each tower: at most ``ceil(T/H)`` per host, longest first onto the least loaded."""
    T = len(tower_costs)
    per = math.ceil(T / hosts)
    load = np.zeros(hosts)
    count = np.zeros(hosts, dtype=int)
    out = [0] * T
    for t in sorted(range(T), key=lambda i: (-tower_costs[i], i)):
        free = np.flatnonzero(count < per)
        h = int(free[np.argmin(load[free])])
        out[t] = h
        load[h] += tower_costs[t]
        count[h] += 1
    return out


@dataclass
class PartitionResult:
    """Towers of a task: the layout, tower costs, imbalance, affinity kept, notes."""

    layout: TowerLayout
    labels: np.ndarray
    tower_costs_s: np.ndarray
    imbalance: float
    affinity_kept: float | None
    notes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"tower_costs_s": [float(c) for c in self.tower_costs_s],
                "imbalance": self.imbalance, "affinity_kept": self.affinity_kept,
                "notes": {k: v for k, v in self.notes.items() if k != "wall_s"}}


def partition_layout(task: ShardingTask, devices: int, *, towers: int | str = "auto",
                     module: TowerModuleSpec | None = None, method: str = "affinity",
                     coaccess: np.ndarray | None = None, epsilon: float = 0.05, seed: int = 0,
                     time_limit_s: float = 5.0) -> PartitionResult:
    """Partition ``task``'s features into towers on the hosts of ``devices`` GPUs."""
    problem = prepare(task, devices)
    groups = host_groups(problem)
    H, G = len(groups), len(groups[0])
    model = task.model
    T = resolve_towers(towers, model.num_tables, H)
    w, mem = feature_costs(task, devices)
    a = None
    if method == "affinity" or coaccess is not None:
        act = coaccess if coaccess is not None else synthetic_coaccess(model, seed=seed)
        act = np.asarray(act, dtype=float)
        if act.ndim != 2 or act.shape[1] != model.num_tables:
            raise SpecError(f"co-access matrix has shape {act.shape}, expected (samples, "
                            f"{model.num_tables})", source="--coaccess",
                            fix="one column per table, in the spec's order")
        a = affinity_matrix(act)
    per_host = math.ceil(T / H)
    mem_cap = problem.capacity_bytes[0] * G / per_host
    dims = np.array([t.embedding_dim for t in model.tables], dtype=float)
    labels, notes = partition_features(a, w, T, method=method, mem=mem, mem_cap=mem_cap,
                                       epsilon=epsilon, seed=seed, time_limit_s=time_limit_s,
                                       width=dims)
    costs = np.bincount(labels, weights=w, minlength=T)
    hosts = assign_hosts(costs, H)
    groups_t = [np.flatnonzero(labels == t).tolist() for t in range(T)]
    layout = make_layout(model, groups_t, hosts, hosts=H, gpus_per_host=G,
                         module=module or TowerModuleSpec())
    return PartitionResult(layout=layout, labels=labels, tower_costs_s=costs,
                           imbalance=imbalance(costs),
                           affinity_kept=affinity_kept(a, labels) if a is not None else None,
                           notes=notes)
