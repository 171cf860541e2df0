"""Table specs: built-in examples, minimal CSV, YAML, and every bad-input case."""

from __future__ import annotations

import pytest

from simulator.errors import SpecError

from planner.model.tables.shards import ShardingType
from planner.model.tables.spec_file import builtin_spec_names, load_model_spec


def test_builtin_examples():
    assert {"criteo-dlrm", "mlperf-dcnv2"} <= set(builtin_spec_names())
    c = load_model_spec("criteo-dlrm")
    assert c.num_tables == 26 and all(t.embedding_dim == 128 for t in c.tables)
    assert c.dense.bottom_mlp == (512, 256, 128) and c.dense.top_mlp == (1024, 1024, 512, 256, 1)
    assert c.dense.interaction == "dot" and c.optimizer == "sgd"
    m = load_model_spec("mlperf-dcnv2")
    assert m.num_tables == 26 and m.dense.interaction == "dcnv2" and m.dense.dcn_layers == 3
    assert m.dense.dcn_projection == 512
    assert [t.num_embeddings for t in m.tables][:3] == [40_000_000, 39060, 17295]
    assert [t.pooling_factor for t in m.tables][20] == 100
    assert sum(t.num_embeddings == 40_000_000 for t in m.tables) == 5


def test_minimal_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("name,num_embeddings,embedding_dim,pooling_factor\nu,1000,16,2.5\nv,50,8,1\n")
    m = load_model_spec(p)
    assert m.name == "t" and m.num_tables == 2 and m.batch_size == 65536 and m.optimizer == "sgd"
    u = m.tables[0]
    assert (u.num_embeddings, u.embedding_dim, u.pooling_factor, u.precision) == (1000, 16, 2.5, "fp32")
    assert u.reuse_bins is None and u.zipf_exponent is None and m.dense is None


def test_csv_optional_columns(tmp_path):
    bins = ",".join(["0.5", "0.5"] + ["0"] * 15)
    p = tmp_path / "t.csv"
    p.write_text("name,num_embeddings,embedding_dim,pooling_factor,precision,sharding_types,"
                 + ",".join(f"bin_{i}" for i in range(17)) + "\n"
                 + f"a,100,8,1,fp16,table_wise|row_wise,{bins}\n")
    t = load_model_spec(p).tables[0]
    assert t.precision == "fp16" and t.bytes_per_element == 2
    assert t.sharding_types == (ShardingType.TABLE_WISE, ShardingType.ROW_WISE)
    assert t.reuse_bins[:2] == (0.5, 0.5)


def test_yaml_with_defaults_and_csv_tables(tmp_path):
    (tmp_path / "tabs.csv").write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                                       "a,10,4,1\n")
    (tmp_path / "m.yaml").write_text("name: m\nbatch_size: 1024\noptimizer: adam\n"
                                     "tables: tabs.csv\n")
    m = load_model_spec(tmp_path / "m.yaml")
    assert m.batch_size == 1024 and m.optimizer == "adam" and m.tables[0].name == "a"
    (tmp_path / "n.yaml").write_text(
        "table_defaults: {embedding_dim: 32}\ntables:\n  - {name: a, num_embeddings: 5, "
        "zipf_exponent: 1.1}\n")
    t = load_model_spec(tmp_path / "n.yaml").tables[0]
    assert t.embedding_dim == 32 and t.zipf_exponent == 1.1 and t.pooling_factor == 1.0


def _err(tmp_path, text, name="t.csv") -> SpecError:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_model_spec(p)
    return e.value


H = "name,num_embeddings,embedding_dim,pooling_factor\n"


@pytest.mark.parametrize("text,field,words", [
    ("name,num_embeddings,embedding_dim\na,10,4\n", "header", ["pooling_factor"]),
    ("name,rows,embedding_dim,pooling_factor\na,10,4,1\n", "header", ["num_embeddings"]),
    (H + "a,-10,4,1\n", "tables[0].num_embeddings", ["'a'", "-10", "≥ 1"]),
    (H + "a,10,-4,1\n", "tables[0].embedding_dim", ["'a'", "-4"]),
    (H + "a,10,4,-2\n", "tables[0].pooling_factor", ["'a'", "-2"]),
    (H + "a,10,4,1\nb,ten,4,1\n", "tables[1].num_embeddings", ["'b'", "ten"]),
    (H + "a,10,4,1\na,10,4,1\n", "tables[1].name", ["twice"]),
    (H + "a,10,4\n", "tables[0]", ["3 values"]),
    (H, "tables", ["no tables"]),
    ("", "header", ["empty"]),
    (H.strip() + ",color\na,10,4,1,red\n", "header", ["color"]),
    (H.strip() + ",precision\na,10,4,1,fp64\n", "tables[0].precision", ["fp64"]),
    (H + "a,10,4," + "9" * 140_000 + "\n", "tables", ["line 2", "131072"]),
])
def test_bad_csv(tmp_path, text, field, words):
    e = _err(tmp_path, text)
    assert e.field == field and e.fix and e.source.endswith("t.csv")
    for w in words:
        assert w in e.message
    assert "\n" not in str(e)


def test_bad_yaml(tmp_path):
    e = _err(tmp_path, "tables:\n  - {name: a, num_embeddings: 10, embedding_dim: 4, "
                       "reuse_bins: [0.5, 0.1]}\n", "m.yaml")
    assert e.field == "tables[0].reuse_bins" and "17" in e.message
    e = _err(tmp_path, "tables:\n  - {name: a, num_embeddings: 10}\n", "m.yaml")
    assert e.field == "tables[0].embedding_dim" and "missing" in e.message
    e = _err(tmp_path, "tables: [\n", "m.yaml")
    assert "YAML syntax" in e.message
    e = _err(tmp_path, "optimizer: lion\ntables: []\n", "m.yaml")
    assert e.field == "optimizer"
    e = _err(tmp_path, "tables:\n  - {name: a, num_embeddings: 10, embedding_dim: 4, dims: 3}\n",
             "m.yaml")
    assert e.field == "tables[0].dims"
    with pytest.raises(SpecError) as e:
        load_model_spec("no-such-model")
    assert "criteo-dlrm" in e.value.message
    with pytest.raises(SpecError):
        load_model_spec("missing/file.csv")


def test_table_larger_than_every_device_exits_2(tmp_path, capsys):
    from planner.cli.tables import main
    p = tmp_path / "big.csv"
    p.write_text(H + "huge,50000000,4,1\nsmall,1000,16,2\n")
    code = main([str(p), "--devices", "4", "--memory", "512MiB", "--sharding-types", "tw,cw"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "'huge'" in err and "50,000,000" in err and "762.94 MiB" in err
    assert "512.00 MiB" in err and "allow row-wise" in err
    # allowed: the same input plans (row-wise), exit 0
    assert main([str(p), "--devices", "4", "--memory", "512MiB", "--json"]) == 0
    capsys.readouterr()
    # even row-wise cannot fit: the fix says how many devices
    code = main([str(p), "--devices", "2", "--memory", "128MiB"])
    err = capsys.readouterr().err
    assert code == 2 and "'huge'" in err and "≥ 6 devices" in err


def test_cli_bad_values_exit_2(tmp_path, capsys):
    from planner.cli.tables import main
    p = tmp_path / "t.csv"
    p.write_text(H + "a,-1,4,1\n")
    assert main([str(p), "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'a'" in err and "-1" in err and "fix:" in err
    assert main(["criteo-dlrm", "--devices", "2", "--planner", "nope"]) == 2
    assert main(["criteo-dlrm", "--devices", "0"]) == 2
    assert main(["criteo-dlrm", "--devices", "16", "--topology", "dgx-a100:nodes=1"]) == 2
    assert main(["criteo-dlrm", "--devices", "16", "--topology", "dgx-a100"]) == 0   # grows
    assert main(["criteo-dlrm", "--devices", "2", "--memory=-3GiB"]) == 2
    assert main(["criteo-dlrm", "--devices", "2", "--sharding-types", "diagonal"]) == 2
    assert main(["criteo-dlrm", "--devices", "2", "--time-limit", "0"]) == 2
    capsys.readouterr()
