"""Semantic preservation, run for real: the SPTT route gives every sample the pooled embeddings
of the flat route (torch.distributed, gloo, CPU processes).

``world`` processes form ``world / gpus_per_host`` "hosts" of ``gpus_per_host`` ranks (rank
``h·G + g``); process groups ``intra[h]`` (the host's ranks) and ``cross[g]`` (local index g on
every host), as TorchRec's ``intra_and_cross_node_pg``. Every process builds the same seeded
tables and the same global batch of multi-hot ids (variable lengths, empty bags included) and
keeps its own ``B`` samples. Then:

- **flat**: ids all-to-all over the world to each shard's owner, sum-pooled lookups
  (``torch.nn.EmbeddingBag``) on the owner's block, pooled all-to-all back; row-wise partial
  sums are added, column blocks placed.
- **SPTT**: cross-host peer all-to-all of each host's ids (on ``cross[g]``), the same sharded
  lookup inside the host on ``intra[h]`` for the ``H·B`` samples it then holds, the tower module
  per tower, and the cross-host return of each peer's ``B`` rows.

Each rank returns its ``B × D`` pooled embeddings from both routes (and, when a non-identity
module is given, the flat result passed through the same per-tower modules locally — what the
DMT model computes with the module applied on every rank), so the caller can compare them.
Processes are spawned with a ``timeout`` on their process group and the whole run is bounded;
leftover processes are terminated by their own handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from planner.measure.dmt.module import build_torch_module
from planner.measure.dmt.spawn import spawn_gloo
from planner.measure.runner import init_group
from planner.model.dmt.module import TowerModuleSpec

__all__ = ["SemanticCase", "run_semantic_check", "flat_and_sptt", "table_gradients"]


@dataclass(frozen=True)
class SemanticCase:
    """Tables (rows, dim, mean pooling), the two layouts and the towers.

    ``flat`` and ``host_layouts`` map table index → list of shards ``(rank, row_off, col_off,
    rows, cols)`` in global ranks; ``towers`` is a list of (table indices, host);
    ``modules``: ``(kind, ratio)`` pairs; the SPTT route runs once per module. ``gradients``:
    also a backward pass through both routes (identity modules, :func:`table_gradients`).
    """

    tables: tuple[tuple[int, int, float], ...]
    flat: dict
    host_layouts: dict
    towers: tuple
    world: int
    gpus_per_host: int
    local_batch: int = 16
    seed: int = 0
    modules: tuple = (("identity", 1.0),)
    gradients: bool = False


def _batch(case: SemanticCase):
    """Global batch: per table (lengths (N·B,), values) from the seed."""
    rng = np.random.default_rng(case.seed + 17)
    nb = case.world * case.local_batch
    out = []
    for rows, _dim, pf in case.tables:
        lengths = rng.poisson(pf, size=nb)
        lengths[rng.random(nb) < 0.1] = 0           # some empty bags
        values = rng.integers(0, rows, size=int(lengths.sum()))
        out.append((lengths.astype(np.int64), values.astype(np.int64)))
    return out


def _weights(case: SemanticCase):
    import torch
    g = torch.Generator().manual_seed(case.seed + 5)
    return [torch.randn(rows, dim, generator=g) for rows, dim, _ in case.tables]


def _slice(lengths, values, lo, hi):
    """Samples ``lo:hi`` of a (lengths, values) bag list."""
    off = np.concatenate([[0], np.cumsum(lengths)])
    return lengths[lo:hi], values[off[lo]:off[hi]]


def _sharded_pooled(dist, torch, pg, members: Sequence[int], me: int, layout: dict,
                    bags: dict, b: int, weights, dims, leaves: dict | None = None
                    ) -> "torch.Tensor":
    """Pooled embeddings (b × Σ dims of ``layout``'s tables, table order) for my ``b`` samples,
    the shards living on ``members`` (global ranks, the group's order).

    ``leaves``: train mode — my shards become leaf tensors (``leaves[(t, row_off, col_off)]``)
    and the pooled exchange is differentiable, so a backward pass sends the gradients back
    through the reverse all-to-all to the shard owners."""
    P = len(members)
    tabs = sorted(layout)
    # messages to each member: per shard on it, lengths (b) then values
    send_len, send_val = [[] for _ in range(P)], [[] for _ in range(P)]
    for t in tabs:
        lengths, values = bags[t]
        for (r, ro, co, rows, cols) in layout[t]:
            k = members.index(r)
            rw = rows != weights[t].shape[0]
            if rw:
                mask = (values >= ro) & (values < ro + rows)
                owner = np.repeat(np.arange(b), lengths)
                ln = np.bincount(owner[mask], minlength=b).astype(np.int64)
                vals = values[mask] - ro
            else:
                ln, vals = lengths, values
            send_len[k].append(ln)
            send_val[k].append(vals)

    def a2a(chunks, dtype):
        flat = [np.concatenate(c) if c else np.zeros(0) for c in chunks]
        sizes = [len(x) for x in flat]
        cnt_in = torch.tensor(sizes, dtype=torch.int64)
        cnt_out = torch.empty(P, dtype=torch.int64)
        dist.all_to_all_single(cnt_out, cnt_in, group=pg)
        inp = torch.from_numpy(np.concatenate(flat).astype(dtype)) if sum(sizes) else \
            torch.zeros(0, dtype=torch.int64 if dtype == np.int64 else torch.float32)
        out = torch.empty(int(cnt_out.sum()), dtype=inp.dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=cnt_out.tolist(),
                               input_split_sizes=sizes, group=pg)
        return torch.split(out, cnt_out.tolist())

    got_len = a2a(send_len, np.int64)
    got_val = a2a(send_val, np.int64)
    # my shards, in the same canonical order every sender used
    mine = [(t, sh) for t in tabs for sh in layout[t] if sh[0] == me]
    back = []
    for k in range(P):
        lens = got_len[k].view(len(mine), b) if mine else torch.zeros(0, b, dtype=torch.int64)
        vals, pos, outs = got_val[k], 0, []
        for i, (t, (r, ro, co, rows, cols)) in enumerate(mine):
            n = int(lens[i].sum())
            w = weights[t][ro:ro + rows, co:co + cols]
            if leaves is not None:
                w = leaves.setdefault((t, ro, co), w.clone().requires_grad_(True))
            offs = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens[i], 0)[:-1]])
            outs.append(torch.nn.functional.embedding_bag(vals[pos:pos + n], w, offs, mode="sum"))
            pos += n
        back.append(torch.cat(outs, 1).reshape(-1) if outs else torch.zeros(0))
    sizes = [len(x) for x in back]
    cnt_out = torch.empty(P, dtype=torch.int64)
    dist.all_to_all_single(cnt_out, torch.tensor(sizes, dtype=torch.int64), group=pg)
    out = torch.empty(int(cnt_out.sum()))
    send = torch.cat(back) if sum(sizes) else torch.zeros(0)
    if leaves is not None:
        from torch.distributed.nn.functional import all_to_all_single as a2a_grad
        out = a2a_grad(out, send, output_split_sizes=cnt_out.tolist(), input_split_sizes=sizes,
                       group=pg if pg is not None else dist.group.WORLD)
    else:
        dist.all_to_all_single(out, send, output_split_sizes=cnt_out.tolist(),
                               input_split_sizes=sizes, group=pg)
    parts = torch.split(out, cnt_out.tolist())
    # assemble: member k sent its shards of my samples (b × Σ its cols), table order
    offs_t = {t: sum(dims[u] for u in tabs if u < t) for t in tabs}
    res = torch.zeros(b, sum(dims[t] for t in tabs))
    for k, m in enumerate(members):
        shards = [(t, sh) for t in tabs for sh in layout[t] if sh[0] == m]
        if not shards:
            continue
        block = parts[k].view(b, -1)
        c0 = 0
        for t, (r, ro, co, rows, cols) in shards:
            res[:, offs_t[t] + co: offs_t[t] + co + cols] += block[:, c0:c0 + cols]
            c0 += cols
    return res


def _modules(case: SemanticCase, dims, kind: str, ratio: float):
    spec = TowerModuleSpec(kind=kind, ratio=ratio)
    return [build_torch_module(spec, [dims[t] for t in sorted(tabs)], seed=case.seed + 100 + k)
            for k, (tabs, _h) in enumerate(case.towers)]


def _routes(case: SemanticCase, rank: int, dist, torch, *, train: bool):
    """Both routes up to the host-level pooled embeddings: (flat, pooled, context)."""
    G, N, B = case.gpus_per_host, case.world, case.local_batch
    H = N // G
    h, g = divmod(rank, G)
    intra = [dist.new_group(list(range(k * G, (k + 1) * G))) for k in range(H)]
    cross = [dist.new_group([k * G + j for k in range(H)]) for j in range(G)]
    weights = _weights(case)
    dims = [d for _, d, _ in case.tables]
    batch = _batch(case)
    T = len(case.tables)
    my = {t: _slice(*batch[t], rank * B, (rank + 1) * B) for t in range(T)}
    leaves_f: dict | None = {} if train else None
    leaves_s: dict | None = {} if train else None
    flat = _sharded_pooled(dist, torch, None, list(range(N)), rank, case.flat, my, B,
                           weights, dims, leaves_f)
    # SPTT step 1: my B samples' ids of host k's tables to (k, g)
    host_tabs = [sorted(t for tabs, hh in case.towers if hh == k for t in tabs)
                 for k in range(H)]
    # lengths then values per table, all tables of the destination host, over cross[g]
    cpg = cross[g]

    def x_a2a(chunks, dtype):
        sizes = [len(c) for c in chunks]
        cnt = torch.empty(H, dtype=torch.int64)
        dist.all_to_all_single(cnt, torch.tensor(sizes, dtype=torch.int64), group=cpg)
        inp = torch.from_numpy(np.concatenate(chunks).astype(dtype)) if sum(sizes) else \
            torch.zeros(0, dtype=torch.int64 if dtype == np.int64 else torch.float32)
        out = torch.empty(int(cnt.sum()), dtype=inp.dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=cnt.tolist(),
                               input_split_sizes=sizes, group=cpg)
        return torch.split(out, cnt.tolist())

    lens_in = x_a2a([np.concatenate([my[t][0] for t in host_tabs[k]] or [np.zeros(0)])
                     for k in range(H)], np.int64)
    vals_in = x_a2a([np.concatenate([my[t][1] for t in host_tabs[k]] or [np.zeros(0)])
                     for k in range(H)], np.int64)
    bags = {}
    nt = len(host_tabs[h])
    per_src = []
    for k in range(H):
        lk = lens_in[k].view(nt, B).numpy() if nt else np.zeros((0, B), dtype=np.int64)
        vk = vals_in[k].numpy()
        pos, items = 0, []
        for i in range(nt):
            n = int(lk[i].sum())
            items.append((lk[i], vk[pos:pos + n]))
            pos += n
        per_src.append(items)
    for i, t in enumerate(host_tabs[h]):     # samples ordered by source host: H·B of them
        bags[t] = (np.concatenate([per_src[k][i][0] for k in range(H)]),
                   np.concatenate([per_src[k][i][1] for k in range(H)]))
    layout = {t: case.host_layouts[t] for t in host_tabs[h]}
    pooled = _sharded_pooled(dist, torch, intra[h], list(range(h * G, (h + 1) * G)), rank,
                             layout, bags, H * B, weights, dims, leaves_s) if nt else \
        torch.zeros(H * B, 0)
    ctx = {"host_tabs": host_tabs, "h": h, "cpg": cpg, "dims": dims, "weights": weights,
           "leaves_f": leaves_f, "leaves_s": leaves_s}
    return flat, pooled, ctx


def flat_and_sptt(case: SemanticCase, rank: int, dist, torch):
    """Inside an initialised process group: my samples' flat pooled embeddings and, per module,
    (SPTT output, flat output through the same modules)."""
    with torch.no_grad():
        flat, pooled, c = _routes(case, rank, dist, torch, train=False)
        results = []
        for kind, ratio in case.modules:
            results.append(_sptt_tail(case, dist, torch, pooled, flat, c["host_tabs"], c["h"],
                                      c["cpg"], _modules(case, c["dims"], kind, ratio),
                                      c["dims"]))
    return flat.numpy(), results


def table_gradients(case: SemanticCase, rank: int, dist, torch):
    """Backward through both routes with identity modules: the same seeded gradient of every
    sample's pooled embeddings enters each route; returns the full embedding-table gradients
    (summed over ranks) of the flat route and of the SPTT route, concatenated."""
    flat, pooled, c = _routes(case, rank, dist, torch, train=True)
    dims = c["dims"]
    B, N = case.local_batch, case.world
    gen = torch.Generator().manual_seed(case.seed + 99)
    upstream = torch.randn(N * B, sum(dims), generator=gen)[rank * B:(rank + 1) * B]
    (flat * upstream).sum().backward()
    mods = _modules(case, dims, "identity", 1.0)
    sptt, _ = _sptt_tail(case, dist, torch, pooled, flat.detach(), c["host_tabs"], c["h"],
                         c["cpg"], mods, dims, grad=True)
    cols = np.concatenate([np.arange(sum(dims[:t]), sum(dims[:t + 1]))
                           for tabs, _ in case.towers for t in sorted(tabs)])
    (sptt * upstream[:, torch.from_numpy(cols)]).sum().backward()
    out = []
    for leaves in (c["leaves_f"], c["leaves_s"]):
        full = [torch.zeros_like(w) for w in c["weights"]]
        for (t, ro, co), leaf in leaves.items():
            if leaf.grad is not None:
                full[t][ro:ro + leaf.shape[0], co:co + leaf.shape[1]] += leaf.grad
        flat_all = torch.cat([f.reshape(-1) for f in full])
        dist.all_reduce(flat_all)
        out.append(flat_all.numpy())
    return out


def _sptt_tail(case, dist, torch, pooled, flat, host_tabs, h, cpg, mods, dims, *,
               grad: bool = False):
    """Steps 5–6 (modules, cross-host return) and the flat-then-module reference."""
    B = case.local_batch
    H = case.world // case.gpus_per_host
    T = len(case.tables)
    # tower modules on the host's towers (columns of each tower inside the host's order)
    col = {t: sum(dims[u] for u in host_tabs[h] if u < t) for t in host_tabs[h]}
    outs = []
    for k, (tabs, hh) in enumerate(case.towers):
        if hh != h:
            continue
        x = torch.cat([pooled[:, col[t]:col[t] + dims[t]] for t in sorted(tabs)], 1)
        outs.append(mods[k](x))
    y = torch.cat(outs, 1) if outs else torch.zeros(H * B, 0)
    # step 6: rows of source host k back to (k, g)
    width = y.shape[1]
    chunks = [y[k * B:(k + 1) * B].reshape(-1) for k in range(H)]
    wcnt = torch.empty(H, dtype=torch.int64)
    dist.all_to_all_single(wcnt, torch.full((H,), width, dtype=torch.int64), group=cpg)
    out = torch.empty(int(wcnt.sum()) * B)
    if grad:
        from torch.distributed.nn.functional import all_to_all_single as a2a_grad
        out = a2a_grad(out, torch.cat(chunks), output_split_sizes=(wcnt * B).tolist(),
                       input_split_sizes=[width * B] * H, group=cpg)
    else:
        dist.all_to_all_single(out, torch.cat(chunks), output_split_sizes=(wcnt * B).tolist(),
                               input_split_sizes=[width * B] * H, group=cpg)
    got = [p.view(B, -1) for p in torch.split(out, (wcnt * B).tolist())]
    # reassemble in the flat order: towers in table order of their first table
    pieces = {}
    for k in range(H):
        c0 = 0
        for j, (tabs, hh) in enumerate(case.towers):
            if hh != k:
                continue
            wj = mods[j](torch.zeros(1, sum(dims[t] for t in tabs))).shape[1]
            pieces[j] = got[k][:, c0:c0 + wj]
            c0 += wj
    sptt = torch.cat([pieces[j] for j in range(len(case.towers))], 1)
    # reference: the flat pooled embeddings through the same per-tower modules, locally
    fcol = {t: sum(dims[u] for u in range(T) if u < t) for t in range(T)}
    ref = torch.cat([mods[j](torch.cat([flat[:, fcol[t]:fcol[t] + dims[t]]
                                        for t in sorted(tabs)], 1))
                     for j, (tabs, _h) in enumerate(case.towers)], 1)
    if grad:
        return sptt, ref
    return sptt.detach().numpy(), ref.detach().numpy()


def _worker(rank: int, case: SemanticCase, rdzv: str, outdir: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        init_group("gloo", rank, case.world, rdzv, timeout_s)
        flat, results = flat_and_sptt(case, rank, dist, torch)
        arrays = {"flat": flat}
        for i, (sptt, ref) in enumerate(results):
            arrays[f"sptt{i}"], arrays[f"ref{i}"] = sptt, ref
        if case.gradients:
            arrays["grad_flat"], arrays["grad_sptt"] = table_gradients(case, rank, dist, torch)
        np.savez(Path(outdir) / f"rank{rank}.npz", **arrays)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent through the file system
        (Path(outdir) / f"rank{rank}.err").write_text(f"{type(exc).__name__}: {exc}")
        raise


def run_semantic_check(case: SemanticCase, *, timeout_s: float = 120.0) -> list[dict]:
    """Spawn ``case.world`` gloo processes; per rank ``{flat: array, sptt: [array per module],
    ref: [array per module]}`` (see :func:`spawn_gloo` for failures and timeouts)."""
    raw = spawn_gloo(_worker, case.world, case, timeout_s=timeout_s)
    n = len(case.modules)
    return [{"flat": z["flat"], "sptt": [z[f"sptt{i}"] for i in range(n)],
             "ref": [z[f"ref{i}"] for i in range(n)],
             "grad_flat": z.get("grad_flat"), "grad_sptt": z.get("grad_sptt")} for z in raw]
