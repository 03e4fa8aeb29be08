"""The request types' JSON schema (`serving.schema`): each field typed from its annotation,
described by the docstring entry that heads with it."""

import dataclasses
from collections.abc import Mapping, Sequence

import pytest

from mdot_jax.serving import schema
from mdot_jax.serving.plan_request import Plan
from mdot_jax.serving.prediction import DERIVED, Prediction
from mdot_jax.serving.request import TrainingJob


@pytest.mark.parametrize("cls", [TrainingJob, Plan, Prediction])
def test_every_field_is_described_and_every_entry_heads_with_fields(cls):
    said = schema.descriptions(cls)
    assert set(said) == {f.name for f in dataclasses.fields(cls)}  # none missing, no stray head
    assert all(len(text) > 10 for text in said.values())


def test_a_field_several_entries_head_gets_each_text():
    @dataclasses.dataclass
    class Job:
        """A job.

        Attributes:
          a, b: shared
            over two lines.
          b: its own.
        """

        a: int
        b: str | None = None

    assert schema.descriptions(Job) == {"a": "shared over two lines.",
                                        "b": "shared over two lines. its own."}
    got = schema.field_schemas(Job, {"b": ("x", "y")}, skip=0)
    assert got["a"] == {"type": "integer", "description": "shared over two lines."}
    assert got["b"]["anyOf"] == [{"type": "string", "enum": ["x", "y"]}, {"type": "null"}]
    assert got["b"]["default"] is None


@pytest.mark.parametrize("hint, expected", [
    (bool, {"type": "boolean"}),
    (float | None, {"anyOf": [{"type": "number"}, {"type": "null"}]}),
    (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
    (Sequence[str], {"type": "array", "items": {"type": "string"}}),
    (Mapping[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
    (bytes, {}),  # not JSON's: the Python API's alone
    (str | bytes, {"type": "string"}),
])
def test_json_types_of_annotations(hint, expected):
    assert schema.json_type(hint) == expected


def test_an_answers_schema_has_every_key_its_json_has_typed_and_described():
    said = schema.answer_schema(Prediction, DERIVED)["properties"]
    p = Prediction(iteration_ms=1.0, device="x", num_ops=1, tokens=8, mfu=0.5, job_s=2.0,
                   interval_ms=(0.5, 2.0), operators=[], job_interval_s=(1.0, 3.0))
    fields = {f.name for f in dataclasses.fields(Prediction)}
    assert set(p.to_json()) <= set(said) == fields | set(DERIVED)  # keys left out where null
    assert all(v["description"] for v in said.values())
    assert said["memory_tight"]["type"] == "boolean"
    assert said["tokens_per_s"]["anyOf"] == [{"type": "number"}, {"type": "null"}]
    assert said["interval_ms"]["anyOf"][0] == {"type": "array", "items": {"type": "number"}}
