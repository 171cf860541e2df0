"""Fuzz cases for the CLI: argument lists and mutated spec files, valid and broken alike.

``make_case(choice, tmp)`` builds one case from ``choice(seq)`` (a hypothesis draw in
tests/test_fuzz.py, a seeded ``random.Random.choice`` in tests/bench/bench_fuzz.py) and returns
the argv. The corpus covers every spec kind (model, topology, workload, tables YAML and CSV,
sweep grid, cost matrix, LLM and sharding plans, traces, calibration tables, co-access
matrices), whole-file faults given where any of them is expected (a folder, a FIFO,
/dev/zero, a missing file, binary or non-UTF-8 bytes, a symlink loop, YAML or JSON nested
100,000 deep, an alias bomb, 2 MB of junk), numeric flags at their extremes and outputs
pointed at folders. ``fuzz_runner.run_case(argv)`` runs one case.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from pathlib import Path

import yaml

from planner.cli.main import main

REPO = Path(__file__).resolve().parents[1]

TOPOLOGIES = ["dgx-a100", "h100-ib:nodes=2", "dgx-a100:nodes=2", "localhost-gloo", "pcie-a100",
              "two-buildings-h100:nodes=2", "nope", "dgx-a100:nodes=-1", "dgx-a100:nodes=abc",
              "h100-ib:node.gpus=0", "dgx-a100:bogus=1", "dgx-a100:nodes=1e9", "",
              "dgx-a100:node.nic_bandwidth=-5Gb/s", "h100-ib:fabric.tiers=3", ":", "dgx-a100:="]
SIZES = ["1GiB", "64MB", "0", "-5", "abc", "1e30", "nan", "inf", "1 KiB", "3", "1TiB", ""]
RANKS = ["2", "8", "16", "0", "-3", "1", "99999", "x", "1.5"]
PARALLEL = ["tp=8", "tp=2,pp=2", "tp=3", "tp=0", "dp=-1", "garbage", "tp=1e3", "tp=8,pp=2,dp=1",
            "tp=1,pp=1,dp=16", "tp=2,cp=2", "ep=2", "vpp=2", "fsdp=zero3", "fsdp=zero9", "tp=",
            "tp=4,pp=4,vpp=3,dp=1"]
INTS = ["1", "2", "8", "0", "-1", "abc", "1000000", "3"]
TIMES = ["1s", "30min", "0s", "-1s", "abc", "50000h", "1e400s", ""]
MODELS = ["llama3-8b", "gpt3-175b", "mixtral-8x7b", "nonexistent-model"]
TABLES = ["criteo-dlrm", "mlperf-dcnv2", "nope-tables"]
PLANNERS = ["greedy", "size_lookup", "random", "local_search", "bogus"]
KINDS = ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "bogus"]
ALGOS = ["auto", "ring", "tree", "hierarchical", "direct", "bogus"]

# base specs to mutate: (command builder, file suffix, loader of the valid document)
_MODEL = REPO / "planner" / "models" / "llama3-8b.yaml"
_TOPO = REPO / "topologies" / "dgx-a100.yaml"
_WORKLOAD = REPO / "simulator" / "workloads" / "dp-step.yaml"
JUNK = [None, -1, 0, "abc", [], {}, 1e300, float("nan"), True, "1GiB", -1e-9, 2**63, "tp=8"]


def _leaves(doc, path=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def _junk_leaf(doc, choice):
    """Replace one leaf anywhere in the document (deep fields get hit as often as top ones)."""
    paths = [p for p in _leaves(doc) if p]
    if not paths:
        return copy.deepcopy(choice(JUNK))
    p = choice(paths)
    node = doc
    for k in p[:-1]:
        node = node[k]
    node[p[-1]] = copy.deepcopy(choice(JUNK))
    return doc


def _mutate(doc, choice, depth: int = 0):
    """Delete a key, replace a value with junk, or descend into a sub-mapping/list."""
    if isinstance(doc, dict) and doc:
        key = choice(sorted(doc, key=str))
        action = choice(["delete", "junk", "descend", "add"])
        if action == "delete":
            doc.pop(key)
        elif action == "junk" or depth > 3:
            doc[key] = copy.deepcopy(choice(JUNK))
        elif action == "add":
            doc[choice(["extra", "Layers", "tp", "x"])] = copy.deepcopy(choice(JUNK))
        else:
            doc[key] = _mutate(doc[key], choice, depth + 1)
        return doc
    if isinstance(doc, list) and doc:
        i = choice(list(range(len(doc))))
        doc[i] = _mutate(doc[i], choice, depth + 1)
        return doc
    return copy.deepcopy(choice(JUNK))


def _mutated_file(path: Path, choice, tmp: Path, name: str) -> str:
    doc = yaml.safe_load(path.read_text())
    for _ in range(choice([1, 1, 2, 3])):
        doc = _junk_leaf(doc, choice) if choice([True, False]) else _mutate(doc, choice)
    out = tmp / name
    text = yaml.safe_dump(doc, sort_keys=False) if choice([True, True, False]) else \
        choice(["{", "model: [", "\x00\x01", "", "- 1\n- 2\n", "name: x\nnodes: 1\n"])
    out.write_text(text)
    return str(out)


def make_case(choice, tmp: Path) -> list[str]:
    """One argv for ``clusterplan`` (files it needs are written under ``tmp``)."""
    kind = choice(["topology", "collective", "simulate-model", "simulate-workload", "plan-tables",
                   "plan-model", "export", "mutated-model", "mutated-topology",
                   "mutated-workload", "mutated-csv", "gpus", "diagnose", "sweep", "reorder",
                   "export-torchrec", "plan-dmt", "calibrate-compute", "file-fault",
                   "file-fault", "file-fault", "extreme", "extreme", "extreme", "out-fault",
                   "mutated-tables-yaml"])
    if kind == "file-fault":
        return _file_fault_case(choice, tmp)
    if kind == "extreme":
        return _extreme_case(choice, tmp)
    if kind == "out-fault":
        return _out_fault_case(choice, tmp)
    if kind == "mutated-tables-yaml":
        return ["plan", _mutated_file(_TABLES_YAML, choice, tmp, "tables.yaml"), "--devices",
                choice(["2", "4"]), "--json"]
    if kind == "sweep":
        doc = {"command": ["collective", "allreduce"], "args": {"--topology": "dgx-a100"},
               "grid": {"--size": ["1MiB", "1GiB"], "--ranks": [2, 8]}, "keep": ["time_s"],
               "plot": {"x": "ranks", "y": "time_s"}}
        for _ in range(choice([1, 2])):
            doc = _junk_leaf(doc, choice) if choice([True, False]) else _mutate(doc, choice)
        grid = tmp / "grid.yaml"
        grid.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = str(tmp / choice(["r.csv", "r.txt"]))
        return ["sweep", str(grid), "--workers", "1", "--out", out, "--restart"] \
            + choice([[], ["--plot", str(tmp / "r.png")]])
    if kind == "reorder":
        n = 4
        doc = {"format": "clusterplan.cost-matrix", "schema_version": 1, "ranks": n,
               "hostnames": [f"h{i}" for i in range(n)],
               "latency_s": [[0.0 if i == j else 1e-5 * (1 + (i + j) % 3) for j in range(n)]
                             for i in range(n)],
               "bandwidth_Bps": [[0.0 if i == j else 1e9 for j in range(n)] for i in range(n)],
               "measured": {"how": "fuzz"}}
        if choice([True, True, False]):
            doc = _junk_leaf(doc, choice)
        m = tmp / "matrix.json"
        m.write_text(json.dumps(doc) if choice([True, True, False]) else choice(["{", "[]", ""]))
        return ["reorder", str(m), "--collective",
                choice(["allreduce", "tree", "alltoall", "bogus", "hierarchical"]),
                "--json"] + choice([[], ["--size", choice(SIZES)],
                                    ["--group-size", choice(INTS)], ["--time-limit", choice(INTS)]])
    if kind == "export-torchrec":
        doc = copy.deepcopy(_sharding_plan())
        for _ in range(choice([0, 1, 2])):
            doc = _junk_leaf(doc, choice)
        p = tmp / "dlrm-plan.json"
        p.write_text(json.dumps(doc))
        return ["export", str(p), "--to", choice(["torchrec", "megatron"]), "--out",
                str(tmp / "tr.json")]
    if kind == "plan-dmt":
        return ["plan", "criteo-dlrm", "--devices", choice(["16", "8", "3", "0"]), "--topology",
                choice(["h100-ib:nodes=2", "dgx-a100:nodes=2", "dgx-a100"]), "--dmt",
                "--towers", choice(["auto", "2", "0", "-1", "x", "99"]), "--json",
                "--reproducible"]
    if kind == "calibrate-compute":
        rows = ["kind,dtype,flops,bytes,seconds", "launch,,,,4e-6", "matmul,bf16,1e12,,2e-3",
                "matmul,bf16,1e9,,1e-5", "memory,,,1e9,5e-4", "memory,,,1e6,2e-5",
                "attention,bf16,1e11,,1e-3"]
        i = choice(range(1, len(rows)))
        cells = rows[i].split(",")
        cells[choice(range(5))] = choice(["", "-5", "abc", "0", "1e99", "nan", "1e-30", "bogus"])
        rows[i] = ",".join(cells)
        path = tmp / "kernels.csv"
        path.write_text("\n".join(rows) + "\n")
        return ["calibrate", "compute", "--gpu", choice(["h100-sxm", "nope"]), "--measurements",
                str(path), "--out", str(tmp / "eff.yaml")] + choice(
                    [[], ["--drop-cache-resident"]])
    if kind == "diagnose":
        t = tmp / "trace.json"
        t.write_text(choice(["{}", "[]", "{bad", json.dumps({"traceEvents": [{"ph": "X"}]}),
                             json.dumps({"traceEvents": [{"ph": "X", "ts": "a", "dur": 1,
                                                          "cat": "kernel", "name": "k"}]}),
                             json.dumps({"traceEvents": [{"ph": "X", "ts": 0, "dur": 5,
                                                          "cat": "cpu_op", "name": "mm"}]})]))
        return ["diagnose", str(t)] + choice([[], ["--min-excess", choice(["-1", "0.1", "x"])]])
    if kind == "topology":
        return ["topology", "show", choice(TOPOLOGIES)] + choice([[], ["--json"]])
    if kind == "gpus":
        return ["gpus"] + choice([[], ["--json"]])
    if kind == "collective":
        return ["collective", choice(KINDS), "--size", choice(SIZES), "--ranks", choice(RANKS),
                "--topology", choice(TOPOLOGIES), "--algo", choice(ALGOS), "--json"]
    if kind == "simulate-model":
        argv = ["simulate", choice(MODELS), "--topology", choice(TOPOLOGIES), "--gpus",
                choice(["8", "16", "0", "-8", "7"]), "--parallel", choice(PARALLEL),
                "--global-batch", choice(["16", "0", "-4", "7"]), "--json"]
        return argv + choice([[], ["--straggler", choice(["1=1.1", "x", "99=2", "1=0.5"])],
                              ["--mtbf", choice(TIMES)],
                              ["--link-fault", choice(["n0/nic0<->*=0.5", "a->b=2", "x"])]])
    if kind == "simulate-workload":
        return ["simulate", choice(["dp-step", "nope-workload"]), "--topology",
                choice(TOPOLOGIES), "--json"] + choice([[], ["--straggler", choice(["3=1.2", "3"])],
                                                        ["--mtbf", choice(TIMES),
                                                         "--checkpoint-every", choice(TIMES)]])
    if kind == "plan-tables":
        return ["plan", choice(TABLES), "--devices", choice(INTS), "--planner", choice(PLANNERS),
                "--json", "--reproducible"] + choice([[], ["--memory", choice(SIZES)],
                                                      ["--time-limit", choice(["1", "0", "-1"])]])
    if kind == "plan-model":
        return ["plan", choice(["llama3-8b", "nonexistent-model"]), "--topology",
                choice(["dgx-a100", "h100-ib:nodes=2", "nope"]), "--top", choice(["1", "0", "-2"]),
                "--json"]
    if kind == "export":
        bad = tmp / "plan.json"
        bad.write_text(choice(["{}", "[]", "{bad json", json.dumps({"kind": "llm-plan"}),
                               json.dumps({"kind": "llm-plan", "format_version": 1,
                                           "parallel": {"tp": 0}})]))
        return ["export", str(bad), "--to", choice(["torchtitan", "megatron", "deepspeed",
                                                    "hostfile", "bogus"])]
    if kind == "mutated-model":
        return ["simulate", _mutated_file(_MODEL, choice, tmp, "model.yaml"), "--topology",
                "dgx-a100", "--parallel", "tp=8", "--global-batch", "8", "--json"]
    if kind == "mutated-topology":
        return ["topology", "show", _mutated_file(_TOPO, choice, tmp, "topo.yaml"), "--json"]
    if kind == "mutated-workload":
        return ["simulate", _mutated_file(_WORKLOAD, choice, tmp, "work.yaml"), "--topology",
                "dgx-a100:nodes=2", "--json"]
    # mutated CSV table spec
    rows = ["name,num_embeddings,embedding_dim,pooling_factor", "t0,1000,64,1.0",
            "t1,500,32,2.5"]
    i = choice([1, 2])
    cells = rows[i].split(",")
    cells[choice([0, 1, 2, 3])] = choice(["", "-5", "abc", "0", "1e99", "nan", "3.5"])
    rows[i] = ",".join(cells)
    if choice([False, False, True]):
        rows[0] = "name,num_embeddings,embedding_dim"
    path = tmp / "tables.csv"
    path.write_text("\n".join(rows) + "\n")
    return ["plan", str(path), "--devices", choice(["2", "0", "x"]), "--json"]


_TABLES_YAML = REPO / "planner" / "examples" / "criteo-dlrm.yaml"

#: one anchor per level, each level nine aliases of the one below: 9**8 values from 300 bytes
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9))

FAULTS = ["folder", "fifo", "devzero", "missing", "binary", "latin1", "symlink-loop",
          "deep-yaml", "deep-json", "alias-bomb", "junk-2mb", "empty", "nul", "deep-json-lines"]


def fault_file(kind: str, tmp: Path, suffix: str) -> str:
    """A path to a whole-file fault of ``kind`` (see :data:`FAULTS`) named ``fault<suffix>``."""
    p = tmp / f"fault{suffix}"
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "devzero":
        return "/dev/zero"
    elif kind == "binary":
        p.write_bytes(bytes(range(256)) * 64)
    elif kind == "latin1":
        p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    elif kind == "symlink-loop":
        os.symlink(p, p)
    elif kind == "deep-yaml":
        p.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    elif kind in ("deep-json", "deep-json-lines"):
        p.write_text(("[" * 100_000 + "]" * 100_000) * (2 if kind.endswith("lines") else 1))
    elif kind == "alias-bomb":
        p.write_text(ALIAS_BOMB)
    elif kind == "junk-2mb":
        p.write_text("x: " + "y" * 2_000_000 + "\n")
    elif kind == "empty":
        p.write_text("")
    elif kind == "nul":
        p.write_bytes(b"name: x\x00\x00\n")
    return str(p)                                   # "missing": never created


def _file_commands(f: str, out: Path) -> list[list[str]]:
    """Every place a command reads a file, with ``f`` there."""
    return [
        ["simulate", f, "--topology", "dgx-a100", "--json"],
        ["simulate", "dp-step", "--topology", f, "--json"],
        ["topology", "show", f],
        ["plan", f, "--devices", "2", "--json"],
        ["plan", f, "--topology", "dgx-a100", "--top", "1"],
        ["plan", "criteo-dlrm", "--devices", "16", "--topology", "h100-ib:nodes=2", "--dmt",
         "--coaccess", f],
        ["export", f, "--to", "megatron"],
        ["export", f, "--to", "torchrec", "--out", str(out / "tr.json")],
        ["reorder", f],
        ["reorder", "--topology", "cloud-64", "--collective", f],
        ["diagnose", f],
        ["replay", f, "--topology", "dgx-a100"],
        ["replay", f, "--chakra", "--topology", "dgx-a100"],
        ["sweep", f, "--out", str(out / "r.csv")],
        ["calibrate", "compute", "--gpu", "h100-sxm", "--measurements", f, "--out",
         str(out / "eff.yaml")],
        ["calibrate", "nccl", "--table", f"8={f}", "--topology", "dgx-a100"],
        ["measure", f],
        ["validate", f],
    ]


def _file_fault_case(choice, tmp: Path) -> list[str]:
    suffix = choice([".yaml", ".json", ".csv", ".npy", ""])
    f = fault_file(choice(FAULTS), tmp, suffix)
    return choice(_file_commands(f, tmp))


EXTREMES = ["0", "-1", "1e308", "inf", "nan", "1e-300", "99999999999999", "0.4", "abc", "",
            "-0", "1e400"]


def _extreme_case(choice, tmp: Path) -> list[str]:
    """A numeric flag at an extreme, where it enters the CLI."""
    x = choice(EXTREMES)
    llm = ["simulate", "llama3-8b", "--topology", "dgx-a100", "--json"]
    tables = ["plan", "criteo-dlrm", "--json"]
    return choice([
        llm + ["--parallel", "tp=8", "--global-batch", x],
        llm + ["--parallel", "tp=8", "--global-batch", "8", "--micro-batch", x],
        llm + ["--parallel", "tp=8", "--gpus", x],
        llm + ["--parallel", f"tp={x}"],
        llm + ["--parallel", choice(["tp=8,tp=2", "pp=2,pp=2", "tp=8,dp=1,dp=1"])],
        llm + ["--parallel", "tp=8", "--global-batch", "8", "--trainer-set", f"seq_len={x}"],
        ["simulate", "dp-step", "--topology", "dgx-a100:nodes=2", "--json", "--link-fault",
         f"n0/nic0<->*={x}"],
        ["simulate", "dp-step", "--topology", "dgx-a100:nodes=2", "--json", "--straggler",
         f"1={x}"],
        ["simulate", "dp-step", "--topology", "dgx-a100", "--json", "--mtbf", f"{x}h",
         "--checkpoint-every", choice(["1h", f"{x}min"])],
        ["collective", "allreduce", "--size", x, "--ranks", "8", "--topology", "dgx-a100"],
        ["collective", "alltoall", "--size", "1MiB", "--ranks", x, "--topology", "dgx-a100"],
        ["topology", "show", f"dgx-a100:nodes={x}"],
        ["topology", "show", f"h100-ib:node.nic_bandwidth={x}Gb/s"],
        tables + ["--devices", x],
        tables + ["--devices", "4", "--memory", x],
        tables + ["--devices", "4", "--batch-size", x],
        tables + ["--devices", "4", "--planner", "mip", "--time-limit",
                  choice([x, "1e-300", "0.3"])],
        tables + ["--devices", "4", "--planner", "local_search", "--time-limit", x],
        tables + ["--devices", "16", "--topology", "h100-ib:nodes=2", "--dmt", "--towers", x],
        tables + ["--devices", "16", "--topology", "h100-ib:nodes=2", "--dmt", "--balance", x],
        ["plan", "llama3-8b", "--topology", "dgx-a100", "--top", x],
        ["reorder", "--topology", "cloud-64", "--collective", "allreduce", "--time-limit",
         choice([x, "0.2"]), "--size", choice([x, "1MiB"])],
    ])


def _out_fault_case(choice, tmp: Path) -> list[str]:
    """An output pointed at a folder, into a missing folder, or through a symlink."""
    kind = choice(["folder", "missing", "symlink", "dangling"])
    if kind == "folder":
        out = str(tmp)
    elif kind == "missing":
        out = str(tmp / "no" / "such" / "x.json")
    else:
        target = tmp / "target.json"
        if kind == "symlink":
            target.write_text("{}")
        out = str(tmp / "link.json")
        os.symlink(target, out)
    return choice([
        ["plan", "criteo-dlrm", "--devices", "2", "--out", out],
        ["simulate", "dp-step", "--topology", "dgx-a100", "--trace", out],
        ["simulate", "llama3-8b", "--topology", "dgx-a100", "--parallel", "tp=8",
         "--global-batch", "8", "--timings", out],
        ["reorder", "--topology", "cloud-64", "--collective", "allreduce", "--out", out],
        ["plan", "llama3-8b", "--topology", "dgx-a100", "--top", "1", "--out", out],
    ])


_PLAN_CACHE: dict = {}


def _sharding_plan() -> dict:
    """A valid 2-device sharding plan of criteo-dlrm (made once per process)."""
    if "plan" not in _PLAN_CACHE:
        import tempfile
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            out = Path(d) / "plan.json"
            assert main(["plan", "criteo-dlrm", "--devices", "2", "--out", str(out)]) == 0
            _PLAN_CACHE["plan"] = json.loads(out.read_text())
    return _PLAN_CACHE["plan"]
