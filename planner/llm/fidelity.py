"""Fidelity against published measurements: Narayanan 2021 Table 1, Korthikanti 2022, vTrain.

Every set is data, ``traces/published/*.yaml``: a spec shared by its rows (model, training and
``trainer:`` sections, the fields a user writes), the topology, and per row the published model
sizes, parallel degrees, batch and time. The trainer preset of each set is named there with the
sentence of its source that justifies it, and what a source does not state is listed under
``assumptions:`` and applied to every row of the set alike, never fitted per row. Each row is
parsed by :func:`~planner.model.llm.spec.parse_llm_spec` and simulated by
:func:`~planner.llm.metrics.simulate_llm` exactly as ``clusterplan simulate`` does
(:func:`row_spec_document` and :func:`row_command` give the spec file and the command line).

Cross-node TP (TP16 over 2 nodes) runs NCCL's ring: its tuner rates tree's bandwidth below
ring's, so it does not take the 2-node tree whose flows would beat the NIC line rate
(simulator/collectives ``_tuner_tree_time``); this took the TP16 rows from −26..−32% to
−2..−15%.

The A100 compute profile and host floor are fitted to vTrain's *single-node* runs only
(planner/measure/compute/fit_steps.py; held-out MAPE 7.3%); with them (2026-11-26) the MAPE is
5.2% (Narayanan), 4.2% (Korthikanti) and 7.2% (vTrain multi-node), from 7.3 / 5.5 / 9.4% with
the earlier published-shape prior.

Known gaps (vTrain; tests/llm/test_fidelity.py marks them as strict expected failures):
Kendall's tau is 0.88 (3.6B) and 0.77 (175B) but 0.64 (18.4B) and 0.52 (39.1B). The rows
predicted too fast are TP2/TP4 with PP (39.1B: TP2 −19 to −41%, TP4 up to −23%, while TP1 and
TP8 rows are within ~8%). Ruled out as causes, by the numbers: GEMM size (TP2 and TP8 GEMMs
are both past the efficiency knee, and TP1 rows are accurate), DP volume and placement (the
whole un-overlapped fp16 all-reduce of a TP2 stage is ≤ 0.25 s, the misses 4–10 s), pipeline
sends (DeepSpeed sends 1/tp of the activation; per-GPU bytes relative to compute do not depend
on TP), kernel-launch count (grows with TP, the wrong direction), memory (TP1·PP16 holds more
per GPU than TP2·PP16 and is accurate, while TP2·PP16 measures 31% slower than it). The misses
are also non-monotonic in micro-batch size (39.1B TP4 DP16 PP8: −21, −23, −18, −2, −2% at
mbs 2, 3, 4, 6, 12; TP4 DP8 PP16: −7, −5, −3, −16, −22%), which no smooth cost does.
Also checked: DeepSpeed's step-locked pipeline schedule (TrainSchedule, sends paired with
receives at each step, simulated) gives exactly 1F1B's time, and blocking its sends on the
compute stream costs the same share at every TP (≤ 6% at PP16); the rows' error does not
correlate with an estimate of their memory per GPU (|r| ≤ 0.14 per group); the 175B TP2 rows
(PP32) are within 1%. Per pipeline slot, 39.1B PP16 mbs3 runs at 61% (TP1), 35% (TP2), 52%
(TP4) and 43% (TP8) of peak: TP2 is the outlier, with nothing in it that TP1 and TP4 lack.
Timing each GEMM's backward as the two GEMMs it is (input and weight gradient, each at the
forward's size, 2026-11-24; before, one GEMM of twice the FLOPs) moved every row by < 1%
(tau 0.66 → 0.62 for 18.4B, 0.54 → 0.53 for 39.1B; MAPE 6.9 → 7.0%, 5.9 → 6.0%, 9.3 → 9.6%).
Timing every intra-node TP all-reduce from vTrain's own NCCL tables instead of the fitted ring
(the flow model is 16–24% fast for 2 GPUs at 24–64 MiB, 5–8% slow for 8) moves 18.4B's tau
to 0.695 and 39.1B's to 0.54; not adopted (a table for the folded TP time only would disagree
with the engine's flows for the same collective), and 18.4B's ten rows between 9.6 and 11.0 s
then turn on predicted differences of 0.02–0.05 s, below any model's resolution.

Further mechanisms tested, none adopted (each applies to every row; none lifts a group):
* DeepSpeed pipeline sends: its PipelineEngine partitions the first output tensor over TP
  (``pipe_partitioned``/``grad_partitioned`` default on, receiver all-gathers), as simulated;
  sending the whole activation from every TP rank instead takes tau to 0.62 (18.4B) and 0.51
  (39.1B), MAPE 9.5%: it pushes the accurate TP8·PP8/PP16 rows to +6..+16%. The attention mask
  DeepSpeed also ships per send is 4 MiB (bool s×s), 0.34 ms at 100 Gb/s.
* Tied word-embedding gradient all-reduce (``_exec_reduce_tied_grads``, V·h/tp fp16 between the
  first and last stage, one NIC per GPU): 8 ms (TP8) to 67 ms (TP1) for 39.1B, against misses
  of 4–10 s, and largest for the accurate TP1 rows. Overflow check and gradient norm (fp32
  copies, ~10 B per parameter each, plus MAX/SUM all-reduces over the model-parallel group):
  ≤ 0.05 s, scaling with parameters per GPU, which TP1·PP16, TP2·PP8 and TP8·PP2 share
  (≈ 2.4·10⁹) while their errors are −3%, −18..−40% and −3..−8%.
* Stage imbalance: Megatron-DeepSpeed's ``partition_method="type:transformer"`` puts the
  embedding on the first stage and final norm + logits on the last, as simulated; the layer
  counts divide evenly in every row.
* Memory pressure: a DeepSpeed estimate per GPU (fp16 weights and gradients, fp32 master and
  Adam unsharded or ZeRO-1, checkpointed layer inputs of the in-flight micro-batches plus the
  stage's send buffers, one layer's recompute working set with the b·(a/tp)·s² scores, fp32
  logits) puts slow rows at 11–17 GB (ZeRO-1; TP2 DP16 PP16 mbs2/3, TP4 DP16 PP8 mbs2/3) and
  accurate rows up to 60–71 GB (TP8 PP8/PP16 mbs24, −0.2%/+2.2%); without ZeRO the accurate
  TP1·PP16 row needs 55 GB. No threshold separates them (rows above 40 GB are accurate, so
  the cards are most likely 80 GB).
* NICs: 4 × 200 Gb/s instead of 8 × 100 Gb/s per node (same 800 Gb/s): tau 0.66 / 0.53.
  DP reduction and pipeline sends never share a NIC here: DeepSpeed reduces after a stage's
  last backward, and every stage spans whole nodes.
What the data ask for: setting every TP2 row to measured × (1 + the group's median error)
gives 39.1B 0.71, every TP4 row 0.69, both 0.89; 18.4B needs its three TP4·DP32·PP2 rows (0.83).
Yet 175B's TP2/TP4 rows are within 5.3%, and 39.1B TP4·DP8·PP16 is within 7% at mbs 2–4 but
−16/−22% at mbs 6/12 while TP4·DP16·PP8 is the reverse (−21/−23/−18%, then −2/−2%), so no
TP-dependent cost fits. The 3.6B set has similar single-row jumps (TP8 mbs64 9.84 s vs mbs32
4.97 s; TP8 mbs2 8.88 s vs mbs4 5.62 s), although the one repeated configuration (175B TP4 DP4
PP32 mbs2) repeats within 0.05%.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.errors import SpecError
from simulator.fileio import read_spec_mapping
from simulator.topology import load_topology

from planner.llm.metrics import simulate_llm
from planner.model.llm.spec import parse_llm_spec

__all__ = ["PUBLISHED", "VTRAIN_DIR", "load_set", "narayanan_rows", "korthikanti_rows", "vtrain_rows",
           "vtrain_single_rows", "narayanan_flops", "row_spec_document", "row_command", "set_info",
           "run_set", "kendall_tau_by_group"]

#: the published sets, one YAML file each
PUBLISHED = Path(__file__).resolve().parents[2] / "traces" / "published"
#: vTrain's CSVs: ``shared/data/vtrain`` beside the repository
VTRAIN_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "vtrain"
SETS = {"narayanan": "narayanan-2021.yaml", "korthikanti": "korthikanti-2022.yaml",
        "vtrain": "vtrain-multi.yaml", "vtrain-single": "vtrain-single.yaml"}


def narayanan_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """Narayanan's FLOPs of one iteration (recompute-inclusive), his Table 1 convention."""
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def _merge(a: dict, b: dict) -> dict:
    """``b`` laid over ``a``, section by section."""
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _row(meta: dict, base: dict, fields: dict, *, name: str, group: str, measured_s: float,
         source: str, extra: dict | None = None) -> dict:
    """One row: its spec document (``base`` + the row's sizes, degrees and batch), parsed as a
    user's spec is, and its topology from the set's template."""
    gpus = int(fields["gpus"])
    doc = _merge(base, {
        "model": {"name": f"{meta['set']}-{name}".replace(" ", "-"),
                  "layers": fields["layers"], "hidden_size": fields["hidden_size"],
                  "num_heads": fields["num_heads"],
                  "ffn_hidden_size": fields.get("ffn_hidden_size",
                                                meta.get("ffn_multiple", 4) * fields["hidden_size"]),
                  **({"seq_len": fields["seq_len"]} if "seq_len" in fields else {})},
        "training": {"global_batch_size": fields["global_batch_size"],
                     **({"micro_batch_size": fields["micro_batch_size"]}
                        if "micro_batch_size" in fields else {})},
        "parallel": {"tp": fields["tp"], "pp": fields["pp"], "vpp": fields.get("vpp", 1),
                     "dp": gpus // (fields["tp"] * fields["pp"])}})
    doc = _merge(doc, extra or {})
    spec = parse_llm_spec(doc, source=source)
    return {"set": meta["set"], "group": group, "row": name, "spec": spec,
            "parallel": spec.parallel, "document": doc,
            "topology": meta["topology"].format(nodes=max(1, gpus // 8), gpus=gpus),
            "measured_s": measured_s}


def _read(name_or_path: str | Path) -> tuple[dict, str]:
    path = Path(name_or_path)
    if not path.suffix:
        if name_or_path not in SETS:
            raise SpecError(f"unknown published set {name_or_path!r}", field="--set",
                            fix=f"use one of: {', '.join(SETS)}")
        path = PUBLISHED / SETS[str(name_or_path)]
    doc, source = read_spec_mapping(path, package="traces", what="published set",
                                    fix="see traces/published/README.md")
    if Path(source).resolve().parent == PUBLISHED:
        source = f"traces/published/{Path(source).name}"
    return doc, source


def set_info(name_or_path: str | Path) -> dict:
    """A set's title, trainer preset with its justification, and assumptions (for reports)."""
    meta, source = _read(name_or_path)
    return {"source": source, "title": meta.get("title", ""), "trainer": meta.get("trainer", {}),
            "assumptions": meta.get("assumptions", []), "measured": meta.get("measured", "")}


def load_set(name_or_path: str | Path, *, vtrain_dir: str | Path | None = None,
             every: int = 1) -> list[dict]:
    """The rows of a published set (a name in :data:`SETS` or a YAML path); CSV-backed sets
    read their CSV from ``vtrain_dir``, every ``every``-th row."""
    meta, source = _read(name_or_path)
    base = meta["spec"]
    if "csv" in meta:
        return _csv_rows(meta, base, source, vtrain_dir, every)
    rows = []
    for i, f in enumerate(meta["rows"]):
        src = f"{source} rows[{i}]"
        if "tflops_per_gpu" in f:       # Narayanan: time from his FLOP count and TFLOP/s
            flops = narayanan_flops(f["global_batch_size"], base["model"]["seq_len"],
                                    f["layers"], f["hidden_size"], base["model"]["vocab_size"])
            rows.append(_row(meta, base, f, name=f["row"], group="all", source=src,
                             measured_s=flops / (f["gpus"] * f["tflops_per_gpu"] * 1e12)))
            continue
        for mode, seconds in f["seconds"].items():
            rows.append(_row(meta, base, f, name=f"{f['row']} {mode}", group="all", source=src,
                             measured_s=float(seconds), extra=meta["modes"][mode]))
    return rows


def _csv_rows(meta: dict, base: dict, source: str, vtrain_dir, every: int) -> list[dict]:
    """Rows of a vTrain CSV (columns: shared/reference/validation-data.md §4)."""
    path = Path(vtrain_dir or PUBLISHED) / meta["csv"]
    if not path.exists():
        raise SpecError("vTrain data not found", source=str(path),
                        fix="pass --vtrain-dir pointing at shared/data/vtrain")
    df = pd.read_csv(path, encoding="utf-8-sig").iloc[::every]
    rows = []
    for i, r in df.iterrows():
        f = {"layers": int(r["# layers"]), "hidden_size": int(r["hidden size"]),
             "num_heads": int(r["attention heads"]), "seq_len": int(r["sequence length"]),
             "tp": int(r["tensor parallelism"]), "pp": int(r["pipeline parallelism"]),
             "gpus": int(r["# GPUs"]), "global_batch_size": int(r["global batch"]),
             "micro_batch_size": int(r["micro batch"])}
        dp = f["gpus"] // (f["tp"] * f["pp"])
        params = r.get("Parameters (billion)")
        name = (f"tp{f['tp']} dp{dp} pp{f['pp']} mbs{f['micro_batch_size']}" if params is not None
                else f"h{f['hidden_size']} l{f['layers']} tp{f['tp']} dp{dp} pp{f['pp']} "
                     f"mbs{f['micro_batch_size']} gb{f['global_batch_size']}")
        group = meta["group"].format(params=params, gpus=f["gpus"])
        rows.append(_row(meta, base, f, name=name, group=group, source=f"{path} row {i}",
                         measured_s=float(r["iteration time (ms)"]) / 1e3))
    return rows


def narayanan_rows() -> list[dict]:
    return load_set("narayanan")


def korthikanti_rows() -> list[dict]:
    return load_set("korthikanti")


def vtrain_rows(path: str | Path) -> list[dict]:
    """vTrain's multi-node rows from ``path`` (its ground_truth_multi.csv)."""
    return load_set("vtrain", vtrain_dir=Path(path).parent)


def vtrain_single_rows(path: str | Path, *, every: int = 1) -> list[dict]:
    """vTrain's single-node runs (2, 4 or 8 A100s; hidden 1,024/2,048, 12–24 layers, s = 1,024):
    every ``every``-th of the 1,440 rows (all by default, about 25 s). Small blocks: the set
    that exercises the host floor (planner/model/llm/host.py)."""
    return load_set("vtrain-single", vtrain_dir=Path(path).parent, every=every)


def row_spec_document(row: dict) -> dict:
    """The spec file of a row (YAML-ready), with ``description`` naming its source."""
    return {"description": f"{row['set']} {row['row']} ({row['spec'].source})",
            **row["document"]}


def row_command(row: dict, spec_path: str) -> str:
    """The ``clusterplan simulate`` command line that reproduces a row from its spec file."""
    return f"clusterplan simulate {spec_path} --topology {row['topology']}"


def run_set(rows: list[dict], *, progress=None) -> pd.DataFrame:
    """Simulate every row; columns set, group, row, measured_s, predicted_s, error."""
    out = []
    topo_cache: dict[str, object] = {}
    for k, r in enumerate(rows):
        topo = topo_cache.setdefault(r["topology"], load_topology(r["topology"]))
        res = simulate_llm(r["spec"], r["parallel"], topo,
                           schedule_name="interleaved" if r["parallel"].vpp > 1 else "1f1b")
        pred = res.step_time_s
        out.append({"set": r["set"], "group": r["group"], "row": r["row"],
                    "measured_s": r["measured_s"], "predicted_s": pred,
                    "error": pred / r["measured_s"] - 1, "mfu": res.to_dict()["mfu_megatron"]})
        if progress:
            progress(k + 1, len(rows))
    return pd.DataFrame(out)


def kendall_tau_by_group(df: pd.DataFrame) -> dict[str, float]:
    """Kendall's tau between measured and predicted step times, per group of more than two
    rows (scipy.stats is imported here: it costs every `simulate` ~0.4 s otherwise)."""
    from scipy.stats import kendalltau

    return {g: float(kendalltau(d.measured_s, d.predicted_s).statistic)
            for g, d in df.groupby("group") if len(d) > 2}
