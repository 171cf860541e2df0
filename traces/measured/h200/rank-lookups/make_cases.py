"""Write ``cases.json`` for :mod:`planner.measure.tables.gpu_rank_lookups`: the ranks of two
8-GPU plans, their table-wise shards, each as ``[rows, pooling]`` per table at the
global batch. Run from the repository root::

    python traces/measured/h200/rank-lookups/make_cases.py

- ``criteo-dlrm``, ``--planner dle_pytorch`` (DeepLearningExamples' PyTorch placement), 8 GPUs;
- ``mlperf-dcnv2``, ``--planner greedy``, 8 GPUs: each rank's table-wise shards only (its row- or
  column-wise shards left out, ``dropped`` says how many).
"""

import json
from pathlib import Path

from planner.model.tables.spec_file import load_model_spec
from planner.sharding import ShardingTask, get_planner

TOPOLOGY = "dgx-h100:gpu=h200,nodes=1"


def ranks(model: str, planner: str) -> list[dict]:
    m = load_model_spec(model)
    plan = get_planner(planner).plan(ShardingTask(model=m, topology=TOPOLOGY), 8, seed=0)
    per: dict[int, list] = {}
    dropped: dict[int, int] = {}
    for s in plan.shardings:
        for sh in s.shards:
            if s.sharding_type.value != "table_wise":
                dropped[sh.rank] = dropped.get(sh.rank, 0) + 1
                continue
            t = m.tables[s.table]
            per.setdefault(sh.rank, []).append([t.num_embeddings, round(t.pooling_factor)])
    return [{"case": f"{model}-{planner}-8", "rank": r, "batch": m.batch_size,
             "dim": m.tables[0].embedding_dim, "tables": sorted(per[r], reverse=True),
             "dropped": dropped.get(r, 0)} for r in sorted(per)]


if __name__ == "__main__":
    cases = ranks("criteo-dlrm", "dle_pytorch") + ranks("mlperf-dcnv2", "greedy")
    out = Path(__file__).with_name("cases.json")
    out.write_text(json.dumps(cases, indent=1) + "\n")
    print(f"wrote {out}: {len(cases)} ranks")
