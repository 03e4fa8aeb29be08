"""Errors the CLI prints as one line (kept free of JAX so `mdot convert` starts fast).

Every expected failure raises an `MdotError` (or, below the front door, the converters'
`ConversionError`, which `predict` and `plan` raise as `serving.model_source.ModelError`, both)
with a one-line message naming the file, line, flag or node; anything else is a bug and may
show a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class MdotError(ValueError):
    """An expected failure: bad input, named in one line."""


class CheckpointError(MdotError):
    """A missing, corrupt or incompatible checkpoint."""


class UsageError(MdotError):
    """Bad command-line input."""


class DatasetError(MdotError):
    """A dataset directory that cannot be used as it is (`mdot dataset check` lists why)."""


class RequestError(MdotError):
    """A request with a field that cannot be honoured: the message starts with the field's
    name (`field`), which the CLI spells as its flag."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


def not_a_field(name: str, fields: Sequence[str]) -> RequestError:
    """`name` asked of a request that has no such field: the nearest one, and every one."""
    near = difflib.get_close_matches(str(name), fields, 1, 0.6)
    return RequestError(f"{name}: not a field" + (f"; did you mean {near[0]}?" if near else "")
                        + f" (the fields: {', '.join(fields)})", str(name))


def fields_named(cls: type[T]) -> type[T]:
    """A dataclass whose constructor refuses a keyword it has no field of (`seq_length=`) as
    a `RequestError` naming the field meant, not Python's TypeError past `except MdotError`."""
    init, names = cls.__init__, [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(init)
    def checked(self, *args, **kwargs) -> None:
        if unknown := [k for k in kwargs if k not in names]:
            raise not_a_field(unknown[0], names)
        init(self, *args, **kwargs)
    cls.__init__ = checked
    return cls
