"""The JSON schema of a request's fields (`request.TrainingJob`, `plan_request.Plan`) and of
an answer (`prediction.Prediction`), for the service's OpenAPI page: each field's JSON type
read from its annotation, its values (a `CHOICES` registry), its default, and its description
from the class docstring's `Attributes:` section, where each entry heads with the fields it
describes (`tp, pp: ...`; a field several entries head gets each of their texts); an answer's
keys beyond its fields are properties', described by their docstrings."""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def descriptions(cls: type) -> dict[str, str]:
    """Field -> its text in `cls`'s docstring's `Attributes:` section (module docs)."""
    doc = inspect.cleandoc(cls.__doc__ or "").partition("Attributes:\n")[2]
    indent = doc[:len(doc) - len(doc.lstrip(" "))]  # an entry's; its text's lines deeper
    heads = list(re.finditer(rf"^{indent}(\w+(?:, \w+)*): ", doc, re.M))
    out: dict[str, str] = {}
    for head, after in zip(heads, [*heads[1:], None]):
        text = " ".join(doc[head.end():after.start() if after else len(doc)].split())
        for name in head.group(1).split(", "):
            out[name] = f"{out[name]} {text}" if name in out else text
    return out


def json_type(hint: Any) -> dict:
    """The JSON schema of values of a Python type annotation; {} where JSON has none of it
    (a path, bytes, a ModelProto: the Python API's alone)."""
    if hint is type(None):
        return {"type": "null"}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [k for k in map(json_type, args) if k]
        return {"anyOf": kinds} if len(kinds) > 1 else (kinds[0] if kinds else {})
    if origin in (tuple, list, Sequence):
        return {"type": "array", "items": json_type(args[0]) if args else {}}
    if hint is Mapping or origin is Mapping:
        return {"type": "object", **({"additionalProperties": json_type(args[1])} if args
                                     else {})}
    return {}


def _valued(schema: dict, values: Sequence[str]) -> dict:
    """`schema` with its strings (a list's too) held to `values`."""
    if schema.get("type") == "string":
        return dict(schema, enum=list(values))
    if "items" in schema:
        return dict(schema, items=_valued(schema["items"], values))
    if "anyOf" in schema:
        return dict(schema, anyOf=[_valued(k, values) for k in schema["anyOf"]])
    return schema


def field_schemas(cls: type, choices: Mapping[str, Sequence[str]], skip: int = 1,
                  defaults: bool = True) -> dict[str, dict]:
    """Field -> its JSON schema (module docs), for every field of the dataclass `cls` but its
    first `skip` (the model, the job); `defaults`: a request's (an answer has none)."""
    hints, said = typing.get_type_hints(cls), descriptions(cls)
    out = {}
    for f in dataclasses.fields(cls)[skip:]:
        schema = json_type(hints[f.name])
        if f.name in choices:
            schema = _valued(schema, choices[f.name])
        if defaults and f.default is not dataclasses.MISSING:
            schema["default"] = list(f.default) if isinstance(f.default, tuple) else f.default
        out[f.name] = dict(schema, description=said.get(f.name, ""))
    return out


def answer_schema(cls: type, derived: Mapping[str, str]) -> dict:
    """The JSON object `cls.to_json` writes: its fields and its `derived` keys, each the
    value of a property of `cls` (key -> the property's name), typed from what it returns."""
    props = field_schemas(cls, {}, skip=0, defaults=False)
    for key, name in derived.items():
        got = getattr(cls, name)
        props[key] = dict(json_type(typing.get_type_hints(got.fget).get("return")),
                          description=" ".join((inspect.getdoc(got) or "").split()))
    return {"type": "object", "properties": props}
