"""Turn a topology mapping (see ``topologies/README.md``) into a :class:`Topology`.

Two forms share one loader:

* **generated**: ``node:`` (GPUs per host, NVSwitch or PCIe, NICs), ``fabric:`` (rail-optimised
  or not, a list of switching tiers with sizes and uplink oversubscription) and ``buildings:``
  (count, inter-building links, latency), built by :mod:`simulator.topology.generated`.
* **explicit**: ``devices:`` and ``links:`` lists, for odd boxes and hand-made test cases
  (:mod:`simulator.topology.explicit`).

Either may have a ``network:`` section saying how flows use equal-cost paths
(:class:`~simulator.topology.model.Routing`): ``routing: ideal`` (the default) or ``ecmp``,
with ``qps``, ``hash_seed`` and ``port_bandwidth``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from simulator.errors import SpecError
from simulator.hardware import GPUSpec, gpu_spec, gpu_spec_from_dict
from simulator.topology.explicit import build_explicit
from simulator.topology.generated import build_generated
from simulator.topology.model import LINK_KINDS, ROUTING_MODES, CommProfile, Routing, Topology
from simulator.topology.spec import parse_topology_ref, read_topology_mapping
from simulator.validation import Fields

__all__ = ["load_topology", "build_topology", "sized_topology_ref", "DEFAULT_COMM"]

#: Defaults when a topology file has no ``collectives:`` section. alpha: NCCL-like per-step
#: latency of the same order as the vTrain A100 tables' small-message floor; efficiency 1.0 means
#: "line rate" until a calibration says otherwise.
DEFAULT_COMM = CommProfile(
    alpha_s={"default": 5e-6},
    efficiency={k: 1.0 for k in LINK_KINDS},
    source="defaults (uncalibrated: line rate, 5 us per step)",
)

_TOP_KEYS = {"name", "description", "source", "gpu", "nodes", "node", "fabric", "buildings",
             "collectives", "devices", "links", "params", "notes", "network"}


def load_topology(ref: str | Path, *, overrides: Mapping[str, Any] | None = None,
                  gpus: int | None = None) -> Topology:
    """Load a built-in topology by name or a YAML file, with optional overrides.

    Parameters
    ----------
    ref:
        ``'selene-a100'``, ``'selene-a100:nodes=192'`` or a path to a YAML file.
    overrides:
        Dotted field → value, applied after those in ``ref``.
    gpus:
        Resize a generated topology to hold at least this many GPUs (sets ``nodes``).
    """
    doc, source = read_topology_mapping(ref, overrides)
    if gpus is not None:
        per = doc.get("node", {}).get("gpus") if isinstance(doc.get("node"), dict) else None
        if not isinstance(per, int) or per <= 0:
            raise SpecError("--gpus needs a generated topology with node.gpus", source=source,
                            field="node.gpus", fix="use --topology NAME:nodes=N instead")
        if gpus <= 0:
            raise SpecError(f"--gpus must be positive, got {gpus}", source="--gpus",
                            fix="pass a positive GPU count")
        doc["nodes"] = _nodes_for(doc, per, gpus)
    return build_topology(doc, source=source)


def _nodes_for(doc: Mapping[str, Any], per_node: int, gpus: int) -> int:
    """Nodes (per building) a generated topology needs to hold ``gpus`` GPUs."""
    b = doc.get("buildings", {}) or {}
    return math.ceil(gpus / per_node / max(1, int(b.get("count", 1) or 1)))


def sized_topology_ref(ref: str, gpus: int) -> str:
    """``ref`` grown to hold ``gpus`` GPUs: ``NAME:nodes=K`` appended when it names a generated
    topology with fewer GPUs and sets no ``nodes`` itself, else ``ref`` unchanged.

    For callers that keep the reference (a sharding plan records it), where
    ``load_topology(ref, gpus=...)`` would lose it.

    >>> sized_topology_ref("dgx-h100", 64), sized_topology_ref("dgx-h100", 8)
    ('dgx-h100:nodes=8', 'dgx-h100')
    """
    if Path(ref).exists() or "nodes" in parse_topology_ref(ref)[1]:
        return ref
    doc, _ = read_topology_mapping(ref)
    per = doc.get("node", {}).get("gpus") if isinstance(doc.get("node"), dict) else None
    if not isinstance(per, int) or per <= 0 or load_topology(ref).num_gpus >= gpus:
        return ref
    return f"{ref}{',' if ':' in ref else ':'}nodes={_nodes_for(doc, per, gpus)}"


def build_topology(doc: Mapping[str, Any], *, source: str = "<mapping>") -> Topology:
    """Validate a topology mapping and build the topology; errors name ``source`` and the field."""
    f = Fields(doc, source)
    f.check_keys(_TOP_KEYS)
    gpu = _gpu(f)
    comm = _comm(f.sub("collectives"))
    routing = _routing(f.sub("network"))
    if f.has("devices") or f.has("links"):
        if routing.port_Bps is not None:
            raise f.err("network.port_bandwidth", "a hand-written graph lists its links itself",
                        "remove port_bandwidth (explicit graphs hash over their own paths)")
        return replace(build_explicit(f, gpu=gpu, comm=comm), routing=routing)
    return build_generated(f, gpu=gpu, comm=comm, routing=routing)


def _routing(f: Fields) -> Routing:
    """The ``network:`` section: how flows use equal-cost paths (default: ideal spreading)."""
    f.check_keys({"routing", "qps", "hash_seed", "port_bandwidth", "source", "notes"})
    mode = f.str("routing", "ideal", choices=ROUTING_MODES)
    r = Routing(mode=mode, qps=f.int("qps", 1, minimum=1, maximum=1024),
                seed=f.int("hash_seed", 0, minimum=0),
                port_Bps=f.bandwidth("port_bandwidth", None))
    if mode == "ideal" and (r.qps != 1 or r.port_Bps is not None):
        raise f.err("routing", "qps and port_bandwidth only matter under routing: ecmp",
                    "set routing: ecmp or remove them")
    if r.port_Bps is not None and r.port_Bps <= 0:
        raise f.err("port_bandwidth", "must be positive", "write e.g. 400 Gb/s")
    return r


def _gpu(f: Fields) -> GPUSpec:
    value = f.data.get("gpu")
    if value is None:
        raise f.err("gpu", "missing field", "add e.g. 'gpu: h100-sxm' (see clusterplan gpus)")
    if isinstance(value, str):
        return gpu_spec(value, source=f.source, field=f.path("gpu"))
    if isinstance(value, Mapping):
        name = value.get("name")
        if not isinstance(name, str):
            raise f.err("gpu.name", "a custom GPU needs a name", "add 'name:' under gpu")
        return gpu_spec_from_dict(name, value, source=f.source)
    raise f.err("gpu", f"expected a GPU kind or a mapping, got {value!r}",
                "write e.g. 'gpu: a100-80gb'")


def _comm(f: Fields) -> CommProfile:
    if not f.data:
        return DEFAULT_COMM
    f.check_keys({"source", "alpha", "efficiency", "local_bandwidth", "notes"})
    alpha = dict(DEFAULT_COMM.alpha_s)
    a = f.sub("alpha")
    for key in a.data:
        alpha[str(key)] = a.time(str(key), required=True)
    eff = dict(DEFAULT_COMM.efficiency)
    e = f.sub("efficiency")
    for key in e.data:
        if key not in LINK_KINDS:
            raise e.err(str(key), f"unknown link kind {key!r}",
                        f"use one of: {', '.join(LINK_KINDS)}")
        eff[str(key)] = e.float(str(key), minimum=0.0, exclusive=True, maximum=1.0, required=True)
    local = {}
    lf = f.sub("local_bandwidth")
    for key in lf.data:
        local[str(key)] = lf.bandwidth(str(key), required=True)
    return CommProfile(alpha_s=alpha, efficiency=eff, source=f.str("source", "unstated"),
                       local_Bps=local)
