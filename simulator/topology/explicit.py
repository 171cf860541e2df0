"""Hand-written topologies: ``devices:`` and ``links:`` lists.

Each link is full duplex unless ``duplex: half`` (then only ``a → b`` exists); ``bandwidth`` is per
direction. GPUs are numbered in the order they are listed. Such graphs are routed by graph search
(:mod:`simulator.network.route`), with equal-cost multipath split evenly.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from simulator.hardware import GPUSpec
from simulator.topology.model import DEVICE_KINDS, LINK_KINDS, CommProfile, LinkTable, Topology
from simulator.validation import Fields

__all__ = ["build_explicit"]


def build_explicit(f: Fields, *, gpu: GPUSpec, comm: CommProfile) -> Topology:
    """Validate ``devices``/``links`` and build a :class:`Topology` with no hierarchy."""
    devs = f.data.get("devices")
    if not isinstance(devs, list) or not devs:
        raise f.err("devices", "expected a non-empty list of devices",
                    "write '- {id: gpu0, kind: gpu}' items")
    devices: dict[str, dict] = {}
    gpus: list[str] = []
    for i, d in enumerate(devs):
        if not isinstance(d, Mapping):
            raise f.err(f"devices[{i}]", f"expected a mapping, got {d!r}", "write {id: gpu0, kind: gpu}")
        df = Fields(d, f.source, f.path(f"devices[{i}]"))
        df.check_keys({"id", "kind", "node", "transit"})
        did = df.str("id", required=True)
        if did in devices:
            raise df.err("id", f"duplicate device id {did!r}", "give every device a unique id")
        kind = df.str("kind", required=True, choices=DEVICE_KINDS)
        node = df.int("node", None, minimum=0)
        transit = df.bool("transit", kind not in ("gpu", "cpu"))
        devices[did] = {"kind": kind, "transit": transit}
        if node is not None:
            devices[did]["node"] = node
        if kind in ("gpu", "cpu"):
            devices[did]["rank"] = len(gpus)
            devices[did].setdefault("node", len(gpus))
            gpus.append(did)
    if not gpus:
        raise f.err("devices", "no device of kind gpu or cpu", "add at least one GPU")
    lks = f.data.get("links")
    if not isinstance(lks, list) or not lks:
        raise f.err("links", "expected a non-empty list of links",
                    "write '- {a: gpu0, b: sw, bandwidth: 300 GB/s, latency: 1 us}' items")
    src, dst, bw, lat, kind, cnt, tier = [], [], [], [], [], [], []
    seen: set[tuple[str, str]] = set()
    for i, l in enumerate(lks):
        if not isinstance(l, Mapping):
            raise f.err(f"links[{i}]", f"expected a mapping, got {l!r}", "write {a: x, b: y, bandwidth: ...}")
        lf = Fields(l, f.source, f.path(f"links[{i}]"))
        lf.check_keys({"a", "b", "bandwidth", "latency", "kind", "duplex", "count"})
        a, b = lf.str("a", required=True), lf.str("b", required=True)
        for key, end in (("a", a), ("b", b)):
            if end not in devices:
                raise lf.err(key, f"unknown device {end!r}", "list it under devices first")
        if a == b:
            raise lf.err("b", f"link from {a!r} to itself", "connect two different devices")
        b_Bps = lf.bandwidth("bandwidth", required=True)
        l_s = lf.time("latency", 0.0)
        k = lf.str("kind", "fabric", choices=LINK_KINDS)
        duplex = lf.str("duplex", "full", choices=("full", "half"))
        c = lf.int("count", 1, minimum=1)
        for s, d in ((a, b), (b, a)) if duplex == "full" else ((a, b),):
            if (s, d) in seen:
                raise lf.err("b", f"second link {s} → {d}",
                             "merge parallel links into one with count and the summed bandwidth")
            seen.add((s, d))
            src.append(s), dst.append(d), bw.append(b_Bps), lat.append(l_s), kind.append(k)
            cnt.append(c), tier.append(k)
    _check_routes(f, devices, gpus, src, dst)
    table = LinkTable(tuple(src), tuple(dst), np.asarray(bw, float), np.asarray(lat, float),
                      tuple(kind), np.asarray(cnt, np.int64), tuple(tier))
    return Topology(name=f.str("name", "unnamed"), source=f.source, gpu=gpu, devices=devices,
                    gpus=tuple(gpus), links=table, comm=comm, tiers=(), hierarchy=None,
                    params={}, description=f.str("description", "") or "")


def _check_routes(f: Fields, devices: dict, gpus: list[str], src: list[str], dst: list[str]) -> None:
    """Every GPU must reach every other one through transit devices (both directions)."""
    out: dict[str, list[str]] = {d: [] for d in devices}
    inn: dict[str, list[str]] = {d: [] for d in devices}
    for s, d in zip(src, dst):
        out[s].append(d)
        inn[d].append(s)
    for adj, word in ((out, "to"), (inn, "from")):
        seen = {gpus[0]}
        stack = [gpus[0]]
        while stack:
            v = stack.pop()
            for w in adj[v]:
                if w not in seen:
                    seen.add(w)
                    if devices[w]["transit"]:
                        stack.append(w)
        for i, g in enumerate(gpus[1:], start=1):
            if g not in seen:
                idx = next(k for k, d in enumerate(f.data["devices"]) if d.get("id") == g)
                raise f.err(f"devices[{idx}]", f"GPU {g!r} has no route {word} GPU {gpus[0]!r}",
                            "add links joining it to the others through a switch")
