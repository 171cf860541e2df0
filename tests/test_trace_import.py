"""Real traces into the op graph: torch.profiler traces of a real gloo run, and Chakra JSON views."""

from __future__ import annotations

import json
import os
import socket

import pytest

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.cli.main import main
from planner.workloads.chakra import chakra_workload
from planner.workloads.replay import kineto_workload, read_kineto

torch = pytest.importorskip("torch")
STEPS = 3


def _worker(rank: int, world: int, port: int, outdir: str) -> None:
    import datetime

    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    a, g = torch.randn(128, 128), torch.randn(1 << 14)
    sub = dist.new_group([0, 1])

    def step():
        a @ a
        dist.all_reduce(g)
        with record_function("grads ranks=[0, 1]"):
            dist.all_reduce(g[:1000], group=sub)
        out = torch.empty(world * 100)
        dist.all_gather_into_tensor(out, torch.ones(100))
        rs = torch.empty(100)
        dist.reduce_scatter_tensor(rs, torch.ones(world * 100))
        if rank == 0:
            dist.send(torch.ones(10), 1)
        else:
            dist.recv(torch.empty(10), 0)

    step()                                              # warm-up, not profiled
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(STEPS):
            step()
    prof.export_chrome_trace(os.path.join(outdir, f"rank{rank}.json"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    import torch.multiprocessing as mp
    out = tmp_path_factory.mktemp("kineto")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(_worker, args=(2, port, str(out)), nprocs=2, join=False)
    assert ctx.join(timeout=120) or ctx.join(timeout=60), "gloo trace run did not finish"
    return [str(out / "rank0.json"), str(out / "rank1.json")]


def test_every_call_of_the_run_is_read_with_kind_bytes_and_group(traces):
    ranks = read_kineto(traces)
    one = [("allreduce", 4 * (1 << 14), (0, 1)), ("allreduce", 4000, (0, 1)),
           ("allgather", 800, (0, 1)), ("reducescatter", 800, (0, 1))]
    for r in ranks:
        p2p = ("send", 40, (0, 1)) if r.rank == 0 else ("recv", 40, (0, 1))
        assert [(c.kind, c.bytes, c.group) for c in r.calls] == (one + [p2p]) * STEPS
        assert all(c.measured_s > 0 and c.compute_before_s >= 0 for c in r.calls)
        assert [c.label for c in r.calls][1] == "grads ranks=[0, 1]"
        assert r.span_s >= sum(c.measured_s for c in r.calls)


def test_replay_keeps_measured_compute_and_simulates_each_call(traces):
    ranks = read_kineto(traces)
    w = kineto_workload(ranks)
    kinds = [op.collective or op.kind for op in w.ops if op.kind != "compute"]
    assert kinds.count("allreduce") == 2 * STEPS and kinds.count("allgather") == STEPS
    assert kinds.count("reducescatter") == STEPS and kinds.count("sendrecv") == STEPS
    for r in ranks:                 # every measured gap is one fixed-duration op of that length
        gaps = sum(op.duration_s for op in w.ops if op.kind == "compute" and op.ranks == (r.rank,))
        assert gaps == pytest.approx(sum(c.compute_before_s for c in r.calls) + r.tail_compute_s)
    res = simulate(load_topology("localhost-gloo:node.gpus=2"), w)
    assert res.step_time_s >= max(gaps for gaps in [0.0])
    assert res.step_time_s > 0


def test_replay_command(traces, capsys):
    assert main(["replay", *traces, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ranks"] == 2 and d["format"] == "kineto"
    assert d["communication"]["allreduce"]["count"] == 2 * STEPS
    assert d["communication"]["p2p"]["count"] == STEPS
    assert all(row["measured_s"] > 0 and row["replayed_s"] > 0 for row in d["per_rank"])


def test_traces_of_different_runs_are_refused(traces, tmp_path):
    doc = json.loads(open(traces[1]).read())
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not str(e.get("name", "")).startswith("c10d::send")
                          and not str(e.get("name", "")).startswith("c10d::recv")
                          or e is None][: len(doc["traceEvents"]) // 2]
    cut = tmp_path / "rank1.json"
    cut.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="no matching call"):
        kineto_workload(read_kineto([traces[0], str(cut)]))


# -- Chakra --------------------------------------------------------------------------------
def _chakra_rank(rank: int, p2p: bool = True) -> str:
    """The minimal trace of formats.md §7.5, as chakra_jsonizer writes it (concatenated JSON
    messages, lowerCamelCase, 64-bit integers as strings, a default id 0 omitted)."""
    msgs = [{"version": "0.0.4"},
            {"name": "fwd_block0", "type": "COMP_NODE", "durationMicros": "900",
             "attr": [{"name": "is_cpu_op", "boolVal": False},
                      {"name": "num_ops", "int64Val": "1500000000"},
                      {"name": "tensor_size", "uint64Val": str(32 << 20)}]},
            {"id": "1", "name": "grad_allreduce", "type": "COMM_COLL_NODE", "dataDeps": ["0"],
             "attr": [{"name": "comm_type", "int64Val": "0"},
                      {"name": "comm_size", "int64Val": str(128 << 20)},
                      {"name": "pg_name", "stringVal": "1" if rank < 8 else "2"}]}]
    if p2p and rank in (0, 8):
        t = "COMM_SEND_NODE" if rank == 0 else "COMM_RECV_NODE"
        msgs.append({"id": "2", "name": "act", "type": t, "dataDeps": ["0"],
                     "attr": [{"name": "comm_size", "int64Val": str(4 << 20)},
                              {"name": "comm_src", "int32Val": 0},
                              {"name": "comm_dst", "int32Val": 8},
                              {"name": "comm_tag", "int32Val": 3}]})
    return "".join(json.dumps(m) for m in msgs)


@pytest.fixture
def chakra(tmp_path):
    paths = []
    for r in range(16):
        p = tmp_path / f"trace.{r}.json"
        p.write_text(_chakra_rank(r))
        paths.append(str(p))
    groups = tmp_path / "comm_groups.json"
    groups.write_text(json.dumps({"1": list(range(8)), "2": list(range(8, 16))}))
    return paths, groups


def test_chakra_json_views_become_the_op_graph(chakra):
    paths, groups = chakra
    for r in range(8):                                  # one host, no pipeline message
        open(paths[r], "w").write(_chakra_rank(r, p2p=False))
    w = chakra_workload(paths[:8], groups={"1": list(range(8))})
    comp = [op for op in w.ops if op.kind == "compute"]
    coll = [op for op in w.ops if op.kind == "collective"]
    assert len(comp) == 8 and all(op.duration_s == pytest.approx(900e-6) for op in comp)
    assert len(coll) == 1 and coll[0].ranks == tuple(range(8))
    assert coll[0].bytes_moved == 128 << 20 and set(coll[0].deps) == {op.id for op in comp}


def test_chakra_replay_command_with_groups_and_messages(chakra, capsys):
    paths, groups = chakra
    assert main(["replay", "--chakra", "--comm-groups", str(groups), *paths,
                 "--topology", "dgx-a100:nodes=2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["communication"]["allreduce"]["count"] == 2        # one per group
    assert d["communication"]["p2p"]["count"] == 1              # rank 0 → rank 8, tag 3
    assert d["replayed_step_time_s"] > 900e-6


def test_chakra_group_missing_is_a_clear_error(chakra, capsys):
    paths, _ = chakra
    assert main(["replay", "--chakra", *paths, "--topology", "dgx-a100:nodes=2"]) == 2
    err = capsys.readouterr().err
    assert "pg_name" in err and "--comm-groups" in err


def test_not_a_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    assert main(["replay", str(bad)]) == 2
    assert "x.json" in capsys.readouterr().err
