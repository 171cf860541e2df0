"""Plan documents for the export tests, built the way ``plan_document`` builds them."""

from __future__ import annotations

from planner.model.llm.layout import Layout


def make_plan(tp=1, cp=1, pp=1, dp=1, vpp=1, fsdp="none", mbs=1, gbs=None, gpus_per_host=8,
              order="tp-cp-dp-pp", model="llama3-70b", place=None, **extra) -> dict:
    lay = Layout(tp=tp, cp=cp, dp=dp, pp=pp, order=order)
    world = lay.world
    gbs = gbs or mbs * dp * 8
    ranks = []
    for r in range(world):
        host, gpu = place(r) if place else divmod(r, gpus_per_host)
        ranks.append({"rank": r, **lay.coords(r), "building": 0, "host": host, "gpu": gpu,
                      "device": f"n{host}/gpu{gpu}"})
    return {"format_version": 1, "kind": "llm-plan", "order": order, "model": model,
            "topology": "test", "gpus": world,
            "parallel": {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "vpp": vpp, "fsdp": fsdp},
            "micro_batch_size": mbs, "global_batch_size": gbs,
            "microbatches": gbs // (mbs * dp), **extra, "ranks": ranks}

