"""costmodel collect: rows + hardware metadata, resume, refusing mixed hardware."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from simulator.errors import SpecError  # noqa: E402

from planner.costmodel.datafile import (
    meta_path,
    read_data,  # noqa: E402
)
from planner.measure.tables.collect import CollectConfig, collect  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = dict(pool_size=12, max_tables=3, repeats=1, warmup=0, comm_devices=2, comm_repeats=1,
            comm_warmup=0, max_bytes=8 * 1024 ** 2)


def test_collect_writes_rows_and_metadata_and_resumes(tmp_path):
    out = tmp_path / "d.csv"
    c = collect(out, CollectConfig(samples=3, comm_samples=2, passes=2, **TINY),
                progress=False)
    assert c == {"compute": 6, "comm": 2, "skipped": 0}
    rows = read_data(out)
    assert [r["kind"] for r in rows].count("compute") == 6
    comp = [r for r in rows if r["kind"] == "compute"]
    assert all(float(r["total_ms"]) > 0 for r in comp)
    # pass 1 starts after the whole of pass 0
    assert [(int(r["sample_id"]), int(r["round"])) for r in comp] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert all(float(r["total_min_ms"]) <= float(r["total_ms"]) for r in comp)
    tabs = json.loads(comp[0]["tables"])
    assert 1 <= len(tabs) <= 3 and all(len(t) == 4 + 17 for t in tabs)
    comm = [r for r in rows if r["kind"] == "comm"]
    assert all(len(json.loads(r["comm_fwd_ms"])) == 2 for r in comm)
    meta = json.loads(meta_path(out).read_text())
    hw = meta["hardware"][0]
    for key in ("cpu_model", "torch", "fbgemm_gpu", "threads", "id"):
        assert key in hw
    assert rows[0]["hw"] == hw["id"]
    # resume: more samples → only the new ones are measured
    c2 = collect(out, CollectConfig(samples=5, comm_samples=2, passes=2, **TINY),
                 progress=False)
    assert c2["compute"] == 4 and c2["comm"] == 0 and c2["skipped"] == 8
    ids = [(r["kind"], r["sample_id"], r["round"]) for r in read_data(out)]
    assert len(ids) == len(set(ids)) == 12
    assert len(json.loads(meta_path(out).read_text())["runs"]) == 2


def test_refuses_mixed_hardware_and_other_config(tmp_path):
    out = tmp_path / "d.csv"
    cfg = CollectConfig(samples=1, comm_samples=0, passes=1, **TINY)
    collect(out, cfg, progress=False)
    mp = meta_path(out)
    meta = json.loads(mp.read_text())
    meta["hardware"][0].update(cpu_model="Some Other CPU", id="000000000000")
    mp.write_text(json.dumps(meta))
    more = CollectConfig(samples=2, comm_samples=0, passes=1, **TINY)
    with pytest.raises(SpecError, match="other hardware"):
        collect(out, more, progress=False)
    with pytest.raises(SpecError, match="another configuration"):
        collect(out, CollectConfig(samples=2, comm_samples=0, passes=1, seed=5,
                                   **TINY), progress=False, mix_hardware=True)
    c = collect(out, more, progress=False, mix_hardware=True)
    assert c["compute"] == 1       # rows are keyed by the hardware id: sample 0 is done
    assert len(json.loads(mp.read_text())["hardware"]) == 2
    # the CLI: exit 2 and one line naming the fix
    meta = json.loads(mp.read_text())
    meta["hardware"] = meta["hardware"][:1]
    mp.write_text(json.dumps(meta))
    exe = Path(sys.executable).with_name("clusterplan")
    r = subprocess.run([str(exe), "costmodel", "collect", "--out",
                        str(out), "--samples", "1"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "--mix-hardware" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_device_field_keeps_cpu_files_resumable_and_cuda_needs_a_gpu(tmp_path):
    import torch

    from planner.measure.tables.collect import hardware_id
    # the device field is not part of a CPU file's configuration key or hardware id, so data
    # collected before it existed (the shipped cpu-epyc.csv) still resumes
    assert "device" not in CollectConfig().key()
    assert CollectConfig(device="cuda").key()["device"] == "cuda"
    info = {"cpu_model": "x", "cpu_count": 2, "torch": "2.13.0", "fbgemm_gpu": "1.8.0",
            "threads": 1, "backend": "fbgemm"}
    assert hardware_id(info) != hardware_id(dict(info, gpu="NVIDIA H100 80GB HBM3"))
    shipped = json.loads((REPO / "traces" / "costmodel" / "cpu-epyc.csv.meta.json").read_text())
    assert "device" not in shipped["config"]
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal below does not apply")
    out = tmp_path / "d.csv"
    with pytest.raises(SpecError, match="sees no GPU"):
        collect(out, CollectConfig(samples=1, comm_samples=0, passes=1, device="cuda", **TINY),
                progress=False)
    assert not out.exists()                        # nothing half-written
    exe = Path(sys.executable).with_name("clusterplan")
    r = subprocess.run([str(exe), "costmodel", "collect", "--out", str(out), "--samples", "1",
                        "--device", "cuda"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "--device" in r.stderr and "Traceback" not in r.stderr
