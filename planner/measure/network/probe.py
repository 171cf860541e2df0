"""Measure pairwise latency and bandwidth with real torch.distributed point-to-point messages.

Method (written into the matrix under ``measured``):

1. Pairs: a round-robin tournament (circle method) covers all n(n − 1)/2 pairs in n − 1 rounds
   (n rounds when n is odd, one rank resting); pairs of one round run at the same time, rounds
   are separated by barriers.
2. Latency: the lower rank of a pair sends ``small_bytes`` and the other sends them back;
   one-way latency = median round trip / 2 over ``repeats`` timed rounds (after warm-up ones).
3. Bandwidth, each direction: the sender sends ``large_bytes`` and waits for a ``small_bytes``
   acknowledgement; bandwidth = large / (median elapsed − 2 · latency), i.e. the ack's and the
   first byte's latency taken out (but at least 10% of the elapsed time kept, against noise).

``emulate``: a cost matrix whose latency and bandwidth are imposed on top of the real network
(:class:`EmulatedLinks`: the sender sleeps ``bytes / β(i, j)``, the receiver holds the message
until ``α(i, j)`` after it was sent), so a single machine can stand for a heterogeneous cloud
(used by the benchmark to check reordering for real).
"""

from __future__ import annotations

import socket
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from simulator.costmatrix import CostMatrix

from planner.measure.network.spawn import run_distributed

__all__ = ["ProbeSettings", "run_probe", "tournament_rounds", "EmulatedLinks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSettings:
    backend: str = "gloo"
    nproc: int = 2
    repeats: int = 9
    warmup: int = 2
    small_bytes: int = 8
    large_bytes: int = 16 * 2**20
    timeout_s: float = 120.0


def tournament_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Circle-method schedule: every pair of ``range(n)`` exactly once, disjoint within a round."""
    m = n + (n % 2)
    ring = list(range(m))
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = ring[k], ring[m - 1 - k]
            if a < n and b < n:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        ring = [ring[0]] + [ring[-1]] + ring[1:-1]
    return rounds


class EmulatedLinks:
    """An emulated network on top of the real one (or nothing, when built without matrices).

    Bandwidth occupies the sender: it sleeps ``bytes / β(i, j)`` before handing the message over.
    Latency is in flight: the sender stamps the message with the (machine-wide monotonic) send
    time and the receiver waits until ``stamp + α(i, j)`` before using it, so a sender is free to
    go on while its message travels, as on a real link.
    """

    def __init__(self, latency_s: np.ndarray | None = None, bandwidth_Bps: np.ndarray | None = None):
        self.lat = latency_s
        self.bw = bandwidth_Bps

    @property
    def active(self) -> bool:
        return self.lat is not None

    def serialise(self, src: int, dst: int, nbytes: int) -> None:
        if self.active:
            time.sleep(nbytes / float(self.bw[src, dst]))

    def arrive(self, src: int, dst: int, sent_at: float) -> None:
        if self.active:
            left = sent_at + float(self.lat[src, dst]) - time.monotonic()
            if left > 0:
                time.sleep(left)

    def send(self, dist, torch, t, src: int, dst: int) -> None:
        """Blocking send of ``t`` over the emulated link (a stamp follows when emulating)."""
        self.serialise(src, dst, t.numel() * t.element_size())
        dist.send(t, dst)
        if self.active:
            dist.send(torch.tensor([time.monotonic()], dtype=torch.float64), dst)

    def recv(self, dist, torch, t, src: int, dst: int) -> None:
        dist.recv(t, src)
        if self.active:
            stamp = torch.zeros(1, dtype=torch.float64)
            dist.recv(stamp, src)
            self.arrive(src, dst, float(stamp))


def _probe_worker(rank: int, world: int, settings: dict, emu: tuple | None) -> dict | None:
    import torch
    import torch.distributed as dist
    dev = torch.device("cuda", torch.cuda.current_device()) if settings["backend"] == "nccl" \
        else torch.device("cpu")
    links = EmulatedLinks(*emu) if emu else EmulatedLinks()
    small = torch.zeros(max(1, settings["small_bytes"] // 4), dtype=torch.float32, device=dev)
    large = torch.zeros(max(1, settings["large_bytes"] // 4), dtype=torch.float32, device=dev)
    sb, lb = small.numel() * 4, large.numel() * 4
    reps, warm = settings["repeats"], settings["warmup"]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def send(t, peer, nb):
        links.send(dist, torch, t, rank, peer)

    def recv(t, peer):
        links.recv(dist, torch, t, peer, rank)

    lat: dict[tuple[int, int], float] = {}
    bw: dict[tuple[int, int], float] = {}
    for pairs in tournament_rounds(world):
        dist.barrier()
        mine = next(((a, b) for a, b in pairs if rank in (a, b)), None)
        if mine is None:
            continue
        a, b = mine
        peer = b if rank == a else a
        # latency: ping-pong started by the lower rank
        rtts = []
        for k in range(warm + reps):
            sync()
            t0 = time.perf_counter()
            if rank == a:
                send(small, peer, sb)
                recv(small, peer)
            else:
                recv(small, peer)
                send(small, peer, sb)
            sync()
            if k >= warm:
                rtts.append(time.perf_counter() - t0)
        one_way = statistics.median(rtts) / 2
        if rank == a:
            lat[(a, b)] = lat[(b, a)] = one_way
        # bandwidth: a → b, then b → a; the sender times send + ack
        for s, d in ((a, b), (b, a)):
            times = []
            for k in range(warm + reps):
                sync()
                t0 = time.perf_counter()
                if rank == s:
                    send(large, d, lb)
                    recv(small, d)
                else:
                    recv(large, s)
                    send(small, s, sb)
                sync()
                if k >= warm and rank == s:
                    times.append(time.perf_counter() - t0)
            if rank == s:
                med = statistics.median(times)
                # noise can make the difference tiny or negative: keep at least 10% of the time
                bw[(s, d)] = lb / max(med - 2 * one_way, 0.1 * med)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"host": socket.gethostname(), "lat": lat, "bw": bw})
    if rank != 0:
        return None
    return {"parts": gathered}


def run_probe(settings: ProbeSettings, *, emulate: CostMatrix | None = None) -> CostMatrix:
    """Measure all pairs among ``settings.nproc`` spawned ranks; return the cost matrix."""
    n = settings.nproc
    emu = (emulate.latency_s, emulate.bandwidth_Bps) if emulate is not None else None
    t0 = time.perf_counter()
    res = run_distributed(_probe_worker, n, args=(asdict(settings), emu),
                          backend=settings.backend, timeout_s=settings.timeout_s)
    lat = np.zeros((n, n))
    bw = np.zeros((n, n))
    hosts = []
    for part in res["parts"]:
        hosts.append(part["host"])
        for (i, j), v in part["lat"].items():
            lat[i, j] = v
        for (i, j), v in part["bw"].items():
            bw[i, j] = v
    measured = {"method": "clusterplan probe: torch.distributed send/recv, round-robin "
                          "tournament; latency = median ping-pong / 2, bandwidth = large / "
                          "(median send+ack − 2 · latency)",
                "backend": settings.backend, "nproc": n, "repeats": settings.repeats,
                "warmup": settings.warmup, "small_bytes": settings.small_bytes,
                "large_bytes": settings.large_bytes, "wall_s": time.perf_counter() - t0,
                "emulated": emulate is not None,
                "torch": __import__("torch").__version__}
    return CostMatrix(lat, bw, tuple(hosts), measured)
