"""Pre-training data for the learned cost model, measured on this machine.

**Compute samples** (NeuroShard's recipe, scaled to a CPU): a pool of ``pool_size`` synthetic
tables from the calibrated generator (:func:`planner.model.tables.generate.synthesize_tables`),
rows scaled by ``row_scale`` (1/16) together with the global batch (65,536 → 4,096) so that
distinct rows per batch and rows keep their ratio; every pool table is augmented with the dims
{4, 8, 16, 32, 64, 128} (its ids do not depend on the dim, so the copies share one id batch).
Sample ``i`` draws 1–``max_tables`` (table, dim) configurations uniformly with replacement,
redrawn until their fp32 size ≤ ``max_bytes``, builds one fused FBGEMM TBE and times forward +
backward with the fused exact-SGD update (``kernels.time_shard_set``, on the CPU with
one thread or with ``device="cuda"`` on the GPU (its name joins the hardware record); cache
flushed before every iteration, ``repeats`` timed iterations after ``warmup``; the row keeps
their median ``total_ms`` and their fastest ``total_min_ms``).

**Communication samples** on ``comm_devices`` gloo processes: T ~ U{10..59} tables with dims
from the same set; balance level p ~ U(0, 1): dims sorted descending, each to a random device
with probability p, else to the device with the smallest dim sum; straggler spread
d ~ U{1..19} ms, per-rank sleeps U{0..d−1} ms minus their minimum. Per rank the forward
all-to-all including the straggler wait and the backward all-to-all (``comm_worker.py``).

**Passes**: every compute sample is measured in ``passes`` passes over all samples, pass
``p`` (column ``round``) after the whole of pass ``p − 1``, minutes apart. Training takes the
median over the passes of each pass's fastest iteration. Why (measured on the 2-core EPYC VM,
2026-11-22): a kernel's iterations are bimodal, a fast mode and a slow one 20–40% above it,
and the slow share drifts with other tenants' load (invisible in ``/proc/stat``), so a median
of 7 moved by 10–12% between passes; the fastest of 25 moved by 6%, apart from rare spells in
which every iteration of one pass was slow (+14–26%), which the median over three passes
discards. ``train`` reports the pass-to-pass spread of both columns.

Every sample derives from ``(seed, sample_id)`` alone, so a run can be interrupted and resumed:
rows are appended and flushed one by one, and ids already in the file are skipped. The sidecar
``DATA.meta.json`` records the configuration and the hardware (CPU model, cores, torch and
fbgemm_gpu versions, threads, kernel backend); appending from other hardware is refused unless
``mix_hardware``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np
from tqdm import tqdm

from simulator.errors import SpecError

from planner.costmodel.datafile import COLUMNS, meta_path, read_data
from planner.machine import cpu_description, installed_description
from planner.measure.runner import PythonRanks, end_processes, failed, release, rendezvous, wait
from planner.measure.tables.kernels import time_shard_set
from planner.measure.tables.tbe import KernelTable, kernel_backend
from planner.model.tables.generate import synthesize_tables
from planner.model.tables.ids import table_ids

__all__ = ["CollectConfig", "collect", "hardware_info", "hardware_id", "DIMS"]

DIMS = (4, 8, 16, 32, 64, 128)
FORMAT = "clusterplan.costmodel-data"
HW_KEYS = ("cpu_model", "cpu_count", "torch", "fbgemm_gpu", "threads", "backend")


@dataclass(frozen=True)
class CollectConfig:
    seed: int = 0
    samples: int = 400
    comm_samples: int = 100
    passes: int = 3
    pool_size: int = 856
    row_scale: float = 1 / 16
    batch: int = 4096
    max_tables: int = 20
    max_bytes: int = 256 * 1024 ** 2
    repeats: int = 20
    warmup: int = 1
    comm_devices: int = 4
    comm_repeats: int = 5
    comm_warmup: int = 2
    threads: int = 1
    #: where the compute samples run: "cpu" or "cuda" (the all-to-all samples always use gloo
    #: processes on this host's CPU)
    device: str = "cpu"

    def key(self) -> dict:
        """The fields that fix what sample ``i`` is (``samples`` counts may grow on resume)."""
        d = asdict(self)
        for k in ("samples", "comm_samples", "passes"):
            d.pop(k)
        if d["device"] == "cpu":          # files collected before the field existed resume
            d.pop("device")
        return d


def hardware_info(threads: int = 1, *, light: bool = False, device: str = "cpu") -> dict:
    """What the measurements depend on: CPU model and cores, torch and fbgemm_gpu versions,
    threads and kernel backend (plus platform facts), and the GPU's name when the kernels run
    on ``device="cuda"``. ``light`` reads the versions from the installed package metadata
    instead of importing fbgemm_gpu (the weights loader's check)."""
    if not light:
        info = cpu_description()
        info["threads"] = int(threads)
        info["backend"] = kernel_backend("auto")
        if device == "cuda":
            import torch
            info["gpu"] = torch.cuda.get_device_name(0)
        return info
    return installed_description(threads)


def hardware_id(info: dict) -> str:
    fields = {k: info.get(k) for k in HW_KEYS}
    if info.get("gpu"):                   # CPU-only ids stay what they were
        fields["gpu"] = info["gpu"]
    key = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# samples

@lru_cache(maxsize=4)
def _pool(seed: int, pool_size: int, row_scale: float):

    tabs = synthesize_tables(pool_size, seed=seed, prefix="p")
    return tuple(replace(t, num_embeddings=max(100, int(round(t.num_embeddings * row_scale))))
                 for t in tabs)


def compute_sample(cfg: CollectConfig, sid: int) -> list[tuple[int, int]]:
    """``[(pool index, dim), …]`` of compute sample ``sid``."""
    pool = _pool(cfg.seed, cfg.pool_size, cfg.row_scale)
    rng = np.random.default_rng(np.random.SeedSequence([int(cfg.seed), int(sid), 0xC0C0]))
    while True:
        n = int(rng.integers(1, cfg.max_tables + 1))
        idx = rng.integers(0, len(pool), size=n)
        dims = rng.choice(np.array(DIMS), size=n)
        size = sum(pool[i].num_embeddings * int(d) * 4 for i, d in zip(idx, dims))
        if size <= cfg.max_bytes:
            return [(int(i), int(d)) for i, d in zip(idx, dims)]


def comm_sample(cfg: CollectConfig, sid: int) -> tuple[list[int], list[float]]:
    """Per-device dim sums and straggler sleeps (ms) of communication sample ``sid``."""
    rng = np.random.default_rng(np.random.SeedSequence([int(cfg.seed), int(sid), 0xC033]))
    d = cfg.comm_devices
    t = int(rng.integers(10, 60))
    dims = sorted((int(x) for x in rng.choice(np.array(DIMS), size=t)), reverse=True)
    p = float(rng.random())
    sums = [0] * d
    for dim in dims:
        r = int(rng.integers(0, d)) if rng.random() < p else int(np.argmin(sums))
        sums[r] += dim
    spread = int(rng.integers(1, 20))
    sleeps = rng.integers(0, spread, size=d).astype(float)
    sleeps -= sleeps.min()
    return sums, [float(x) for x in sleeps]


def table_record(cfg: CollectConfig, pool_index: int, dim: int) -> list:
    t = _pool(cfg.seed, cfg.pool_size, cfg.row_scale)[pool_index]
    return [pool_index, t.num_embeddings, dim, round(t.pooling_factor, 5)] + \
        [round(float(b), 5) for b in t.reuse_bins]


class _Ids:
    """One id batch per pool table (shared by its dim copies)."""

    def __init__(self, cfg: CollectConfig) -> None:
        self.cfg = cfg
        self.cache: dict[int, object] = {}

    def kernel_table(self, pool_index: int, dim: int):
        t = _pool(self.cfg.seed, self.cfg.pool_size, self.cfg.row_scale)[pool_index]
        if pool_index not in self.cache:
            self.cache[pool_index] = table_ids(t, self.cfg.batch, seed=self.cfg.seed,
                                               index=pool_index)
        ids = self.cache[pool_index]
        return KernelTable(t.num_embeddings, dim, "fp32", ids.indices, ids.offsets, name=t.name)


# ---------------------------------------------------------------------------------------------
# file handling


def _open_meta(out: Path, cfg: CollectConfig, hw: dict, mix_hardware: bool) -> dict:
    mp = meta_path(out)
    hid = hardware_id(hw)
    if out.exists() and out.stat().st_size > 0:
        if not mp.exists():
            raise SpecError(f"{out} exists without its metadata {mp.name}", source=str(out),
                            fix="collect into a new file")
        meta = json.loads(mp.read_text())
        known = {h["id"] for h in meta["hardware"]}
        if hid not in known:
            if not mix_hardware:
                old = meta["hardware"][0]
                raise SpecError(
                    f"{out} holds data from other hardware ({old.get('cpu_model')}, torch "
                    f"{old.get('torch')}, {old.get('threads')} threads) than this machine "
                    f"({hw.get('cpu_model')}, torch {hw.get('torch')}, {hw.get('threads')} "
                    f"threads)", source=str(out), field="hardware",
                    fix="collect into a new file, or pass --mix-hardware to append anyway")
            meta["hardware"].append(dict(hw, id=hid))
        if meta.get("config") != cfg.key():
            diff = sorted(k for k in cfg.key() if meta.get("config", {}).get(k) != cfg.key()[k])
            raise SpecError(f"{out} was collected with another configuration ({', '.join(diff)})",
                            source=str(out), field="config",
                            fix="resume with the same --seed and options, or use a new --out")
        return meta
    return {"format": FORMAT, "version": 1, "config": cfg.key(),
            "hardware": [dict(hw, id=hid)], "runs": []}


def _write_meta(out: Path, meta: dict) -> None:
    tmp = meta_path(out).with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, meta_path(out))


def collect(out: str | Path, cfg: CollectConfig = CollectConfig(), *, mix_hardware: bool = False,
            progress: bool = True, command: str = "", max_seconds: float | None = None) -> dict:
    """Measure the samples of ``cfg`` not yet in ``out`` and append them; returns counts."""

    out = Path(out)
    if cfg.device not in ("cpu", "cuda"):
        raise SpecError(f"--device must be cpu or cuda, got {cfg.device!r}", source="--device",
                        fix="pass --device cpu (or cuda on a machine with a GPU)")
    if cfg.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SpecError("--device cuda requested but torch sees no GPU", source="--device",
                            fix="use --device cpu, or run on a machine with a GPU and a CUDA "
                                "build of torch and fbgemm_gpu")
    hw = hardware_info(cfg.threads, device=cfg.device)
    hid = hardware_id(hw)
    meta = _open_meta(out, cfg, hw, mix_hardware)
    done = set()
    if out.exists() and out.stat().st_size > 0:
        for r in read_data(out):
            done.add((r["kind"], int(r["sample_id"]), int(r["round"]), r["hw"]))
    run = {"started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": command, "hardware": hid, "load_avg_start": list(os.getloadavg())}
    meta["runs"].append(run)
    _write_meta(out, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not out.exists() or out.stat().st_size == 0
    todo = [("compute", i, p) for p in range(cfg.passes) for i in range(cfg.samples)]
    comm = [i for i in range(cfg.comm_samples) if ("comm", i, 0, hid) not in done]
    todo = [t for t in todo if (t[0], t[1], t[2], hid) not in done]
    t_start = time.monotonic()
    counts = {"compute": 0, "comm": 0, "skipped": len(done)}
    ids = _Ids(cfg)
    with open(out, "a", newline="") as f:
        w = csv.writer(f)
        if new_file:
            w.writerow(COLUMNS)
            f.flush()
        bar = tqdm(total=len(todo) + len(comm), desc="costmodel collect", unit="sample",
                   disable=not progress, file=sys.stderr)
        for kind, sid, rnd in todo:
            if max_seconds is not None and time.monotonic() - t_start > max_seconds:
                break
            combo = compute_sample(cfg, sid)
            tables = [ids.kernel_table(i, d) for i, d in combo]
            tm = time_shard_set(tables, repeats=cfg.repeats, warmup=cfg.warmup,
                                threads=cfg.threads, device=cfg.device)
            recs = [table_record(cfg, i, d) for i, d in combo]
            tmin = min(a + b for a, b in zip(tm.fwd_samples, tm.bwd_samples))
            w.writerow(["compute", sid, rnd, hid, len(combo), json.dumps(recs),
                        f"{tm.fwd_s * 1e3:.5f}", f"{tm.bwd_s * 1e3:.5f}",
                        f"{tm.total_s * 1e3:.5f}", f"{tmin * 1e3:.5f}", "", "", "", ""])
            f.flush()
            counts["compute"] += 1
            bar.update(1)
        left = None if max_seconds is None else max_seconds - (time.monotonic() - t_start)
        if comm and (left is None or left > 0):
            for chunk_start in range(0, len(comm), 25):
                chunk = comm[chunk_start:chunk_start + 25]
                for sid, sums, sleeps, fw, bw in _measure_comm(cfg, chunk):
                    w.writerow(["comm", sid, 0, hid, "", "", "", "", "", "", json.dumps(sums),
                                json.dumps(sleeps), json.dumps([round(x, 5) for x in fw]),
                                json.dumps([round(x, 5) for x in bw])])
                    f.flush()
                    counts["comm"] += 1
                    bar.update(1)
                if max_seconds is not None and time.monotonic() - t_start > max_seconds:
                    break
        bar.close()
    run["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run["load_avg_end"] = list(os.getloadavg())
    run["rows_added"] = counts["compute"] + counts["comm"]
    _write_meta(out, meta)
    return counts


def _measure_comm(cfg: CollectConfig, sids: list[int]):
    """Run ``collect_comm_worker.py`` on ``comm_devices`` processes for samples ``sids``."""
    world = cfg.comm_devices
    local = [len(a) for a in np.array_split(np.arange(cfg.batch), world)]
    jobs = []
    for sid in sids:
        sums, sleeps = comm_sample(cfg, sid)
        jobs.append({"sample_id": sid, "dim_sums": sums, "sleeps_ms": sleeps,
                     "local_batch": local, "warmup": cfg.comm_warmup,
                     "repeats": cfg.comm_repeats})
    with tempfile.TemporaryDirectory() as tmp:
        jp = Path(tmp) / "jobs.json"
        jp.write_text(json.dumps(jobs))
        _run_comm_workers(world, jp, Path(tmp))
        res: dict[int, dict[int, dict]] = {}
        for r in range(world):
            for line in (Path(tmp) / f"r{r}.jsonl").read_text().splitlines():
                d = json.loads(line)
                res.setdefault(d["sample_id"], {})[r] = d
    for job in jobs:
        per = res[job["sample_id"]]
        yield (job["sample_id"], job["dim_sums"], job["sleeps_ms"],
               [per[r]["fwd_ms"] for r in range(world)], [per[r]["bwd_ms"] for r in range(world)])


def _run_comm_workers(world: int, jobs: Path, outdir: Path, timeout_s: float = 600.0) -> None:
    """Run the ``world`` workers on ``jobs`` (each writes ``outdir/r{rank}.jsonl``); after
    ``timeout_s`` seconds those still running are ended. RuntimeError with the first failed
    rank's last stderr line if any rank did not exit with 0."""
    rdzv = rendezvous()
    ranks = PythonRanks([(Path(__file__).with_name("collect_worker.py"), r, world, rdzv,
                          jobs, outdir / f"r{r}.jsonl") for r in range(world)])
    try:
        wait(ranks.procs, timeout_s)
        end_processes(ranks.procs)
        bad = failed(ranks.procs)
        if bad:
            raise RuntimeError(f"communication workers failed: {ranks.tails()[min(bad)] or '?'}")
    finally:
        ranks.close()
        release(rdzv)
