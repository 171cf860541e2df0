"""Saving and loading trained cost-model weights: a plain ``state_dict`` (``NAME.pt``, loaded
with ``torch.load(weights_only=True)``) and its metadata (``NAME.json``: architecture, data
collection configuration and hardware, metrics, the data file's sha256 and the command).

:func:`load_predictor` returns a :class:`Predictor`; it warns (``HardwareMismatchWarning``)
when this machine's CPU model, core count, torch / fbgemm_gpu versions or kernel backend differ
from the ones the data was collected on.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import check_input_file, parse_json, read_text

from planner.costmodel.features import FEATURE_NAMES, NUM_FEATURES, table_matrix
from planner.costmodel.model import (
    CommNet,
    ComputeEnsemble,
    ComputeNet,
    additive_members,
    member_overheads,
    predict_compute,
    table_terms,
)
from planner.machine import installed_description, require_torch

__all__ = ["save_weights", "load_predictor", "Predictor", "HardwareMismatchWarning",
           "shipped_weights_path", "FORMAT", "weights_device", "device_kind", "weights_for",
           "WEIGHTS_DIR"]

FORMAT = "clusterplan.costmodel-weights"
CHECKED = ("cpu_model", "cpu_count", "torch", "fbgemm_gpu", "backend")


class HardwareMismatchWarning(UserWarning):
    """The weights were trained on data from other hardware than this machine."""


#: the shipped weights, one ``NAME.pt`` + ``NAME.json`` pair per hardware they were trained on
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

#: CUDA device-name fragments (lower case) and the catalog kind they are
_CUDA_KINDS = (("h200", "h200"), ("h100", "h100-sxm"), ("b200", "b200"),
               ("a100-sxm4-80gb", "a100-80gb"), ("a100 80gb", "a100-80gb"),
               ("a100-sxm4-40gb", "a100-40gb"), ("a100", "a100-40gb"))


def shipped_weights_path() -> Path:
    """The weights shipped for this CPU class (see weights/README in the package)."""
    return WEIGHTS_DIR / "cpu-epyc-2core.pt"


def device_kind(hardware: dict) -> str:
    """The catalog device kind a data collection's kernels ran on: ``cpu``, or the catalog
    kind of its CUDA device name (``NVIDIA H100 80GB HBM3`` → ``h100-sxm``; the name itself
    where the catalog has none)."""
    gpu = str(hardware.get("gpu") or "")
    if not gpu:
        return "cpu"
    low = gpu.lower()
    return next((kind for frag, kind in _CUDA_KINDS if frag in low), gpu)


def weights_device(path: str | Path) -> str:
    """The device kind the weights at ``path`` were trained on (from their ``.json``)."""
    mp = Path(path).with_suffix(".json")
    meta = parse_json(read_text(mp), source=str(mp))
    if not isinstance(meta, dict):
        raise SpecError("expected a JSON object", source=str(mp),
                        fix="pass weights written by `clusterplan costmodel train`")
    hardware = (meta.get("collection", {}).get("hardware") or [{}])[0]
    return device_kind(hardware)


def weights_for(kind: str, directory: Path = WEIGHTS_DIR) -> Path | None:
    """Shipped weights trained on device ``kind`` (a catalog GPU kind or ``cpu``); None when
    none were. Several: the first by file name."""
    for path in sorted(directory.glob("*.pt")):
        if path.with_suffix(".json").exists() and weights_device(path) == kind:
            return path
    return None


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_weights(path, result: dict, *, data_path=None, command: str = "") -> None:
    """Write ``path`` (state dict) and ``path`` with ``.json`` (metadata) from :func:`train`."""
    import torch
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"compute.{k}": v for k, v in result["compute_net"].state_dict().items()}
    ds = result["data"]
    meta = {"format": FORMAT, "version": 1, "features": list(FEATURE_NAMES),
            "architecture": {"compute": {"table_mlp": [NUM_FEATURES, 128, 32],
                                         "out": "additive: per-table exp(32 → 1) + overhead",
                                         "members": len(getattr(result["compute_net"],
                                                                "members", [None])),
                                         "target": "log(ms) of fused forward+backward"}},
            "batch": ds.batch, "collection": ds.meta,
            "metrics": result["metrics"], "command": command,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if data_path is not None:
        meta["data_file"] = Path(data_path).name
        meta["data_sha256"] = _sha256(data_path)
    for key in ("fwd_net", "bwd_net"):
        net = result.get(key)
        if net is not None:
            state.update({f"{key}.{k}": v for k, v in net.state_dict().items()})
            first = net.mlp[0]
            meta["architecture"][key] = {"inputs": first.in_features,
                                         "devices": net.mlp[-1].out_features}
    torch.save(state, path)
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


class Predictor:
    """Cost predictions (ms) from loaded weights.

    ``compute_ms(tables_per_device)`` takes, per device, records ``[rows, dim, pooling,
    bin_0 … bin_16]`` at the collection batch (:attr:`batch`) and returns the predicted fused
    forward+backward time of each device. ``comm_ms(dim_sums, waits_ms)`` returns per-device
    forward and backward all-to-all times when comm nets for that device count were shipped.
    """

    def __init__(self, compute, fwd, bwd, meta: dict) -> None:
        self.compute_net, self.fwd_net, self.bwd_net, self.meta = compute, fwd, bwd, meta
        self.batch = int(meta["batch"])
        self.comm_devices = meta["architecture"].get("bwd_net", {}).get("devices")
        self._memo: dict = {}
        #: additive nets: a device's time is a function of per-table terms, cached per record
        self._members = additive_members(compute)
        self._overheads = None if self._members is None else member_overheads(self._members)
        self._terms: dict = {}
        self._comm_np = None

    def compute_ms(self, tables_per_device: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
        if self._members is not None:
            return self._compute_additive(tables_per_device)
        out = np.zeros(len(tables_per_device))
        todo, mats = [], []
        for i, recs in enumerate(tables_per_device):
            if not recs:
                continue
            key = tuple(sorted(tuple(r) for r in recs))
            if key in self._memo:
                out[i] = self._memo[key]
            else:
                todo.append((i, key))
                mats.append(table_matrix(recs, batch=self.batch))
        if mats:
            pred = predict_compute(self.compute_net, mats)
            for (i, key), p in zip(todo, pred):
                self._memo[key] = float(p)
                out[i] = float(p)
        return out

    @property
    def additive(self) -> bool:
        """Whether a device's time is a function of per-table terms (:meth:`terms`)."""
        return self._members is not None

    def terms(self, rec: Sequence[float]) -> np.ndarray:
        """Per member, the additive term (ms) of one table record (cached); additive nets only.
        A device's time is :meth:`combine` of its tables' summed terms."""
        key = tuple(rec)
        self._fill_terms([key])
        return self._terms[key]

    def combine(self, summed_terms: np.ndarray) -> float:
        """A device's ms from the sum of its tables' :meth:`terms`: the members' log-mean of
        ``Σ terms + overhead``, what the ensemble's forward computes."""
        return float(np.exp(np.log(summed_terms + self._overheads).mean()))

    def _fill_terms(self, keys) -> None:
        """Compute the terms of the records not cached yet, in one batch."""
        todo = sorted({k for k in keys if k not in self._terms})
        if todo:
            terms = table_terms(self._members, table_matrix([list(k) for k in todo],
                                                            batch=self.batch))
            self._terms.update(zip(todo, terms))

    def _compute_additive(self, tables_per_device) -> np.ndarray:
        keys = [sorted(tuple(r) for r in recs) for recs in tables_per_device]
        self._fill_terms([k for ks in keys for k in ks])
        return np.array([self.combine(np.sum([self._terms[k] for k in ks], axis=0))
                         if ks else 0.0 for ks in keys])

    def comm_ms(self, dim_sums: Sequence[float], waits_ms: Sequence[float]):
        if self.fwd_net is None or len(dim_sums) != self.comm_devices:
            return None
        if self._comm_np is None:
            self._comm_np = tuple(_numpy_mlp(net) for net in (self.fwd_net, self.bwd_net))
        fwd, bwd = self._comm_np
        d = np.asarray(dim_sums, dtype=float)
        f = np.exp(_run_mlp(fwd, np.concatenate([d, np.asarray(waits_ms, dtype=float)])))
        b = np.exp(_run_mlp(bwd, d))
        return f, b


def _numpy_mlp(net) -> tuple:
    """A comm net's input scale and (weight, bias) per linear layer, as float64 arrays: the
    search calls it thousands of times on one input, where torch's per-call cost dominates."""
    layers = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy())
              for m in net.mlp if hasattr(m, "weight")]
    return net.scale.detach().double().numpy(), layers


def _run_mlp(mlp, x: np.ndarray) -> np.ndarray:
    scale, layers = mlp
    h = x / scale
    for i, (w, b) in enumerate(layers):
        h = w @ h + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h


def load_predictor(path=None, *, check_hardware: bool = True) -> Predictor:
    """Load weights (default: the shipped ones) with ``torch.load(weights_only=True)``."""
    torch = require_torch("loading cost-model weights")
    path = Path(path) if path is not None else shipped_weights_path()
    mp = path.with_suffix(".json")
    if not path.exists() or not mp.exists():
        raise SpecError(f"cost-model weights or their {mp.name} not found",
                        source=str(path), fix="train some with `clusterplan costmodel train "
                                              "DATA.csv --out FILE.pt`")
    meta = parse_json(read_text(mp), source=str(mp))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise SpecError(f"{mp}: not cost-model weights (format {got!r})",
                        source=str(mp), field="format", fix="pass a file written by "
                                                              "`clusterplan costmodel train`")
    try:
        state = torch.load(check_input_file(path), map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise SpecError(f"not readable cost-model weights ({type(exc).__name__})",
                        source=str(path), fix="pass a file written by `clusterplan costmodel "
                                              "train`") from None

    def part(prefix):
        return {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}

    members = int(meta["architecture"]["compute"].get("members", 1))
    compute = ComputeEnsemble(members) if members > 1 else ComputeNet()
    compute.load_state_dict(part("compute"))
    compute.eval()
    fwd = bwd = None
    arch = meta["architecture"]
    if "fwd_net" in arch:
        d = arch["fwd_net"]["devices"]
        fwd, bwd = CommNet(2 * d, d), CommNet(d, d)
        fwd.load_state_dict(part("fwd_net"))
        bwd.load_state_dict(part("bwd_net"))
        fwd.eval()
        bwd.eval()
    if check_hardware:
        here = installed_description()
        hw = (meta.get("collection", {}).get("hardware") or [{}])[0]
        diff = [f"{k} {hw.get(k)!r} (here {here.get(k)!r})" for k in CHECKED
                if hw.get(k) != here.get(k)]
        if diff:
            warnings.warn(f"cost-model weights {path.name} were trained on other hardware: "
                          + "; ".join(diff) + " — predictions may be off; collect and train "
                          "on this machine", HardwareMismatchWarning, stacklevel=2)
    return Predictor(compute, fwd, bwd, meta)
