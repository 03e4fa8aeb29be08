"""A measurements CSV of `mdot adapt --from-measurements` (its columns: `serving.adaptation`'s
docstring), read and checked row by row: a bad cell, a repeat far from its twin, a row in
another unit, each named by its line."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mdot_jax.errors import UsageError
from mdot_jax.options import ATTENTION, LAYOUTS, PRECISIONS, SPEC_SHEET_OPTIMIZERS
from mdot_jax.serving import named_models
from mdot_jax.serving.request import FIELDS

REQUIRED = ("model", "batch_size", "ms")
REPEATS_APART = 2.0  # one job's measured times further apart than this: not the same setting
UNITS_APART = 100.0  # rows this many times the base's prices (median): not milliseconds
FLAG = ("true", "false")
# optional: how a GPU's rows ran (a flag's column: true or false)
JOB_COLUMNS = {"optimizer": SPEC_SHEET_OPTIMIZERS, "attention": ATTENTION, "compile": FLAG,
               "layout": LAYOUTS}


@dataclass(frozen=True)
class Row:
    model: Path
    batch_size: int
    image_size: int | None
    seq_len: int | None
    precision: str
    ms: float
    job: tuple[tuple[str, str], ...] = ()  # JOB_COLUMNS given, as (field, value)

    @property
    def workload(self) -> tuple:
        return self.model, self.batch_size, self.image_size, self.seq_len, self.job


def _positive(text: str, kind, where: str, column: str):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not np.isfinite(value) or value <= 0:
        said = f"is {text!r}" if text else "is empty"
        raise UsageError(f"{where}: column '{column}' {said}, not a positive number")
    return value


def _model(csv_path: Path, cell: str, where: str) -> Path:
    """A row's model: a file beside the CSV (ONNX, `.npz`, config.json), or a name of
    `mdot models` (its config.json)."""
    name = cell.strip()
    if name and (model := csv_path.parent / name).is_file():
        return model
    if (found := named_models.find(name)) is not None:
        return found.config
    raise UsageError(f"{where}: model {cell!r}: no such file beside {csv_path.name}, nor a "
                     "name of `mdot models`")


def read_measurements(path: str | Path) -> list[Row]:
    """The rows of a measurements CSV, each checked (a bad one is named by its line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark too
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text (UTF-8) CSV file") from None
    first = text.split("\n", 1)[0]
    # a European spreadsheet's semicolons, a tab-separated export's tabs, else commas
    delimiter = next((d for d in ";\t" if d in first and "," not in first), ",")
    reader = csv.DictReader(text.splitlines(), delimiter=delimiter)
    reader.fieldnames = [c.strip().lower() for c in reader.fieldnames or []]  # "MS ", "ms"
    lines = list(reader)
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise UsageError(f"{path}: missing column(s) {missing} in the header "
                         f"{reader.fieldnames or '(none)'}; needs {list(REQUIRED)} and "
                         "image_size or seq_len, precision (optional)")
    if not lines:
        raise UsageError(f"{path}: a header and no rows; give one row per measured job")
    read = {*REQUIRED, "image_size", "seq_len", "precision", *JOB_COLUMNS}
    # a column naming a job's field that this does not read would be ignored silently (notes
    # and dates are)
    unread = [c for c in reader.fieldnames or [] if c in FIELDS and c not in read]
    if unread:
        hint = ("; the device is no column: --device-name names it (with --base gpu-spec-sheet "
                "for a GPU of `mdot devices`)" if "device" in unread else "")
        raise UsageError(f"{path}: column(s) {unread} are not read (the columns: "
                         f"{sorted(read)}){hint}")
    for n, d in enumerate(lines, 2):
        if None in d:  # more cells than the header: a decimal comma ("20,1") or a stray one
            raise UsageError(f"{path} line {n}: {len(reader.fieldnames) + len(d[None])} cells, "
                             f"the header has {len(reader.fieldnames)}"
                             + (" (a decimal comma? write 20.1, not 20,1)"
                                if delimiter == "," else ""))
        d["precision"] = (d.get("precision") or "").strip().lower()
    precisions = sorted({d["precision"] for d in lines} - {""})
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or len(precisions) > 1:
        raise UsageError(f"{path}: column 'precision' has {precisions}; one of "
                         f"{list(PRECISIONS)} for every row (the fit absorbs one precision; "
                         "adapt each precision apart)")
    rows = []
    for n, d in enumerate(lines, 2):
        where = f"{path} line {n}"
        model = _model(path, d.get("model") or "", where)
        sizes = {c: _positive(d[c], int, where, c) if d.get(c) else None
                 for c in ("image_size", "seq_len")}
        job = tuple((c, d[c].strip().lower()) for c in JOB_COLUMNS if d.get(c))
        for c, v in job:
            if v not in JOB_COLUMNS[c]:
                raise UsageError(f"{where}: column {c!r} is {v!r}; one of {list(JOB_COLUMNS[c])}")
        rows.append(Row(model, _positive(d["batch_size"], int, where, "batch_size"),
                        sizes["image_size"], sizes["seq_len"], d.get("precision") or "",
                        _positive(d["ms"], float, where, "ms"), job))
    seen_at: dict[tuple, int] = {}
    for n, r in enumerate(rows):  # one job measured twice: repeats agree to their noise
        m = seen_at.setdefault(r.workload, n)
        low, high = sorted((rows[m].ms, r.ms))
        if high > REPEATS_APART * low:
            raise UsageError(f"{path} lines {m + 2} and {n + 2}: the same job measured "
                             f"{rows[m].ms:g} and {r.ms:g} ms ({high / low:.1f}x apart): one "
                             "is of another device or setting; correct or drop it")
    return rows


def check_units(pred: list[float], rows: list[Row], measurements: str | Path, base: str):
    """Refuses seconds or microseconds: a median row `UNITS_APART` times its price, either way;
    then one row `UNITS_APART` times off the median row's ratio to the price."""
    ratios = np.asarray([r.ms for r in rows]) / np.asarray(pred)
    ratio = float(np.exp(np.median(np.log(ratios))))
    if not 1 / UNITS_APART < ratio < UNITS_APART:
        raise UsageError(f"{measurements}: column 'ms' measures {ratio:.3g}x what {base} "
                         "predicts for the same jobs (the median row): milliseconds expected; "
                         "seconds are 1000x fewer, microseconds 1000x more")
    for n, r in enumerate(rows):
        if not 1 / UNITS_APART < ratios[n] / ratio < UNITS_APART:
            raise UsageError(f"{measurements} line {n + 2}: column 'ms' is {r.ms:g}, "
                             f"{ratios[n] / ratio:.3g}x what the other rows measure against "
                             f"{base}'s price (their median): another unit or device; correct "
                             "or drop it")
