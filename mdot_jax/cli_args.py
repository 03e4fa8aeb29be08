"""Argument types and helpers both command modules share: positive numbers with a one-line
error, lists of integers, JSON options, the dataset a flag names, a `--plot` file, a library's
message said with the flags' names."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from mdot_jax.errors import UsageError
from mdot_jax.options import MAX_INT, MAX_TOKENS, STRATEGIES


def _positive(kind, zero: bool = False):
    what = f"{'non-negative' if zero else 'positive'} {'integer' if kind is int else 'number'}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not (math.isfinite(value) and (value > 0 or zero and value == 0)):
            raise argparse.ArgumentTypeError(f"expected a {what}, got {text!r}")
        if kind is int and value > MAX_INT:  # a shape dim, a count: ONNX and numpy use int32
            raise argparse.ArgumentTypeError(f"{text} is too large (at most {MAX_INT})")
        return value
    parse.__name__ = what
    return parse


POSITIVE_INT = _positive(int)


POSITIVE_FLOAT = _positive(float)


def tokens(text: str) -> int:
    """A sequence's length: a positive integer up to `options.MAX_TOKENS`."""
    value = POSITIVE_INT(text)
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"{value:,} tokens: at most {MAX_TOKENS:,} (the "
                                         "conversion holds each position)")
    return value


def port(text: str) -> int:
    """A TCP port to listen on, 1-65535."""
    value = POSITIVE_INT(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 1-65535, got {text!r}")
    return value


NON_NEGATIVE_FLOAT = _positive(float, zero=True)
NON_NEGATIVE_INT = _positive(int, zero=True)


def _integers(zero: bool):
    """An argparse type: comma-separated positive (or, with `zero`, non-negative) integers."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]  # an empty item ("2,,4") is no integer
        except ValueError:
            values = []
        if not values or min(values) < (0 if zero else 1):
            raise argparse.ArgumentTypeError(f"expected comma-separated "
                                             f"{'non-negative' if zero else 'positive'} "
                                             f"integers, got {text!r}")
        return values
    return parse


_int_list = _integers(zero=False)
INDEX_LIST = _integers(zero=True)  # fold numbers, counted from 0


def _json_arg(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"expected a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise UsageError(f"expected a JSON object, got {text!r}")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}


def _config(base, text: str | None):
    """A frozen config dataclass with JSON overrides; an unknown or bad field is a usage error
    naming it, quoted as a JSON key (not a flag of the command)."""
    overrides, known = _json_arg(text), [f.name for f in dataclasses.fields(base)]
    if unknown := sorted(set(overrides) - set(known)):
        raise UsageError(f"{type(base).__name__}: unknown field(s) {unknown}; its fields: "
                         f"{', '.join(map(repr, known))}")
    try:
        return base.replace(**overrides)
    except (TypeError, ValueError) as e:
        said = next((f"{name!r}{str(e)[len(name):]}" for name in known
                     if str(e).startswith(name + " ")), str(e))
        raise UsageError(f"{type(base).__name__}: {said}") from None


def _dataset(path: str, *, empty_ok: bool = False):
    from mdot_jax.data.dataset import load_dataset

    ds = load_dataset(path)  # a DatasetError names the file and line
    if not len(ds) and not empty_ok:
        raise UsageError(f"{path}: the dataset has no samples")
    return ds


# ---------------------------------------------------------------------------- commands
def default_data_dir(name: str) -> str:
    """Datasets built from public tables live outside git, under the user's cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mdot", "datasets", name)


def check_plot_format(path: str) -> None:
    """A `--plot` file of a format matplotlib writes, said before any pricing."""
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in formats:
        said = f"matplotlib writes no .{suffix} files" if suffix else "no suffix to say its format"
        raise UsageError(f"--plot {path}: {said} (it writes {', '.join(sorted(formats))})")


def write_plot(path: str, draw: Callable[[Path], None], json_out: bool) -> None:
    """`draw(path)` under the `--plot` file's claim, then "wrote PATH" (on stderr beside
    JSON, which stdout carries alone)."""
    from mdot_jax import writers

    writers.write_file(path, draw, flag="--plot")
    print(f"wrote {path}", file=sys.stderr if json_out else sys.stdout)


# a request's fields whose flag is not --field-name
FLAGS = {"model": "MODEL", "operators": "--top", "input_shapes": "--input-shape",
         "train_tokens": "--tokens", "deadline_h": "--deadline", "budget_usd": "--budget"}


def as_flags(message: str, field: str) -> str:
    """A library's message as the command line says it: the field it starts with (`field`), and
    the fields named in it (and `strategy` before a strategy's name, `device=NAME`), spelled as
    flags."""
    from mdot_jax.serving.plan import Plan
    from mdot_jax.serving.request import FIELDS

    fields = FIELDS | {f.name for f in dataclasses.fields(Plan)}

    def flag(name: str) -> str:
        return FLAGS.get(name, "--" + name.replace("_", "-"))

    if field and message.startswith(field):
        message = flag(field) + message[len(field):]
    message = re.sub(r"(?<![-\w])([a-z][a-z_]*)=([A-Z]+)\b",  # Python's device=NAME
                     lambda m: f"{flag(m[1])} {m[2]}" if m[1] in fields else m[0], message)
    words = (r"[a-z]+(?:_[a-z]+)+|epochs|tp|pp|cp|ep"  # the single words that mean only the field
             rf"|strategy(?= (?:{'|'.join(STRATEGIES)})\b)")
    return re.sub(rf"(?<![-\w'\".])({words})\b(?!['\"])",
                  lambda m: flag(m[1]) if m[1] in fields else m[1], message)
