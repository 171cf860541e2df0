"""The cost-model data file: one CSV row per measured sample (columns :data:`COLUMNS`) and its
metadata beside it (``FILE.meta.json``). Written by ``clusterplan costmodel collect``
(:mod:`planner.measure.tables.collect`), read to train (:mod:`planner.costmodel.dataset`)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from simulator.errors import SpecError
from simulator.fileio import read_text

COLUMNS = ("kind", "sample_id", "round", "hw", "n_tables", "tables", "fwd_ms", "bwd_ms",
           "total_ms", "total_min_ms", "dim_sums", "sleeps_ms", "comm_fwd_ms", "comm_bwd_ms")


def meta_path(data: str | Path) -> Path:
    return Path(str(data) + ".meta.json")


def read_data(path: str | Path) -> list[dict]:
    """Rows of a data file as dicts (strings; see :data:`COLUMNS`)."""
    p = Path(path)
    text = read_text(p, missing_fix="collect one with `clusterplan costmodel collect --out FILE`")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise SpecError(f"cannot read the data file: {str(exc)[:120]}", source=str(p),
                        fix="pass a file written by `clusterplan costmodel collect`") from None
    if rows and set(COLUMNS) - set(rows[0]):
        raise SpecError(f"not a costmodel data file (missing columns "
                        f"{sorted(set(COLUMNS) - set(rows[0]))})", source=str(p),
                        fix="pass a file written by `clusterplan costmodel collect`")
    return rows
