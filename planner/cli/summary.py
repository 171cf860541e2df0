"""Summaries of a topology for people and programs (``clusterplan topology show``)."""

from __future__ import annotations

from simulator.topology import Topology
from simulator.units import format_bandwidth

__all__ = ["topology_summary", "format_topology_summary"]


def topology_summary(topo: Topology) -> dict:
    """GPUs, nodes, GPU kind and per-tier capacity.

    ``tiers`` lists each switching tier bottom-up with its unit count, the down and up capacity
    of one unit (bytes/s per direction), its oversubscription, and the bisection bandwidth
    (bytes/s per direction) across that tier: half the units' total uplink capacity, i.e. what
    one half of the cluster can send to the other through that tier (for the top tier, half its
    down capacity).
    """
    tiers = []
    for t in topo.tiers:
        up = t.up_Bps_per_unit * t.units
        bis = (up if up > 0 else t.down_Bps_per_unit * t.units) / 2
        tiers.append({"name": t.name, "units": t.units,
                      "down_Bps_per_unit": t.down_Bps_per_unit, "up_Bps_per_unit": t.up_Bps_per_unit,
                      "oversubscription": None if t.up_Bps_per_unit == 0 else t.oversubscription,
                      "bisection_Bps": bis, "latency_s": t.latency_s})
    return {"name": topo.name, "source": topo.source, "description": topo.description.strip(),
            "gpu": topo.gpu.name, "gpus": topo.num_gpus, "nodes": topo.num_nodes,
            "gpus_per_node": topo.gpus_per_node, "devices": len(topo.devices),
            "links": len(topo.links), "params": dict(topo.params), "tiers": tiers,
            "collectives": {"alpha_s": dict(topo.comm.alpha_s),
                            "efficiency": dict(topo.comm.efficiency),
                            "source": topo.comm.source}}


def format_topology_summary(s: dict) -> str:
    lines = [f"{s['name']}: {s['gpus']} × {s['gpu']} in {s['nodes']} nodes "
             f"({s['gpus_per_node']} per node), {s['devices']} devices, {s['links']} links",
             f"  source: {s['source']}"]
    if s["tiers"]:
        lines.append(f"  {'tier':<12}{'units':>7}{'down/unit':>14}{'up/unit':>14}"
                     f"{'oversub':>9}{'bisection':>14}")
        for t in s["tiers"]:
            over = "-" if t["oversubscription"] is None else f"{t['oversubscription']:.2f}"
            up = "-" if not t["up_Bps_per_unit"] else format_bandwidth(t["up_Bps_per_unit"])
            lines.append(f"  {t['name']:<12}{t['units']:>7}{format_bandwidth(t['down_Bps_per_unit']):>14}"
                         f"{up:>14}{over:>9}{format_bandwidth(t['bisection_Bps']):>14}")
    p = s.get("params", {})
    if p.get("wan_link_Bps"):
        loss = p.get("wan_loss_rate", 0.0)
        lines.append(f"  between buildings: links of {format_bandwidth(p['wan_link_Bps'])}"
                     + (f", loss {loss:g} → {format_bandwidth(p['wan_goodput_Bps'])} goodput each"
                        if loss else ""))
    c = s["collectives"]
    alpha = ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in sorted(c["alpha_s"].items()))
    eff = ", ".join(f"{k} {v:.2f}" for k, v in sorted(c["efficiency"].items()))
    lines += [f"  collectives: alpha {alpha}", f"               efficiency {eff}",
              f"               source: {c['source']}"]
    return "\n".join(lines)
