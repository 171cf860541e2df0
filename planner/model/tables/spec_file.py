"""Reading an embedding-model spec (:class:`~planner.model.tables.spec.ModelSpec`) from a YAML
file, a CSV of tables, or the name of a built-in example (``criteo-dlrm``, ``mlperf-dcnv2``;
files in ``planner/examples/``).

**CSV** — one row per table. Required columns ``name,num_embeddings,embedding_dim,
pooling_factor``; optional ``precision`` (fp32|fp16|bf16, default fp32), ``zipf_exponent``,
``bin_0 … bin_16`` (the 17 reuse bins, see below) and ``sharding_types`` (allowed types joined
by ``|``, e.g. ``table_wise|row_wise``). Lines starting with ``#`` are comments. The model gets
the defaults below (no dense part). ::

    name,num_embeddings,embedding_dim,pooling_factor
    user_id,40000000,128,1
    item_tags,250000,64,12.5

**YAML** ::

    name: my-dlrm
    batch_size: 65536            # global batch: samples per step over all devices
    optimizer: rowwise_adagrad   # sgd | adam | adagrad | rowwise_adagrad
    comm_precision: fp32         # precision of pooled embeddings in the all-to-alls
    table_defaults: {embedding_dim: 128, precision: fp32}
    dense:
      num_dense_features: 13
      bottom_mlp: [512, 256, 128]
      top_mlp: [1024, 1024, 512, 256, 1]
      interaction: dot           # dot | dcnv2
      dcn_layers: 3              # dcnv2 only
      dcn_projection: 512        # dcnv2 only (low-rank projection dim)
      dtype: fp32                # compute precision of the MLPs
    trainer: {preset: torchrec, dispatch: eager}   # planner/model/tables/trainer.py (also:
                                   # pipeline, mixed_precision, fusion, embedding_output,
                                   # dense_gradients, input_dist; presets: hugectr, dle-tf2 ...)
    a2a_compression: {error_bound: 0.01}   # planner/model/tables/compression.py (optional)
    tables:                      # a list of mappings, or the path of a CSV beside the file
      - {name: t0, num_embeddings: 1000000, pooling_factor: 3.2, zipf_exponent: 1.05}
      - {name: t1, num_embeddings: 5000, embedding_dim: 64, reuse_bins: [0.4, 0.2, ...]}

Per table: ``num_embeddings`` (rows, ≥ 1), ``embedding_dim`` (≥ 1), ``pooling_factor`` (mean ids
per sample, ≥ 0), ``precision``, the access distribution as either ``reuse_bins`` or
``zipf_exponent`` (neither: the dlrm_datasets 2021 aggregate is assumed), and optionally
``sharding_types`` (the types this table may use, like TorchRec's ``ParameterConstraints``).

**Reuse bins**: see :mod:`planner.model.tables.spec`.

Defaults: ``batch_size`` 65,536 (the dlrm_datasets batch), ``optimizer`` sgd, ``precision``
fp32, ``pooling_factor`` 1, ``comm_precision`` fp32. Every error names the file, the field
(``tables[3].embedding_dim``), the table and the fix.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text
from simulator.validation import choice, number, whole

from planner.model.tables.compression import parse_compression
from planner.model.tables.shards import parse_sharding_types
from planner.model.tables.spec import (DEFAULT_BATCH, INTERACTIONS, NUM_REUSE_BINS, OPTIMIZERS,
                                       PRECISION_BYTES, DenseSpec, ModelSpec, TableSpec)
from planner.model.tables.trainer import dlrm_trainer_from_mapping

__all__ = ["load_model_spec", "builtin_spec_names", "tables_from_csv_text"]

REQUIRED_COLUMNS = ("name", "num_embeddings", "embedding_dim", "pooling_factor")
BIN_COLUMNS = tuple(f"bin_{i}" for i in range(NUM_REUSE_BINS))
OPTIONAL_COLUMNS = ("precision", "zipf_exponent", "sharding_types") + BIN_COLUMNS
_TABLE_KEYS = set(REQUIRED_COLUMNS) | {"precision", "zipf_exponent", "sharding_types",
                                       "reuse_bins"}
_TOP_KEYS = {"name", "description", "source", "batch_size", "optimizer", "comm_precision",
             "a2a_compression", "trainer", "table_defaults", "dense", "tables"}
_DENSE_KEYS = {"num_dense_features", "bottom_mlp", "top_mlp", "interaction", "dcn_layers",
               "dcn_projection", "dtype"}


def _examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


def builtin_spec_names() -> list[str]:
    """Names of the specs shipped in ``planner/examples`` (sorted)."""
    d = _examples_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def load_model_spec(ref: str | Path) -> ModelSpec:
    """Load a spec from a built-in name, a YAML file or a CSV of tables.

    Raises
    ------
    SpecError
        Unknown name, missing file, bad syntax, missing columns or a bad value; the message
        names the file, the field, the table and the fix.
    """
    ref = str(ref)
    path = Path(ref)
    if not path.exists():
        if path.suffix.lower() in (".csv", ".yaml", ".yml") or "/" in ref:
            raise SpecError(f"file not found: {ref}", source=ref, fix="check the path")
        names = builtin_spec_names()
        if ref not in names:
            raise SpecError(f"unknown table spec {ref!r}; built-in: {', '.join(names)}",
                            source="TABLES", fix="give a built-in name, a YAML file or a CSV file")
        path = _examples_dir() / f"{ref}.yaml"
        source = f"planner/examples/{ref}.yaml"
    else:
        source = str(path)
    text = read_text(path)
    if path.suffix.lower() == ".csv":
        tables = tables_from_csv_text(text, source=source)
        return ModelSpec(name=path.stem, tables=tables, source=source)
    return _model_from_yaml(text, source=source, base=path.parent)


def _model_from_yaml(text: str, *, source: str, base: Path) -> ModelSpec:
    doc = parse_yaml(text, source=source)
    if not isinstance(doc, dict):
        raise SpecError("the document must be a mapping with a 'tables' field", source=source,
                        fix="see planner/model/tables/spec_file.py for the format")
    for key in doc:
        if key not in _TOP_KEYS:
            raise SpecError(f"unknown field {key!r}", source=source, field=str(key),
                            fix=f"remove it or use one of: {', '.join(sorted(_TOP_KEYS))}")
    name = doc.get("name") or Path(source).stem
    batch = _int(doc.get("batch_size", DEFAULT_BATCH), source, "batch_size", minimum=1,
                 what="the global batch size (samples per step)")
    optimizer = _choice(doc.get("optimizer", "sgd"), OPTIMIZERS, source, "optimizer")
    comm = _choice(doc.get("comm_precision", "fp32"), tuple(PRECISION_BYTES), source,
                   "comm_precision")
    defaults = doc.get("table_defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError("expected a mapping", source=source, field="table_defaults",
                        fix="write table_defaults: {embedding_dim: 128, precision: fp32}")
    for key in defaults:
        if key not in _TABLE_KEYS - {"name", "num_embeddings"}:
            raise SpecError(f"unknown table default {key!r}", source=source,
                            field=f"table_defaults.{key}",
                            fix="use embedding_dim, pooling_factor, precision, zipf_exponent, "
                                "reuse_bins or sharding_types")
    raw_tables = doc.get("tables")
    if raw_tables is None:
        raise SpecError("missing field", source=source, field="tables",
                        fix="add 'tables:' (a list of tables or the path of a CSV)")
    if isinstance(raw_tables, str):
        csv_path = (base / raw_tables) if not Path(raw_tables).is_absolute() else Path(raw_tables)
        if not csv_path.exists():
            raise SpecError(f"table CSV not found: {raw_tables}", source=source, field="tables",
                            fix="give a path relative to the YAML file")
        tables = tables_from_csv_text(read_text(csv_path, field="tables"),
                                      source=str(csv_path), defaults=defaults)
    elif isinstance(raw_tables, list):
        if not raw_tables:
            raise SpecError("no tables", source=source, field="tables",
                            fix="list at least one table")
        tables = []
        for i, row in enumerate(raw_tables):
            if not isinstance(row, dict):
                raise SpecError(f"expected a mapping, got {row!r}", source=source,
                                field=f"tables[{i}]",
                                fix="write each table as {name: ..., num_embeddings: ...}")
            for key in row:
                if key not in _TABLE_KEYS:
                    raise SpecError(f"unknown table field {key!r}", source=source,
                                    field=f"tables[{i}].{key}",
                                    fix=f"use one of: {', '.join(sorted(_TABLE_KEYS))}")
            merged = dict(defaults)
            merged.update(row)
            tables.append(_table(merged, i, source))
        tables = tuple(tables)
        _check_unique(tables, source)
    else:
        raise SpecError(f"expected a list of tables or a CSV path, got {type(raw_tables).__name__}",
                        source=source, field="tables", fix="write a list of tables")
    dense = _dense(doc.get("dense"), source) if doc.get("dense") is not None else None
    comp = parse_compression(doc["a2a_compression"], source=source,
                             table_names={t.name for t in tables}) \
        if doc.get("a2a_compression") is not None else None
    return ModelSpec(name=str(name), tables=tables, dense=dense, batch_size=batch,
                     optimizer=optimizer, comm_precision=comm, source=source,
                     description=str(doc.get("description") or ""),
                     trainer=dlrm_trainer_from_mapping(doc.get("trainer"), source=source),
                     compression=comp)


def tables_from_csv_text(text: str, *, source: str,
                         defaults: Mapping[str, Any] | None = None) -> tuple[TableSpec, ...]:
    """Parse a table CSV (header + one row per table); see the module docstring."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise SpecError("empty CSV: no header and no tables", source=source, field="header",
                        fix="start with the header " + ",".join(REQUIRED_COLUMNS))
    reader = csv.reader(io.StringIO("\n".join(lines)))
    try:
        rows = list(reader)
    except csv.Error as exc:        # a cell past the csv module's 131,072 characters, a NUL
        raise SpecError(f"unreadable CSV at data line {reader.line_num}: "
                        f"{str(exc)[:120]}", source=source, field="tables",
                        fix="keep every cell short and quote commas inside a cell") from None
    header = [h.strip() for h in rows[0]]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise SpecError(f"missing column(s) {', '.join(missing)} in header {','.join(header)!r}",
                        source=source, field="header",
                        fix="the header needs " + ",".join(REQUIRED_COLUMNS)
                            + "; optional: precision, zipf_exponent, bin_0..bin_16, sharding_types")
    unknown = [c for c in header if c not in REQUIRED_COLUMNS and c not in OPTIONAL_COLUMNS]
    if unknown:
        raise SpecError(f"unknown column(s) {', '.join(unknown)}", source=source, field="header",
                        fix="use " + ",".join(REQUIRED_COLUMNS)
                            + " and optionally precision, zipf_exponent, bin_0..bin_16, "
                              "sharding_types")
    if len(set(header)) != len(header):
        raise SpecError("a column appears twice in the header", source=source, field="header",
                        fix="list each column once")
    has_bins = [c for c in BIN_COLUMNS if c in header]
    if has_bins and len(has_bins) != NUM_REUSE_BINS:
        raise SpecError(f"only {len(has_bins)} of the 17 reuse-bin columns", source=source,
                        field="header", fix="give all of bin_0 … bin_16, or none")
    if len(rows) < 2:
        raise SpecError("the CSV has a header but no tables", source=source, field="tables",
                        fix="add one row per table")
    tables = []
    for i, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise SpecError(f"row has {len(row)} values but the header has {len(header)} "
                            f"columns (line {i + 2} of the data)", source=source,
                            field=f"tables[{i}]", fix="give one value per column")
        rec: dict[str, Any] = dict(defaults or {})
        for col, val in zip(header, row):
            val = val.strip()
            if col in BIN_COLUMNS or val == "":
                continue
            rec[col] = val
        if has_bins:
            rec["reuse_bins"] = [row[header.index(c)].strip() for c in BIN_COLUMNS]
        if isinstance(rec.get("sharding_types"), str):
            rec["sharding_types"] = rec["sharding_types"].replace("|", ",").replace(";", ",")
        tables.append(_table(rec, i, source))
    tables = tuple(tables)
    _check_unique(tables, source)
    return tables


# ---------------------------------------------------------------------------------------------
# value checks

def _label(rec: Mapping[str, Any], i: int) -> str:
    name = rec.get("name")
    return f"table {name!r}" if name not in (None, "") else f"table #{i}"


#: the largest values a table may have: 2**40 rows (512 TB at dim 128 fp32), 65,536 columns,
#: 100,000 ids per sample; past them a number is a typo, and its costs overflow to infinity
MAX_ROWS, MAX_DIM, MAX_POOLING = 2**40, 65_536, 1e5


def _int(value: Any, source: str, field: str, *, minimum: int, what: str,
         label: str = "", maximum: int = 2**62) -> int:
    """A whole number of a table spec (CSV cells are text): the shared validation layer."""
    return whole(value, source=source, field=field, minimum=minimum, label=label, lenient=True,
                 what=field.rsplit(".", 1)[-1], maximum=maximum)


def _float(value: Any, source: str, field: str, *, minimum: float, what: str,
           label: str = "", maximum: float | None = None) -> float:
    return number(value, source=source, field=field, minimum=minimum, label=label,
                  lenient=True, what=field.rsplit(".", 1)[-1], maximum=maximum)


def _choice(value: Any, choices: tuple[str, ...], source: str, field: str,
            label: str = "") -> str:
    return choice(value, choices, source=source, field=field, label=label, normalise=True)


def _table(rec: Mapping[str, Any], i: int, source: str) -> TableSpec:
    label = _label(rec, i)
    f = f"tables[{i}]"
    name = rec.get("name")
    if name is None or str(name).strip() == "":
        raise SpecError(f"table #{i} has no name", source=source, field=f"{f}.name",
                        fix="give every table a unique name")
    for key in ("num_embeddings", "embedding_dim"):
        if rec.get(key) in (None, ""):
            raise SpecError(f"{label}: missing {key}", source=source, field=f"{f}.{key}",
                            fix=f"add {key} to {label}"
                                + (" or to table_defaults" if key == "embedding_dim" else ""))
    rows = _int(rec["num_embeddings"], source, f"{f}.num_embeddings", minimum=1,
                what=f"the row count (hash size) of {label}", label=label, maximum=MAX_ROWS)
    dim = _int(rec["embedding_dim"], source, f"{f}.embedding_dim", minimum=1,
               what=f"the embedding width of {label}", label=label, maximum=MAX_DIM)
    pf = _float(rec.get("pooling_factor", 1.0), source, f"{f}.pooling_factor", minimum=0.0,
                what=f"the mean ids per sample of {label}", label=label, maximum=MAX_POOLING)
    precision = _choice(rec.get("precision", "fp32"), tuple(PRECISION_BYTES), source,
                        f"{f}.precision", label)
    zipf = None
    if rec.get("zipf_exponent") not in (None, ""):
        zipf = _float(rec["zipf_exponent"], source, f"{f}.zipf_exponent", minimum=0.0,
                      what=f"the Zipf exponent of {label}", label=label, maximum=100.0)
    bins = None
    if rec.get("reuse_bins") is not None:
        raw = rec["reuse_bins"]
        if not isinstance(raw, (list, tuple)) or len(raw) != NUM_REUSE_BINS:
            raise SpecError(f"{label}: reuse_bins needs {NUM_REUSE_BINS} numbers, got {raw!r}",
                            source=source, field=f"{f}.reuse_bins",
                            fix="give the 17 row-weighted reuse fractions "
                                "(bins (0,1] … (32768,∞))")
        vals = [_float(v, source, f"{f}.reuse_bins[{k}]", minimum=0.0,
                       what="a reuse fraction", label=label) for k, v in enumerate(raw)]
        total = sum(vals)
        if total > 0 and abs(total - 1.0) > 0.02:
            raise SpecError(f"{label}: reuse_bins sum to {total:.4f}, not 1", source=source,
                            field=f"{f}.reuse_bins",
                            fix="give fractions of distinct rows that sum to 1 (or all zeros)")
        bins = tuple(v / total for v in vals) if total > 0 else tuple(vals)
    if bins is not None and zipf is not None:
        raise SpecError(f"{label}: both reuse_bins and zipf_exponent given", source=source,
                        field=f"{f}.zipf_exponent", fix="give one access distribution")
    types = None
    if rec.get("sharding_types") not in (None, ""):
        types = parse_sharding_types(rec["sharding_types"], source=source,
                                     field=f"{f}.sharding_types")
    return TableSpec(name=str(name).strip(), num_embeddings=rows, embedding_dim=dim,
                     pooling_factor=pf, reuse_bins=bins, zipf_exponent=zipf,
                     precision=precision, sharding_types=types)


def _check_unique(tables: Sequence[TableSpec], source: str) -> None:
    seen: dict[str, int] = {}
    for i, t in enumerate(tables):
        if t.name in seen:
            raise SpecError(f"table name {t.name!r} appears twice (tables[{seen[t.name]}] and "
                            f"tables[{i}])", source=source, field=f"tables[{i}].name",
                            fix="give every table a unique name")
        seen[t.name] = i


def _mlp(value: Any, source: str, field: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f"expected a list of layer widths, got {value!r}", source=source,
                        field=field, fix="write e.g. [512, 256, 128]")
    return tuple(_int(v, source, f"{field}[{k}]", minimum=1, what="a layer width")
                 for k, v in enumerate(value))


def _dense(value: Any, source: str) -> DenseSpec:
    if not isinstance(value, dict):
        raise SpecError(f"expected a mapping, got {value!r}", source=source, field="dense",
                        fix="write dense: {bottom_mlp: [...], top_mlp: [...], interaction: dot}")
    for key in value:
        if key not in _DENSE_KEYS:
            raise SpecError(f"unknown field {key!r}", source=source, field=f"dense.{key}",
                            fix=f"use one of: {', '.join(sorted(_DENSE_KEYS))}")
    d = DenseSpec()
    kw: dict[str, Any] = {}
    if "num_dense_features" in value:
        kw["num_dense_features"] = _int(value["num_dense_features"], source,
                                        "dense.num_dense_features", minimum=1,
                                        what="the number of dense features")
    if "bottom_mlp" in value:
        kw["bottom_mlp"] = _mlp(value["bottom_mlp"], source, "dense.bottom_mlp")
    if "top_mlp" in value:
        kw["top_mlp"] = _mlp(value["top_mlp"], source, "dense.top_mlp")
    if "interaction" in value:
        kw["interaction"] = _choice(value["interaction"], INTERACTIONS, source, "dense.interaction")
    if "dcn_layers" in value:
        kw["dcn_layers"] = _int(value["dcn_layers"], source, "dense.dcn_layers", minimum=1,
                                what="the number of cross layers")
    if "dcn_projection" in value:
        kw["dcn_projection"] = _int(value["dcn_projection"], source, "dense.dcn_projection",
                                    minimum=1, what="the low-rank projection width")
    if "dtype" in value:
        kw["dtype"] = _choice(value["dtype"], ("fp32", "tf32", "bf16", "fp16"), source,
                              "dense.dtype")
    return replace(d, **kw)
