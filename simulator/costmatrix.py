"""Pairwise network costs between ranks: latency and bandwidth matrices, with optional sharing.

A :class:`CostMatrix` is what ``clusterplan probe`` measures and what a cloud placement
(:mod:`simulator.topology.cloud`) generates: for every ordered pair of ranks ``(i, j)`` the
one-way latency ``latency_s[i, j]`` (seconds) and the bandwidth ``bandwidth_Bps[i, j]`` (bytes/s)
a single message stream gets when it runs alone. Diagonals are meaningless and stored as 0.

Pairwise numbers miss contention: two streams that leave the same rack share its uplink. When the
placement is known (generated clouds), :class:`Sharing` adds it as a tree of groups: at each level
(VM, host, rack, zone) every rank belongs to one group, and a stream from ``i`` to ``j`` uses the
up-link of ``i``'s group and the down-link of ``j``'s group at every level where the two groups
differ. Cost models divide a link's capacity evenly among the streams using it.

File format (JSON, units in the keys)::

    {"format": "clusterplan.cost-matrix", "schema_version": 1, "ranks": 2,
     "hostnames": ["a", "b"], "latency_s": [[0, 3e-5], [3e-5, 0]],
     "bandwidth_Bps": [[0, 1.2e9], [1.1e9, 0]], "measured": {...},
     "sharing": {"levels": [{"name": "host", "group": [0, 1], "capacity_Bps": [3e9, 3e9]}]}}

``measured`` says how the numbers were obtained (probe settings, or the generator and its seed).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import read_json_file

__all__ = ["FORMAT", "CostMatrix", "Sharing", "SharingLevel", "load_cost_matrix",
           "cost_matrix_from_dict", "MAX_RANKS"]

FORMAT = "clusterplan.cost-matrix"
SCHEMA_VERSION = 1
#: Largest matrix accepted from a file (n² entries per matrix).
MAX_RANKS = 16384


@dataclass(frozen=True, slots=True)
class SharingLevel:
    """One level of shared links: ``group[i]`` is rank i's group, ``capacity_Bps[g]`` the
    capacity of group g's link to the level above, per direction, bytes/s."""

    name: str
    group: np.ndarray
    capacity_Bps: np.ndarray


@dataclass(frozen=True, slots=True)
class Sharing:
    """Levels of shared links, bottom-up (e.g. vm, host, rack, zone)."""

    levels: tuple[SharingLevel, ...]

    def permuted(self, order: np.ndarray) -> "Sharing":
        """The same sharing seen through rank order ``order`` (new rank k = old rank order[k])."""
        return Sharing(tuple(SharingLevel(l.name, l.group[order], l.capacity_Bps)
                             for l in self.levels))


@dataclass(frozen=True)
class CostMatrix:
    """Pairwise one-way latency (s) and bandwidth (bytes/s) between ``n`` ranks.

    Attributes
    ----------
    latency_s, bandwidth_Bps:
        n×n arrays; entry ``[i, j]`` is the cost of sending from rank i to rank j.
    hostnames:
        Host of each rank (ranks on one host share its network link).
    measured:
        How the numbers were obtained (free-form mapping, written to the file).
    sharing:
        Shared links known from the placement, or ``None`` (pairwise costs only).
    """

    latency_s: np.ndarray
    bandwidth_Bps: np.ndarray
    hostnames: tuple[str, ...]
    measured: Mapping[str, Any] = field(default_factory=dict)
    sharing: Sharing | None = None

    @property
    def n(self) -> int:
        return int(self.latency_s.shape[0])

    def permuted(self, order) -> "CostMatrix":
        """Costs with ranks renumbered: new rank k is old rank ``order[k]``."""
        o = np.asarray(order, dtype=np.int64)
        return CostMatrix(self.latency_s[np.ix_(o, o)], self.bandwidth_Bps[np.ix_(o, o)],
                          tuple(self.hostnames[i] for i in o), dict(self.measured),
                          self.sharing.permuted(o) if self.sharing else None)

    def to_dict(self) -> dict:
        lat = self.latency_s.copy()
        bw = self.bandwidth_Bps.copy()
        np.fill_diagonal(lat, 0.0)
        np.fill_diagonal(bw, 0.0)
        d: dict[str, Any] = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "ranks": self.n,
                             "hostnames": list(self.hostnames), "latency_s": lat.tolist(),
                             "bandwidth_Bps": bw.tolist(), "measured": dict(self.measured)}
        if self.sharing is not None:
            d["sharing"] = {"levels": [{"name": l.name, "group": l.group.tolist(),
                                        "capacity_Bps": l.capacity_Bps.tolist()}
                                       for l in self.sharing.levels]}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"


def load_cost_matrix(path: str | Path) -> CostMatrix:
    """Read and validate a cost-matrix JSON file (errors name the file and the field)."""
    p = Path(path)
    src = str(p)
    fix = "pass a matrix written by `clusterplan probe --out FILE`"
    doc = read_json_file(p, field="matrix", missing_fix=fix, json_fix=fix)
    return cost_matrix_from_dict(doc, source=src)


def _err(msg: str, fld: str, fix: str, source: str) -> SpecError:
    return SpecError(msg, source=source, field=fld, fix=fix)


def _square(doc: Mapping, key: str, n: int, source: str, *, positive: bool) -> np.ndarray:
    rows = doc.get(key)
    fix = f"write {key} as {n} rows of {n} numbers"
    if not isinstance(rows, list) or len(rows) != n:
        raise _err(f"expected {n} rows", key, fix, source)
    out = np.zeros((n, n))
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != n:
            raise _err(f"expected {n} numbers", f"{key}[{i}]", fix, source)
        for j, v in enumerate(row):
            if i == j:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0 or (positive and v <= 0):
                raise _err(f"{v!r} is not a {'positive' if positive else 'non-negative'} "
                           "finite number", f"{key}[{i}][{j}]", fix, source)
            out[i, j] = float(v)
    return out


def cost_matrix_from_dict(doc: Any, *, source: str = "<matrix>") -> CostMatrix:
    """Validate a parsed cost-matrix document and build the :class:`CostMatrix`."""
    fix = "pass a matrix written by `clusterplan probe --out FILE`"
    if not isinstance(doc, Mapping):
        raise _err(f"expected a JSON object, got {type(doc).__name__}", "(top level)", fix, source)
    if doc.get("format") != FORMAT:
        raise _err(f"format is {doc.get('format')!r}, not {FORMAT!r}", "format", fix, source)
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise _err(f"schema_version {doc.get('schema_version')!r} is not {SCHEMA_VERSION}",
                   "schema_version", "re-measure with this version of clusterplan", source)
    n = doc.get("ranks")
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_RANKS:
        raise _err(f"{n!r} is not a rank count in 2..{MAX_RANKS}", "ranks",
                   "measure at least 2 ranks", source)
    hosts = doc.get("hostnames")
    if not isinstance(hosts, list) or len(hosts) != n or not all(isinstance(h, str) for h in hosts):
        raise _err(f"expected {n} host names", "hostnames", "list one host name per rank", source)
    lat = _square(doc, "latency_s", n, source, positive=False)
    bw = _square(doc, "bandwidth_Bps", n, source, positive=True)
    measured = doc.get("measured", {})
    if not isinstance(measured, Mapping):
        raise _err("expected an object", "measured", "describe how the matrix was measured", source)
    sharing = None
    if doc.get("sharing") is not None:
        sharing = _sharing(doc["sharing"], n, source)
    return CostMatrix(lat, bw, tuple(hosts), dict(measured), sharing)


def _sharing(doc: Any, n: int, source: str) -> Sharing:
    fix = "give each level a name, one group per rank and one capacity per group"
    if not isinstance(doc, Mapping) or not isinstance(doc.get("levels"), list):
        raise _err("expected {levels: [...]}", "sharing", fix, source)
    levels = []
    for k, lv in enumerate(doc["levels"]):
        f = f"sharing.levels[{k}]"
        if not isinstance(lv, Mapping):
            raise _err("expected an object", f, fix, source)
        g, cap = lv.get("group"), lv.get("capacity_Bps")
        if not isinstance(g, list) or len(g) != n or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in g):
            raise _err(f"expected {n} non-negative group ids", f"{f}.group", fix, source)
        if not isinstance(cap, list) or len(cap) <= max(g) or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
                and c > 0 for c in cap):
            raise _err(f"expected {max(g) + 1} positive capacities", f"{f}.capacity_Bps", fix,
                       source)
        levels.append(SharingLevel(str(lv.get("name", f"level{k}")), np.asarray(g, np.int64),
                                   np.asarray(cap, float)))
    return Sharing(tuple(levels))
