"""Export to TorchRec, without running it: the versioned JSON, exact tiling, refusals, the CLI.

DistributedModelParallel runs of the exported plans are in ``test_torchrec_dmp.py``; the
tables and plans both use are ``torchrec_cases.py``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from isolation import NO_CLUSTERPLAN
from torchrec_cases import EMPTY_SHARD_TABLES, KINDS, TABLES, TOPOLOGY, sharding_plan

from simulator.errors import SpecError

from planner.export.torchrec import export_torchrec_plan
from planner.export.torchrec_check import check_torchrec_plan
from planner.export.torchrec_format import (FORMAT, SCHEMA_VERSION, context_sha256,
                                             torchrec_plan_json)

REPO = Path(__file__).resolve().parents[2]


def _coverage(doc: dict) -> dict[str, np.ndarray]:
    """How many shards cover each element of each table (data-parallel: one replica)."""
    out = {}
    for name, (rows, dim) in doc["context"]["tables"].items():
        out[name] = np.zeros((rows, dim), dtype=int)
    for entries in doc["plan"].values():
        for name, p in entries.items():
            if p["sharding_type"] == "data_parallel":
                out[name] += 1
                continue
            for s in p["shards"]:
                (r0, c0), (nr, nc) = s["shard_offsets"], s["shard_sizes"]
                out[name][r0:r0 + nr, c0:c0 + nc] += 1
    return out


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_export_tiles_every_table_exactly_and_round_trips(kind, world):
    plan = sharding_plan(kind, world)
    doc = export_torchrec_plan(plan.to_dict(), device="cpu")
    assert doc["format"] == FORMAT and doc["schema_version"] == SCHEMA_VERSION
    assert doc["world_size"] == world and doc["local_world_size"] == 2
    assert doc["context"]["tables"] == {n: [r, d] for n, r, d in TABLES}
    assert doc["context"]["model_sha256"] == plan.task["sha256"]
    assert doc["context"]["sha256"] == context_sha256(doc["context"]["tables"], world, 2,
                                                      8 * world, TOPOLOGY[world])
    assert list(doc["plan"]) == [""]
    for name, cover in _coverage(doc).items():
        assert (cover == 1).all(), f"{kind}: table {name} not tiled exactly once"
    for ts in plan.shardings:
        p = doc["plan"][""][ts.name]
        assert p["sharding_type"] == ts.sharding_type.value
        assert p["ranks"] == (list(range(world)) if kind == "data_parallel" else list(ts.ranks))
        if p["sharding_type"] == "data_parallel":
            assert p["compute_kernel"] == "dense" and "shards" not in p
        else:
            assert p["compute_kernel"] == "fused"
            assert [s["placement"] for s in p["shards"]] == [f"rank:{r}/cpu" for r in ts.ranks]
    text = torchrec_plan_json(doc)
    assert json.loads(text) == doc and text.endswith("}\n")
    assert check_torchrec_plan(json.loads(text)) == doc
    # the same bytes from a Plan object and from its JSON file
    assert torchrec_plan_json(export_torchrec_plan(plan, device="cpu")) == text


def test_layouts_carry_torchrec_rules():
    doc = export_torchrec_plan(sharding_plan("mixed", 4), device="cpu")
    p = doc["plan"][""]
    assert p["t0"]["ranks"] == [3]
    # uneven column widths (TorchRec would cut dim 32 into equal blocks)
    assert [s["shard_sizes"][1] for s in p["t1"]["shards"]] == [12, 8, 8, 4]
    assert [s["shard_offsets"][1] for s in p["t1"]["shards"]] == [0, 12, 20, 28]
    # 7 rows on 4 ranks: TorchRec's even blocks 2, 2, 2, 1
    assert [s["shard_sizes"][0] for s in p["t2"]["shards"]] == [2, 2, 2, 1]
    assert p["t3"]["sharding_type"] == "table_row_wise" and p["t3"]["ranks"] == [2, 3]
    assert [s["shard_sizes"][0] for s in p["t3"]["shards"]] == [12, 11]
    assert p["t4"] == {"sharding_type": "data_parallel", "compute_kernel": "dense",
                       "ranks": [0, 1, 2, 3]}


def test_gpu_placements_and_module_path():
    plan = sharding_plan("row_wise", 4)               # made for 2 DGX hosts of 2 GPUs
    doc = export_torchrec_plan(plan, module_fqn="sparse.ebc")
    assert doc["device"] == "cuda" and list(doc["plan"]) == ["sparse.ebc"]
    shards = doc["plan"]["sparse.ebc"]["t0"]["shards"]
    assert [s["placement"] for s in shards] == ["rank:0/cuda:0", "rank:1/cuda:1",
                                                "rank:2/cuda:0", "rank:3/cuda:1"]
    with pytest.raises(SpecError, match="--module-fqn"):
        export_torchrec_plan(plan, module_fqn="sparse..ebc")
    with pytest.raises(SpecError, match="--device"):
        export_torchrec_plan(plan, device="tpu")


def test_planner_plan_exports(make_task):
    from planner.sharding.planners import get_planner
    task = make_task(12, seed=3, devices=4)
    plan = get_planner("local_search").plan(task, 4, seed=0)
    doc = export_torchrec_plan(plan.to_dict())
    assert set(doc["plan"][""]) == {t.name for t in task.model.tables}
    assert all((c == 1).all() for c in _coverage(doc).values())


# --- refusals ---------------------------------------------------------------------------------

def _doc(kind="mixed", world=4):
    return export_torchrec_plan(sharding_plan(kind, world), device="cpu")


def _rehash(doc):
    c = doc["context"]
    c["sha256"] = context_sha256(c["tables"], doc["world_size"], doc["local_world_size"],
                                 c["batch_size"], c["topology"])
    return doc


def _edit(fn, rehash=False):
    doc = copy.deepcopy(_doc())
    fn(doc)
    return _rehash(doc) if rehash else doc


@pytest.mark.parametrize("edit, field, words", [
    (lambda d: d.update(format="clusterplan.sharding-plan"), "format", "not"),
    (lambda d: d.update(schema_version=2), "schema_version", "not supported"),
    (lambda d: d.update(world_size=3), "local_world_size", "does not divide"),
    (lambda d: d["context"]["tables"].update(t0=[41, 16]), "context.sha256", "edited by hand"),
    (lambda d: d["plan"][""].pop("t3"), "plan", "not planned"),
    (lambda d: d["plan"][""]["t0"].update(sharding_type="grid_shard"),
     'plan."".t0.sharding_type', "not supported"),
    (lambda d: d["plan"][""]["t4"].update(compute_kernel="fused"),
     'plan."".t4.compute_kernel', "dense"),
    (lambda d: d["plan"][""]["t0"]["shards"][0].update(placement="rank:1/cpu"),
     'plan."".t0.shards[0].placement', "ranks[0] is 3"),
    (lambda d: d["plan"][""]["t1"]["shards"][1].update(shard_offsets=[0, 8]),
     'plan."".t1.shards', "overlap"),
    (lambda d: d["plan"][""]["t1"]["shards"][2].update(shard_sizes=[37, 4]),
     'plan."".t1.shards', "cover 28 of the table's 32 columns"),
    (lambda d: d["plan"][""]["t1"]["shards"][3].update(shard_sizes=[37, 0]),
     'plan."".t1.shards', "must not be empty"),
    (lambda d: d["plan"][""]["t0"]["shards"][0].update(shard_sizes=[39, 16]),
     'plan."".t0.shards', "whole table [40, 16]"),
    (lambda d: d["plan"][""]["t3"]["shards"][1].update(shard_offsets=[11, 0]),
     'plan."".t3.shards', "overlap"),
    (lambda d: d["plan"][""]["t1"]["shards"][3].update(shard_sizes=[37, 8]),
     'plan."".t1.shards[3].shard_sizes', "outside"),
    (lambda d: d["plan"][""]["t2"]["shards"][0].update(shard_sizes=[1, 8]) or
     d["plan"][""]["t2"]["shards"][1].update(shard_offsets=[1, 0], shard_sizes=[3, 8]),
     'plan."".t2.shards', "even blocks"),
    (lambda d: d["plan"][""]["t3"].update(ranks=[1, 2]) or [
        s.update(placement=f"rank:{r}/cpu") for s, r in zip(d["plan"][""]["t3"]["shards"],
                                                            [1, 2])],
     'plan."".t3.shards', "expected [0, 1]"),
    (lambda d: d["plan"][""]["t0"].update(ranks=[3, 3]), 'plan."".t0.ranks', "one rank per"),
])
def test_check_refuses_a_broken_file(edit, field, words):
    doc = _edit(edit, rehash=field != "context.sha256")
    with pytest.raises(SpecError) as err:
        check_torchrec_plan(doc, source="x.json")
    assert err.value.field == field and words in err.value.message
    assert str(err.value).startswith(f"x.json: {field}: ") and "(fix: " in str(err.value)


def test_export_refuses_what_torchrec_would_run_wrong():
    doc = sharding_plan("row_wise", 2).to_dict()
    e = doc["shards"][0]
    e["shards"][0]["sizes"][0] = 30                    # 30 + 20 rows instead of 20 + 20
    e["shards"][1]["offsets"][0] = 30
    with pytest.raises(SpecError, match="even blocks") as err:
        export_torchrec_plan(doc, source="p.json")
    assert err.value.field == "shards[0]" and err.value.source == "p.json"
    with pytest.raises(SpecError, match="LLM plan"):
        export_torchrec_plan({"kind": "llm-plan", "format_version": 1})
    bad = sharding_plan("table_wise", 2).to_dict()
    bad["format_version"] = 7
    with pytest.raises(SpecError, match="format_version"):
        export_torchrec_plan(bad)
    bad = sharding_plan("table_wise", 2).to_dict()
    bad["shards"][1]["shards"][0]["rank"] = -1
    with pytest.raises(SpecError) as err:
        export_torchrec_plan(bad)
    assert err.value.field == "shards[1].shards[0].rank"


def test_loader_refuses_another_world_tables_or_host_size():
    from planner.export.torchrec_load import load_sharding_plan
    doc = _doc()
    shapes = {n: (r, d) for n, r, d in TABLES}
    with pytest.raises(SpecError, match="for 4 ranks, the trainer has 2") as err:
        load_sharding_plan(doc, world_size=2, tables=shapes)
    assert err.value.field == "world_size" and "--devices 2" in err.value.fix
    with pytest.raises(SpecError, match=r"lacks") as err:
        load_sharding_plan(doc, world_size=4, tables={k: v for k, v in shapes.items()
                                                      if k != "t2"})
    with pytest.raises(SpecError, match=r"\['t9'\] are not in the plan"):
        load_sharding_plan(doc, world_size=4, tables={**shapes, "t9": (3, 4)})
    with pytest.raises(SpecError, match=r"'t1' is \[37, 32\] in the plan but \[37, 64\]") as err:
        load_sharding_plan(doc, world_size=4, tables={**shapes, "t1": (37, 64)})
    assert err.value.field == "context.tables.t1"
    with pytest.raises(SpecError, match="2 ranks per host, the trainer 4"):
        load_sharding_plan(doc, world_size=4, local_world_size=4)
    with pytest.raises(SpecError, match="schema_version"):
        load_sharding_plan({**doc, "schema_version": 0}, world_size=4)


def test_empty_row_shards_are_refused_for_cpu_placements():
    """TorchRec's own row-wise layout of 5 rows on 4 ranks ends in an empty shard; FBGEMM's CPU
    kernel mishandles it (test_torchrec_dmp.py), so the loader refuses it for CPU runs."""
    from planner.export.torchrec_check import empty_row_shards
    from planner.export.torchrec_load import load_sharding_plan
    doc = export_torchrec_plan(sharding_plan("row_wise", 4, EMPTY_SHARD_TABLES), device="cpu")
    assert [s["shard_sizes"][0] for s in doc["plan"][""]["e0"]["shards"]] == [2, 2, 1, 0]
    assert empty_row_shards(doc) == [("", "e0", 3, 3)]
    assert empty_row_shards(_doc()) == []
    with pytest.raises(SpecError, match="empty shard on rank 3") as err:
        load_sharding_plan(doc, world_size=4)
    assert err.value.field == 'plan."".e0.shards[3]' and "table_wise" in err.value.fix
    gpu = export_torchrec_plan(sharding_plan("row_wise", 4, EMPTY_SHARD_TABLES), device="cuda")
    with pytest.raises(SpecError, match="empty shard"):
        load_sharding_plan(gpu, world_size=4, device="cpu")
    pytest.importorskip("torchrec")
    assert load_sharding_plan(gpu, world_size=4).plan[""]["e0"].sharding_type == "row_wise"
    assert load_sharding_plan(doc, world_size=4, allow_empty_shards=True) is not None


def test_loader_file_errors_name_the_file(tmp_path):
    from planner.export.torchrec_load import load_sharding_plan
    with pytest.raises(SpecError, match="no such file") as err:
        load_sharding_plan(tmp_path / "missing.json")
    assert err.value.source.endswith("missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="not JSON") as err:
        load_sharding_plan(bad)
    assert err.value.field == "line 1 column 2"


def test_loader_builds_torchrec_objects_equal_to_the_file(tmp_path):
    pytest.importorskip("torchrec")
    from torchrec.distributed.types import (
        EmbeddingModuleShardingPlan,
        EnumerableShardingSpec,
        ParameterSharding,
        ShardingPlan,
    )
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from planner.export.torchrec_load import load_sharding_plan
    doc = _doc()
    path = tmp_path / "p.json"
    path.write_text(torchrec_plan_json(doc))
    configs = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[n])
               for n, r, d in TABLES]
    plan = load_sharding_plan(path, world_size=4, tables=configs, local_world_size=2)
    assert isinstance(plan, ShardingPlan)
    mp = plan.plan[""]
    assert isinstance(mp, EmbeddingModuleShardingPlan)
    assert all(isinstance(p, ParameterSharding) for p in mp.values())
    assert isinstance(mp["t0"].sharding_spec, EnumerableShardingSpec)
    assert mp["t4"].sharding_spec is None
    # TorchRec's own serialisation of the loaded plan is exactly the file's plan member
    assert plan._serialize()["plan"] == doc["plan"]
    gpu = load_sharding_plan(path, world_size=4, device="cuda")
    md = gpu.plan[""]["t0"].sharding_spec.shards[0]
    assert str(md.placement) == "rank:3/cuda:1"


_TORCHREC_ONLY = NO_CLUSTERPLAN + """
import json, sys
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
out = {}
for kind, tables in json.loads(sys.argv[1]).items():
    mod = __import__("plan_" + kind)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name=n, num_embeddings=r, embedding_dim=d, feature_names=[n]) for n, r, d in tables],
        device="meta")
    got = {"plan": mod.sharding_plan(ebc, world_size=4)._serialize()["plan"]}
    for bad in ("world", "shape"):
        try:
            if bad == "world":
                mod.sharding_plan(ebc, world_size=2)
            else:
                mod.sharding_plan(EmbeddingBagCollection(tables=[EmbeddingBagConfig(
                    name=n, num_embeddings=r + 1, embedding_dim=d, feature_names=[n])
                    for n, r, d in tables], device="meta"))
            got[bad] = "accepted"
        except ValueError as e:
            got[bad] = str(e)
    out[kind] = got
print(json.dumps(out))
"""


def test_python_module_builds_the_same_plan_with_torchrec_alone(tmp_path):
    """``--to torchrec-py``: a module that imports no clusterplan (imports of planner and
    simulator are made to fail) builds TorchRec ParameterShardings equal to the JSON export's,
    for every sharding type, and refuses another world size or table shape."""
    pytest.importorskip("torchrec")
    from planner.export.torchrec_py import torchrec_plan_module
    docs = {kind: export_torchrec_plan(sharding_plan(kind, 4)) for kind in KINDS}
    for kind, doc in docs.items():
        text = torchrec_plan_module(doc)
        assert text == torchrec_plan_module(copy.deepcopy(doc))        # same plan, same bytes
        assert "planner" not in text.split('"""', 2)[2] and "clusterplan" not in text.split(
            '"""', 2)[2]
        (tmp_path / f"plan_{kind}.py").write_text(text)
    (tmp_path / "check.py").write_text(_TORCHREC_ONLY)
    arg = json.dumps({kind: [list(t) for t in TABLES] for kind in docs})
    r = subprocess.run([sys.executable, "-W", "ignore", "check.py", arg], cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for kind, doc in docs.items():
        assert got[kind]["plan"] == doc["plan"], kind
        assert "for 4 ranks, the trainer has 2" in got[kind]["world"]
        assert "[rows, dim] in the plan" in got[kind]["shape"]


def test_python_module_refuses_empty_cpu_row_shards():
    from planner.export.torchrec_py import torchrec_plan_module
    doc = export_torchrec_plan(sharding_plan("row_wise", 4, EMPTY_SHARD_TABLES), device="cpu")
    with pytest.raises(SpecError, match="empty row shard on rank 3") as err:
        torchrec_plan_module(doc, source="p.json")
    assert err.value.source == "p.json" and "table_wise" in err.value.fix
    gpu = export_torchrec_plan(sharding_plan("row_wise", 4, EMPTY_SHARD_TABLES), device="cuda")
    assert "rank:3/cuda:1" in torchrec_plan_module(gpu)


# --- CLI --------------------------------------------------------------------------------------

def test_cli_export_writes_the_file_and_refuses_bad_input(tmp_path, capsys):
    from planner.cli.main import main
    plan_path = tmp_path / "plan.json"
    sharding_plan("mixed", 4).write(plan_path)
    out = tmp_path / "tr.json"
    assert main(["export", str(plan_path), "--to", "torchrec", "--device", "cpu",
                 "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert check_torchrec_plan(doc) == doc and doc["device"] == "cpu"
    # a directory --out gets torchrec_plan.json; no --out prints it
    assert main(["export", str(plan_path), "--to", "torchrec", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "torchrec_plan.json").read_text())["device"] == "cuda"
    capsys.readouterr()
    assert main(["export", str(plan_path), "--to", "torchrec", "--module-fqn", "sparse.ebc"]) == 0
    assert list(json.loads(capsys.readouterr().out)["plan"]) == ["sparse.ebc"]

    bad = tmp_path / "bad.json"
    doc = json.loads(plan_path.read_text())
    doc["shards"][2]["shards"][1]["sizes"][0] = 3      # row_wise t2: 2 + 3 + 2 + 1 rows
    bad.write_text(json.dumps(doc))
    cases = [(bad, "torchrec", "bad.json: shards[2]: table 't2' (row_wise)"),
             (tmp_path / "none.json", "torchrec", "none.json: PLAN: no such file"),
             (plan_path, "megatron", "plan.json: format: an embedding sharding plan")]
    for path, target, words in cases:
        assert main(["export", str(path), "--to", target]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and "(fix: " in err, err
    llm = tmp_path / "llm.json"
    llm.write_text(json.dumps({"kind": "llm-plan", "format_version": 1}))
    assert main(["export", str(llm), "--to", "torchrec"]) == 2
    assert "format: format is an LLM plan" in capsys.readouterr().err


def test_cli_entry_point_runs_as_a_process(tmp_path):
    plan_path = tmp_path / "plan.json"
    sharding_plan("table_wise", 2).write(plan_path)
    exe = Path(sys.executable).with_name("clusterplan")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "planner.cli.main"]
    res = subprocess.run(cmd + ["export", str(plan_path), "--to", "torchrec", "--out",
                                str(tmp_path / "x.json")], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "x.json").read_text())["device"] == "cpu"
    res = subprocess.run(cmd + ["export", str(tmp_path / "x.json"), "--to", "torchrec"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "format is 'clusterplan.torchrec-plan', not an embedding sharding plan" in res.stderr
