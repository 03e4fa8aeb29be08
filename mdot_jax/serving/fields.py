"""The checks each field of a request gets (`request.TrainingJob`, `plan.Plan`): a bad value is
a `RequestError` naming the field; NumPy's numbers and None (JSON's null) made plain first."""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from typing import Any

from mdot_jax.errors import RequestError
from mdot_jax.options import CHOICE_HINTS, MAX_INT


def short(value: Any) -> str:
    """`value`'s repr, or its type's name where that is long (a module, an array)."""
    text = repr(value)
    return text if len(text) <= 60 else f"(a {type(value).__name__})"


def plain(value: Any) -> Any:
    """NumPy's numbers and 1-D arrays (a scheduler's arithmetic) as Python's ints, floats and
    tuples, inside lists, tuples and mappings too; anything else as it is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        return float(value)
    if getattr(value, "ndim", None) == 1 and hasattr(value, "tolist"):
        return tuple(value.tolist())
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


def plain_fields(request: Any, skip: int = 1) -> None:
    """Every field of a frozen dataclass request but its first `skip` (the model, the job)
    made `plain`, in place; None (JSON's null) where the field has a default: the default."""
    for f in fields(request)[skip:]:
        value = getattr(request, f.name)
        default = None if value is not None or f.default is MISSING else f.default
        object.__setattr__(request, f.name, plain(value if default is None else default))


def positive_ints(name: str, value: Any, limit: float = MAX_INT, why: str = "") -> tuple[int, ...]:
    """A positive int up to `limit` (`why`: its reason), or a non-empty sequence of them, as a
    tuple."""
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    field = name.split("[")[0]
    if not values:
        raise RequestError(f"{name}: empty; give at least one value", field)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise RequestError(f"{name} {v!r}: expected a positive integer", field)
        if v > limit:
            raise RequestError(f"{name} {v:,}: more than {limit:,}{why}", field)
    return values


def distinct(name: str, values: tuple[int, ...]) -> tuple[int, ...]:
    """`values`, refused where one is listed twice (each would be priced twice)."""
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise RequestError(f"{name} {list(values)}: {twice[0]} is listed twice", name)
    return values


def positive_int(name: str, value: Any, *limits: Any) -> int:
    """One positive int (`positive_ints`' limits): a list where one is meant is refused by name."""
    if isinstance(value, (list, tuple)):  # `positive_ints` would read it as several
        raise RequestError(f"{name} {list(value)}: expected one positive integer", name)
    return positive_ints(name, value, *limits)[0]


def whole_count(name: str, value: Any) -> int:
    """A positive whole number of any size: an int, or a float that is one (JSON's 1e12)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return positive_ints(name, value, limit=math.inf)[0]


def positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise RequestError(f"{name} {value!r}: expected a positive number", name.split("[")[0])


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise RequestError(f"{name} {value!r}: true or false", name)


def choice(name: str, value: Any, choices: Sequence[str], optional: bool = True) -> None:
    if (value is None and optional) or (isinstance(value, str) and value in choices):
        return
    hint = CHOICE_HINTS.get((name, value), "") if isinstance(value, str) else ""
    if isinstance(value, str) and not hint and \
            (near := difflib.get_close_matches(value.lower(), choices, n=1)):
        hint = f"; did you mean {near[0]!r}?"  # 'Adam', 'AMP-BF16', 'fsd'
    raise RequestError(f"{name} {value!r}: choose from {list(choices)}{hint}", name)
