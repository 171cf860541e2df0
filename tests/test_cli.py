"""The clusterplan command: JSON keys, human output, and exit 2 with one message on bad input."""

import json
import subprocess
import sys

import pytest

from planner.cli.main import main


def run(*args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "planner.cli.main", *args], capture_output=True,
                       text=True, cwd=cwd, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_no_arguments_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "clusterplan collective allreduce" in out and "topology show" in out


def test_every_command_is_a_module_with_register_and_run(capsys):
    from planner.cli.main import COMMANDS, command_module
    for name in COMMANDS:
        mod = command_module(name)
        assert callable(mod.register) and callable(mod.run), name
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert f"usage: clusterplan {name}" in capsys.readouterr().out


def test_topology_show_json(capsys):
    assert main(["topology", "show", "selene-a100:nodes=64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpus"] == 512 and d["nodes"] == 64
    assert [t["name"] for t in d["tiers"]] == ["leaf", "spine", "core"]
    assert all(t["bisection_Bps"] > 0 for t in d["tiers"])


def test_topology_show_gpus_flag(capsys):
    assert main(["topology", "show", "h100-ib", "--gpus", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == 1024


def test_collective_json_keys(capsys):
    assert main(["collective", "allreduce", "--size", "1GiB", "--ranks", "64", "--topology",
                 "h100-ib", "--algo", "ring", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"time_s", "algbw_Bps", "busbw_Bps", "algorithm"} <= set(d)
    assert d["algorithm"] == "ring"
    assert d["busbw_Bps"] == pytest.approx(d["algbw_Bps"] * 2 * 63 / 64)


def test_simulate_writes_trace(tmp_path, capsys):
    trace = tmp_path / "step.json"
    assert main(["simulate", "dp-step", "--topology", "dgx-a100:nodes=2", "--trace", str(trace),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step_time_s"] > 0 and trace.exists()
    assert json.loads(trace.read_text())["traceEvents"]


BAD = [
    (["topology", "show", "no-such-topology"], "unknown topology"),
    (["topology", "show", "selene-a100:nodes=-3"], "nodes"),
    (["collective", "allreduce", "--size", "1 GiBB", "--topology", "dgx-a100"], "--size"),
    (["collective", "allreduce", "--size", "1GiB", "--ranks", "99", "--topology", "dgx-a100"],
     "--ranks"),
    (["collective", "alltoall", "--size", "1GiB", "--algo", "ring", "--topology", "dgx-a100"],
     "--algo"),
    (["simulate", "nope.yaml", "--topology", "dgx-a100"], "nope.yaml"),
    (["calibrate", "nccl", "--table", "8=missing.csv", "--topology", "dgx-a100"], "missing.csv"),
    # values that used to be taken silently or to run for ever
    (["simulate", "llama3-8b", "--topology", "h100-ib", "--gpus", "8", "--parallel", "tp=8",
      "--global-batch", "0"], "--global-batch"),
    (["simulate", "llama3-8b", "--topology", "h100-ib", "--gpus", "8", "--parallel", "tp=8",
      "--global-batch", "99999999999999"], "--global-batch"),
    (["simulate", "llama3-8b", "--topology", "h100-ib", "--gpus", "8", "--parallel", "tp=8",
      "--global-batch", "2000000000"], "micro-batches per pipeline"),
    (["simulate", "llama3-8b", "--topology", "h100-ib", "--gpus", "8", "--parallel",
      "tp=8,tp=2"], "given twice"),
    (["collective", "allreduce", "--size", "0.4", "--topology", "dgx-a100"], "less than one byte"),
    (["plan", "criteo-dlrm", "--devices", "8", "--planner", "mip", "--time-limit", "inf"],
     "--time-limit"),
    (["simulate", "dp-step", "--topology", "h100-ib:nodes=4", "--link-fault",
      "leaf0/rail0<->spine0=1e-300"], "must be in [0.0001, 1]"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_exits_2_with_one_message(args, needle):
    code, out, err = run(*args)
    assert code == 2
    assert "Traceback" not in err
    assert needle in err and "fix:" in err


def test_bad_topology_files_exit_2(tmp_path):
    cases = {
        "gpu.yaml": "name: x\ngpu: h300\nnode: {gpus: 8}\n",
        "neg.yaml": "name: x\ngpu: a100-80gb\nnodes: 2\nnode: {gpus: 8, nics: 8, nic_bandwidth: -200 Gb/s}\n"
                    "fabric: {tiers: [{name: leaf}]}\n",
        "syntax.yaml": "name: x\nnode: [gpus: 8\n",
        "noroute.yaml": "name: x\ngpu: a100-80gb\ndevices: [{id: a, kind: gpu}, {id: b, kind: gpu}]\n"
                        "links: [{a: a, b: b, bandwidth: 1 GB/s, duplex: half}]\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        code, _, err = run("topology", "show", name, cwd=tmp_path)
        assert code == 2, (name, err)
        assert "Traceback" not in err and name in err and "fix:" in err, (name, err)


def test_plan_devices_and_gpus_name_one_count(capsys):
    """`plan MODEL --devices N` plans N GPUs (it used to plan the whole topology), `plan TABLES
    --gpus N` shards over N devices, and two different counts are refused."""
    assert main(["plan", "llama3-8b", "--topology", "h100-ib", "--devices", "16", "--top", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    par = out["parallel"]
    assert out["gpus"] == 16 and par["tp"] * par["cp"] * par["pp"] * par["dp"] == 16
    assert main(["plan", "criteo-dlrm", "--gpus", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == 8
    assert main(["plan", "criteo-dlrm", "--gpus", "8", "--devices", "4"]) == 2
    assert "disagree" in capsys.readouterr().err


def test_plan_round_trips_through_simulate(tmp_path, capsys):
    """`simulate plan.json` re-simulates the plan (its spec, layout, micro-batch, order and
    GPU count) to the same step time, and its spec saved as JSON is read as a model spec."""
    plan_path = tmp_path / "plan.json"
    assert main(["plan", "llama3-8b", "--topology", "h100-ib", "--gpus", "16", "--top", "1",
                 "--out", str(plan_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(plan_path), "--topology", "h100-ib", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-12)
    assert again["parallel"] == plan["parallel"]
    assert again["memory_per_gpu_bytes"] == plan["memory_per_gpu_bytes"]
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(plan["spec"]))
    assert main(["simulate", str(spec_path), "--topology", "h100-ib", "--gpus", "16",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(
        plan["step_time_s"], rel=1e-12)


def test_a_plan_without_its_spec_says_to_replan(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format_version": 1, "kind": "llm-plan", "model": "llama3-8b"}))
    assert main(["simulate", str(old), "--topology", "h100-ib"]) == 2
    assert "re-run `clusterplan plan" in capsys.readouterr().err


def test_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    """A 1 KB file whose aliases expand to 9⁹ values: exit 2 naming it, not a hang."""
    lines = ['notes: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]', "description:"]
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nname: bomb\ngpu: *a8\n")
    assert main(["topology", "show", str(bomb)]) == 2
    assert "expands to more than" in capsys.readouterr().err


def test_outputs_keep_the_umask_mode_and_write_through_links(tmp_path, capsys):
    """--out files get the mode a plain write gives (not the temporary file's 0600), a
    symbolic link is written through and kept, and a folder given as --out exits 2."""
    import os
    old = os.umask(0o022)
    try:
        out = tmp_path / "plan.json"
        assert main(["plan", "criteo-dlrm", "--devices", "8", "--out", str(out)]) == 0
        assert out.stat().st_mode & 0o777 == 0o644
        target = tmp_path / "real.json"
        target.write_text("{}")
        target.chmod(0o640)
        link = tmp_path / "link.json"
        link.symlink_to(target)
        assert main(["plan", "criteo-dlrm", "--devices", "8", "--out", str(link)]) == 0
        assert link.is_symlink() and json.loads(target.read_text())["devices"] == 8
        assert target.stat().st_mode & 0o777 == 0o640
        capsys.readouterr()
        assert main(["plan", "criteo-dlrm", "--devices", "8", "--out", str(tmp_path)]) == 2
        assert "is a folder" in capsys.readouterr().err
    finally:
        os.umask(old)


def test_a_refused_simulate_writes_no_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["simulate", "dp-step", "--topology", "dgx-a100:nodes=2", "--mtbf", "50000h",
                 "--checkpoint-every=0", "--trace", str(trace)]) == 2
    assert "--checkpoint-every" in capsys.readouterr().err and not trace.exists()


def test_plan_constrained_for_a_target_exports_to_it(tmp_path, capsys):
    """`plan --for deepspeed` picks only what DeepSpeed's export can run (cp=1, vpp=1, ZeRO ≤ 1
    with pp), and the export then succeeds; --constrain fixes axes for every alternative."""
    plan = tmp_path / "plan.json"
    assert main(["plan", "llama3-8b", "--topology", "h100-ib", "--gpus", "16", "--top", "4",
                 "--for", "deepspeed", "--constrain", "pp=2|4", "--out", str(plan),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for r in [doc] + doc["alternatives"]:
        p = r["parallel"]
        assert p["cp"] == 1 and p["vpp"] == 1 and p["pp"] in (2, 4)
        assert p["fsdp"] in ("none", "zero1")
    assert doc["search"]["excluded"] > 0
    assert main(["export", str(plan), "--to", "deepspeed", "--out", str(tmp_path / "ds")]) == 0


@pytest.mark.parametrize("argv,needle", [
    (["plan", "llama3-8b", "--topology", "h100-ib", "--gpus", "16", "--constrain", "tq=8"],
     "bad item"),
    (["plan", "llama3-8b", "--topology", "h100-ib", "--gpus", "16", "--constrain",
      "fsdp=zero9"], "zero9"),
    (["plan", "llama3-8b", "--topology", "h100-ib", "--gpus", "16", "--constrain", "tp=3"],
     "excluded by constraints"),
    (["plan", "criteo-dlrm", "--devices", "8", "--for", "deepspeed"], "model specs"),
])
def test_plan_constraints_bad_input_exits_2(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_gpus_prints_no_nan(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "—" in out           # b200 has no fp32 peak in the catalog


@pytest.mark.parametrize("text", ["name: x\ngpu: h100-sxm\nnodes: '{}'\n", "name: x\ngpu: '{}'\n"])
def test_an_error_quotes_a_huge_value_by_its_start(tmp_path, capsys, text):
    """A megabyte value in a spec gives one short error line, not a megabyte of stderr."""
    path = tmp_path / "topo.yaml"
    path.write_text(text.format("y" * 1_000_000))
    assert main(["topology", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err) < 2_000 and "more characters" in err and str(path) in err


@pytest.mark.parametrize("content", [b"\xff\xfe name: x", b"[" * 100_000 + b"]" * 100_000])
@pytest.mark.parametrize("command", [["topology", "show", "F"], ["export", "F", "--to", "megatron"],
                                     ["reorder", "F"], ["diagnose", "F"],
                                     ["simulate", "F", "--topology", "dgx-a100"]])
def test_whole_file_faults_exit_2_naming_the_file(tmp_path, capsys, content, command):
    path = tmp_path / "input.json"
    path.write_bytes(content)
    assert main([str(path) if a == "F" else a for a in command]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "fix:" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/zero and mkfifo")
@pytest.mark.parametrize("kind", ["fifo", "devzero", "folder"])
def test_a_pipe_a_device_or_a_folder_is_refused_before_reading(tmp_path, capsys, kind):
    import os
    path = tmp_path / "spec.yaml"
    if kind == "fifo":
        os.mkfifo(path)                    # reading it would block for ever
    elif kind == "folder":
        path.mkdir()
    else:
        path = "/dev/zero"                 # reading it would never end
    assert main(["simulate", str(path), "--topology", "dgx-a100"]) == 2
    err = capsys.readouterr().err
    assert "regular file" in err or "directory" in err
