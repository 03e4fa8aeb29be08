"""Property-based: whatever bytes, rows or flags a careless user gives, the readers and the
CLI answer with a result or one error naming the problem, never a traceback."""

import contextlib
import dataclasses
import io
import json

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_builders import conv_bn_relu

from converters import ConversionError
from mdot_jax import TrainingJob, predict
from mdot_jax.cli import main
from mdot_jax.data.dataset import load_dataset
from mdot_jax.data.store import check_dataset
from mdot_jax.errors import MdotError, RequestError
from mdot_jax.gpu.catalog import GPU, find
from mdot_jax.serving.measurements import read_measurements
from mdot_jax.serving.plan import Plan, plan
from mdot_jax.serving.request import FIELDS

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                        max_size=3),
                    max_leaves=6)
SAMPLE = dict(key="a/b2", arch="a", seq="seqs/a.npz", label_ms=1.5,
              workload=dict(batch_size=2, input_size=32), stats={}, meta={})


def _line(field, value) -> str:
    return json.dumps({**SAMPLE, field: value} if field else value)


LINES = st.lists(st.one_of(
    st.builds(_line, st.sampled_from([None, *SAMPLE]), JSON),  # a sample with one field off
    st.text(max_size=30)), max_size=5)


def _one_line(error: Exception) -> None:
    assert str(error) and "\n" not in str(error), repr(error)


@SETTINGS
@given(LINES, st.binary(max_size=40))
def test_any_samples_file_loads_or_is_one_named_error(tmp_path_factory, lines, tail):
    root = tmp_path_factory.mktemp("ds")
    (root / "samples.jsonl").write_bytes("\n".join(lines).encode() + b"\n" + tail)
    try:
        load_dataset(root)
    except MdotError as e:
        _one_line(e)
    report = check_dataset(root)  # lists what is wrong, never raises
    assert all(p["line"] >= 1 and p["reason"] for p in report["problems"])


CELLS = st.one_of(st.text(max_size=8), st.sampled_from(["2", "-1", "0", "nan", "1e999", "fp32",
                                                        "m.npz", "../m.npz", ""]))


@SETTINGS
@given(st.lists(st.sampled_from(["model", "batch_size", "image_size", "seq_len", "precision",
                                 "ms", "extra"]), min_size=1, max_size=7, unique=True),
       st.lists(st.lists(CELLS, max_size=8), max_size=4), st.sampled_from([",", ";"]))
def test_any_measurements_csv_reads_or_is_one_named_error(tmp_path_factory, header, rows, sep):
    path = tmp_path_factory.mktemp("csv") / "mine.csv"
    path.write_text("\n".join(sep.join(r) for r in [header, *rows]) + "\n", encoding="utf-8")
    try:
        read_measurements(path)
    except MdotError as e:
        _one_line(e)


def _mutations():
    good = conv_bn_relu().SerializeToString()
    return st.one_of(st.binary(max_size=200), st.builds(
        lambda at, byte: good[:at % len(good)] + bytes([byte]) + good[at % len(good) + 1:],
        st.integers(0, 10 ** 6), st.integers(0, 255)),
        st.builds(lambda n: good[:n % len(good)], st.integers(0, 10 ** 6)))


@SETTINGS
@given(_mutations())
def test_any_bytes_as_onnx_convert_or_are_one_named_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    path.write_bytes(data)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["convert", str(path), "--batch-size", "2"])
    assert code in (0, 2) and err.getvalue().count("\n") == (code == 2), err.getvalue()


FLAGS = ["--batch-size", "--batch-sizes", "--image-size", "--seq-len", "--epochs",
         "--dataset-size", "--precision", "--optimizer", "--device", "--top", "--input-shape"]


@pytest.mark.slow
@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(FLAGS), CELLS), max_size=3))
def test_any_predict_flags_predict_or_are_one_usage_error(tmp_path_factory, flags):
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    argv = ["predict", str(path), *(x for pair in flags for x in pair)]
    if "--batch-size" not in argv and "--batch-sizes" not in argv:
        argv += ["--batch-size", "2"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    lines = [x for x in err.getvalue().splitlines() if not x.startswith("mdot: warning:")]
    assert code in (0, 2), (argv, err.getvalue())
    assert len([x for x in lines if "error" in x]) == (code == 2), (argv, err.getvalue())


def test_a_conversion_error_is_an_mdot_answer():
    """What the CLI catches: every reader's failure is one of these two."""
    assert issubclass(MdotError, ValueError) and issubclass(ConversionError, Exception)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("job") / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    return str(path)


JOB_FIELDS = sorted(FIELDS - {"model", "device_spec", "checkpoint"})  # no files read by name
PLAN_FIELDS = ["devices", "gpus", "prices", "deadline_h", "budget_usd", "global_batch", "cps",
               "strategies"]


def _named_or_run(make, run) -> None:
    """`make()` a request: one line naming its field; or `run` it: a result or one line."""
    try:
        request = make()
    except RequestError as e:
        _one_line(e)
        assert e.field and str(e).startswith(e.field), str(e)
        return
    try:
        run(request)
    except MdotError as e:
        _one_line(e)


@SETTINGS
@given(st.dictionaries(st.sampled_from(JOB_FIELDS), JSON, max_size=3))
def test_any_json_for_a_jobs_fields_predicts_or_is_one_named_error(cnn, fields):
    """Every field given a value of any JSON type (the service's body): a prediction, or one
    line naming the field; a list where one integer goes raised Python's TypeError (a 500)."""
    _named_or_run(lambda: TrainingJob(model=cnn, **{"batch_size": 4, "device": "h100-sxm",
                                                    **fields}), predict)


@SETTINGS
@given(st.dictionaries(st.sampled_from(PLAN_FIELDS), JSON, max_size=2))
def test_any_json_for_a_plans_fields_plans_or_is_one_named_error(cnn, fields):
    job = TrainingJob(model=cnn, batch_size=4, epochs=1, dataset_size=1000)
    _named_or_run(lambda: Plan(job, **{"devices": "h100-sxm", "gpus": (1, 2), **fields}), plan)


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(f.name for f in dataclasses.fields(GPU))), JSON,
                       max_size=2))
def test_any_json_in_a_device_spec_prices_or_is_one_named_error(cnn, change):
    """A spec's field of another JSON type (aliases a number, a name an object) raised
    Python's TypeError while pricing."""
    spec = {**find("h100-sxm").to_json(), "name": "my-gpu", **change}
    try:
        predict(TrainingJob(model=cnn, batch_size=4, device_spec=spec))
    except MdotError as e:
        _one_line(e)
