"""The front door: `predict(TrainingJob(...))` answers as `mdot predict` does, chooses the
predictor itself, and every field (alone or in any combination) is valid or one `RequestError`
naming it."""

import dataclasses
import json
import math
import re
import shlex
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_builders import attention, conv_bn_relu

from mdot_jax import MdotError, RequestError, TrainingJob, predict
from mdot_jax.cli import main
from mdot_jax.readable import number
from mdot_jax.serving.prediction import Prediction

REPO = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    onnx.save(conv_bn_relu(training=True, size=64), root / "cnn.onnx")
    onnx.save(attention(seq=64, dim=64), root / "attn.onnx")
    return root


def _cli_json(capsys, *args):
    assert main([str(a) for a in args] + ["--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fields,flags", [
    (dict(checkpoint="cpu-amd-epyc-f26m2-2t"), ["--checkpoint", "cpu-amd-epyc-f26m2-2t"]),
    (dict(), []),  # the default checkpoint: the RTX 3090's measured steps
    (dict(device="h100-sxm", precision="amp-bf16", optimizer="adamw"),
     ["--device", "h100-sxm", "--precision", "amp-bf16", "--optimizer", "adamw"]),
    (dict(device="a100-sxm-80gb", gpus=(1, 8), strategy="fsdp", epochs=2, dataset_size=1000),
     ["--device", "a100-sxm-80gb", "--gpus", "1,8", "--strategy", "fsdp", "--epochs", "2",
      "--dataset-size", "1000"]),
])
def test_the_api_and_the_cli_agree(capsys, models, fields, flags):
    model = models / "cnn.onnx"
    job = TrainingJob(model=str(model), batch_size=16, **fields)
    got = predict(job)
    rows = got if isinstance(got, list) else [got]
    cli = _cli_json(capsys, "predict", model, "--batch-size", 16, *flags)
    cli = cli if isinstance(cli, list) else [cli]
    assert isinstance(got, list) == job.several and len(cli) == len(rows)
    for p, r in zip(rows, cli):
        assert isinstance(p, Prediction)
        assert r["iteration_ms"] == p.iteration_ms and r["memory_gb"] == p.memory_gb
        assert r["source"] == p.source and r["gpus"] == p.gpus
        assert r.get("job_s") == p.job_s
        assert 0 < p.scaling_efficiency <= 1  # never past 100%, FSDP's sharded update or not


def test_the_readme_example_is_the_cli_line_beside_it(capsys, tmp_path, monkeypatch):
    """The README's Python example and its command line, run on a ResNet-50 export."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from converters import from_torch

    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(from mdot_jax import TrainingJob.*?)```", text, re.S)[1]
    line = re.search(r"```bash\n(mdot predict resnet50\.onnx [^\n]*)\n```", text)[1]
    onnx.save(from_torch(torchvision.models.resnet50(), torch.randn(2, 3, 224, 224)),
              tmp_path / "resnet50.onnx")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code, scope)
    assert capsys.readouterr().out.startswith(f"{number(scope['p'].iteration_ms)} ms an iteration")
    cli = _cli_json(capsys, *shlex.split(line)[1:])
    assert cli["iteration_ms"] == scope["p"].iteration_ms and cli["job_s"] == scope["p"].job_s


def test_the_time_to_train_on_n_tokens(capsys, tmp_path):
    from onnx_builders import token_embedding

    onnx.save(token_embedding(seq=32), tmp_path / "t.onnx")
    p = predict(TrainingJob(model=str(tmp_path / "t.onnx"), batch_size=8, device="h100-sxm",
                            gpus=8, grad_accum=2, train_tokens=10 ** 9))
    iterations = math.ceil(math.ceil(10 ** 9 / 32) / (8 * 8 * 2))
    assert p.job_s == pytest.approx(iterations * p.iteration_ms / 1e3)
    cli = _cli_json(capsys, "predict", tmp_path / "t.onnx", "--batch-size", 8, "--device",
                    "h100-sxm", "--gpus", 8, "--grad-accum", 2, "--tokens", "1e9")
    assert cli["job_s"] == p.job_s and cli["tokens_per_s"] == p.tokens_per_s
    # the table says what the job was read as: a dataset of tokens given as samples shows
    assert main(["predict", str(tmp_path / "t.onnx"), "--batch-size", "8", "--device",
                 "h100-sxm", "--gpus", "8", "--grad-accum", "2", "--tokens", "1e9"]) == 0
    assert f"the job: {iterations:,} iterations of 128 samples, 1B tokens" in \
        capsys.readouterr().out  # 1e9 asked, whole iterations of 128 x 32 tokens run
    # JSON's 1e9 is a float: a whole one is the count, as on the command line
    job = TrainingJob(model=str(tmp_path / "t.onnx"), batch_size=8, train_tokens=1e9,
                      epochs=None)
    assert job.train_tokens == 10 ** 9 and isinstance(job.train_tokens, int)
    for bad in (1.5e0, math.inf, -1e9):
        with pytest.raises(RequestError, match="^train_tokens"):
            TrainingJob(model=str(tmp_path / "t.onnx"), batch_size=8, train_tokens=bad)


def test_a_fraction_of_an_epoch_runs_whole_iterations(models, capsys):
    """0.1 epochs of 240 samples at batch 8 are 3 iterations (not 3.0000000000000004 rounded
    up to 4); 0.001 epochs of 10 are 1, as transformers' Trainer counts its steps, where the
    job had been priced at a five-hundredth of an iteration and said `0 iterations`."""
    base = dict(model=str(models / "cnn.onnx"), batch_size=8, device="h100-sxm")
    tenth = predict(TrainingJob(**base, epochs=0.1, dataset_size=240))
    assert tenth.job_s == pytest.approx(3 * tenth.iteration_ms / 1e3)
    bit = predict(TrainingJob(**base, epochs=0.001, dataset_size=10))
    assert bit.job_s == pytest.approx(bit.iteration_ms / 1e3) and bit.job_s > 0
    assert main(["predict", str(models / "cnn.onnx"), "--batch-size", "8", "--device",
                 "h100-sxm", "--epochs", "0.001", "--dataset-size", "10"]) == 0
    assert "1 iteration of 8 samples" in capsys.readouterr().out


def test_a_job_smaller_than_one_iteration_says_so(tmp_path, models):
    """A dataset of 10 samples at batch 64 was priced as one iteration an epoch without a
    word; so are 100 tokens at 8 x 32 a step."""
    from onnx_builders import token_embedding

    base = dict(model=str(models / "cnn.onnx"), batch_size=64, device="h100-sxm", epochs=2)
    small = predict(TrainingJob(**base, dataset_size=10))
    assert small.job_s == pytest.approx(2 * small.iteration_ms / 1e3)
    assert "dataset_size 10: fewer than one iteration's 64 samples; priced as one whole " \
        "iteration an epoch" in small.warnings
    assert not any("fewer than one iteration" in w
                   for w in predict(TrainingJob(**base, dataset_size=64)).warnings)
    onnx.save(token_embedding(seq=32), tmp_path / "t.onnx")
    p = predict(TrainingJob(model=str(tmp_path / "t.onnx"), batch_size=8, device="h100-sxm",
                            train_tokens=100))
    assert "train_tokens 100: fewer than one iteration's 256 tokens" in " ".join(p.warnings)


def test_a_matrix_of_features_is_not_tokens(tmp_path):
    """A float [batch, 16] input is a row of features (a tabular MLP), not 16 token ids: no
    tokens/s, and no job in tokens; beside token ids, the ids' length is the sequence."""
    from onnx import TensorProto, helper
    from onnx_builders import model, value

    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 4], [0.0] * 64)
    mlp = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                [value("x", ["N", 16])], [value("y", None)], [w])
    onnx.save(mlp, tmp_path / "mlp.onnx")
    p = predict(TrainingJob(model=str(tmp_path / "mlp.onnx"), batch_size=8, device="l4"))
    assert p.tokens == 0 and p.tokens_per_s is None
    with pytest.raises(RequestError, match="^train_tokens: the model reads no token ids"):
        predict(TrainingJob(model=str(tmp_path / "mlp.onnx"), batch_size=8, device="l4",
                            train_tokens=10 ** 9))
    both = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
                  helper.make_node("Gather", ["w", "ids"], ["z"], name="embed")],
                 [value("x", ["N", 16]), value("ids", ["N", 32], TensorProto.INT64)],
                 [value("y", None), value("z", None)], [w])
    onnx.save(both, tmp_path / "both.onnx")
    p = predict(TrainingJob(model=str(tmp_path / "both.onnx"), batch_size=8, device="l4"))
    assert p.tokens == 32 and p.input_size == 32


def test_several_batch_sizes_or_gpu_counts_answer_with_a_list(models):
    model = str(models / "attn.onnx")
    one = predict(TrainingJob(model=model, batch_size=8, device="h100-sxm", gpus=8))
    assert isinstance(one, Prediction) and one.gpus == 8 and one.global_batch == 64
    many = predict(TrainingJob(model=model, batch_size=(4, 8), device="h100-sxm", gpus=8))
    assert [p.batch_size for p in many] == [4, 8]
    assert many[1].iteration_ms == one.iteration_ms
    assert many[1].input_size == 64  # the sequence length, never 0


def test_a_converted_sequence_predicts_at_its_own_batch_only(capsys, models, tmp_path):
    out = tmp_path / "attn.npz"
    assert main(["convert", str(models / "attn.onnx"), "--batch-size", "8", "-o", str(out)]) == 0
    capsys.readouterr()
    onnx_p = predict(TrainingJob(model=str(models / "attn.onnx"), batch_size=8, device="l4"))
    assert predict(TrainingJob(model=str(out), batch_size=8, device="l4")).iteration_ms == \
        onnx_p.iteration_ms
    with pytest.raises(RequestError, match="batch_size 512: .* converted at batch 8") as e:
        predict(TrainingJob(model=str(out), batch_size=512, device="l4"))
    assert e.value.field == "batch_size"
    assert main(["predict", str(out), "--batch-size", "8"]) == 0  # any shipped checkpoint


@pytest.mark.parametrize("fields,field", [
    (dict(batch_size="32"), "batch_size"), (dict(batch_size=3.5), "batch_size"),
    (dict(batch_size=True), "batch_size"), (dict(batch_size=math.nan), "batch_size"),
    (dict(batch_size=-4), "batch_size"), (dict(batch_size=None), "batch_size"),
    (dict(batch_size=()), "batch_size"), (dict(device=""), "device"),
    (dict(device_spec="x.json", device="l4"), "device_spec"),
    (dict(device_spec="x.json", checkpoint="timm-rtx3090"), None),  # refused when priced
    (dict(precision="fp8"), "precision"), (dict(optimizer="lion"), "optimizer"),
    (dict(strategy="tp", gpus=8), "strategy"), (dict(strategy="fsdp"), "strategy"),
    (dict(interconnect="nvlink"), "interconnect"), (dict(network_gbs=100), "network_gbs"),
    (dict(network_gbs=math.inf, nodes=2), "network_gbs"), (dict(nodes=0), "nodes"),
    (dict(gpus=(1, 8), batch_size=(2, 4)), "gpus"), (dict(epochs=3), "epochs"),
    (dict(epochs=-1, dataset_size=10), "epochs"), (dict(seq_len=0), "seq_len"),
    (dict(seq_len=99_999_999), "seq_len"), (dict(target_len=2 ** 23), "target_len"),
    (dict(batch_size=2 ** 20, seq_len=64), "batch_size"),  # 67M tokens a micro-batch
    (dict(input_shapes={"x": [2, 99_999_999]}), "input_shapes['x']"),
    (dict(model=""), "model"), (dict(grad_accum=0), "grad_accum"),
    (dict(train_tokens=10, epochs=1, dataset_size=5), "train_tokens"),
    (dict(train_tokens=1e9), "train_tokens"), (dict(train_tokens=100), "train_tokens"),
    (dict(input_shapes={"x": [1, -3]}), "input_shapes['x']"),
    (dict(tp=0), "tp"), (dict(tp=3, gpus=8), "tp"), (dict(pp=2), "pp"),
    (dict(schedule="zero-bubble", pp=2, gpus=2), "schedule"),
    (dict(virtual_stages=2, pp=2, gpus=2), "virtual_stages"),
    (dict(sequence_parallel=True), "sequence_parallel"), (dict(attention="sdpa"), "attention"),
    (dict(strategy="fsdp", tp=2, gpus=2), "strategy"),
    (dict(strategy="zero2", pp=2, gpus=4), "strategy"),  # DeepSpeed refuses ZeRO-2 with PP
    (dict(batch_size=(8, 4, 8)), "batch_size"), (dict(gpus=(8, 8), device="l4"), "gpus"),
    (dict(device="v100-sxm2-32gb", precision="amp-bf16"), "precision"),  # no bf16 peak
    (dict(precision=["fp32"]), "precision"), (dict(strategy={"ddp": 1}), "strategy"),
    # a list where one value is meant, a number where a mapping is: Python's errors, a 500
    (dict(tp=[1, 8]), "tp"), (dict(nodes=[2]), "nodes"), (dict(seq_len=[64]), "seq_len"),
    (dict(image_size=[1, 8]), "image_size"), (dict(input_shapes=5), "input_shapes"),
    (dict(input_shapes={"x": 5}), "input_shapes"),
    (dict(operators="no"), "operators"),  # a truthy string asked for the operators
])
def test_a_field_that_means_nothing_is_refused_by_name(tmp_path, fields, field):
    onnx.save(conv_bn_relu(), tmp_path / "m.onnx")
    with pytest.raises(RequestError) as e:
        predict(TrainingJob(**{"model": str(tmp_path / "m.onnx"), "batch_size": 8, **fields}))
    field = field or "device_spec"
    assert e.value.field == field.split("[")[0] and str(e.value).startswith(field)
    assert "\n" not in str(e.value)


def test_a_spec_sheet_listed_as_one_is_read_as_it_and_a_list_of_two_said_short():
    from mdot_jax.gpu import catalog

    spec = dict(catalog.find("l4").to_json(), name="my-l4", aliases=[])
    job = TrainingJob(model="m.onnx", batch_size=8, device_spec=[spec])
    assert job.device_spec == spec  # as `mdot devices --json NAME` writes it
    with pytest.raises(RequestError, match=r"^device_spec \[\{\.\.\.\}, \{\.\.\.\}\]: name one"):
        TrainingJob(model="m.onnx", batch_size=8, device_spec=[spec, spec])  # not both sheets


def test_a_misspelt_keyword_is_a_request_error_naming_the_field_meant():
    """`TrainingJob(seq_length=...)` was Python's TypeError, past `except MdotError`."""
    from mdot_jax.serving.plan import Plan

    with pytest.raises(RequestError, match=r"^seq_length: not a field; did you mean seq_len\? "
                                           r"\(the fields: model, batch_size, ") as e:
        TrainingJob(model="m.onnx", batch_size=8, seq_length=128)
    assert e.value.field == "seq_length"
    job = TrainingJob(model="m.onnx", batch_size=8, epochs=1, dataset_size=64)
    with pytest.raises(RequestError, match="^deadline: not a field; did you mean deadline_h"):
        Plan(job, deadline=3)
    assert dataclasses.replace(job, batch_size=4).batch_size == 4  # the fields as before
    # None (JSON's null) is a field's default; batch_size has none, so it is required
    assert TrainingJob(model="m.onnx", batch_size=8, optimizer=None, gpus=None) == \
        TrainingJob(model="m.onnx", batch_size=8)


@pytest.mark.parametrize("field,value,meant", [
    ("optimizer", "Adam", "adam"), ("precision", "AMP-BF16", "amp-bf16"),
    ("strategy", "fsd", "fsdp"), ("precision", "zzz", None)])
def test_a_choice_miscased_or_misspelt_is_told_the_one_meant(field, value, meant):
    with pytest.raises(RequestError, match=f"^{field} '{value}': choose from ") as e:
        TrainingJob(model="m.onnx", batch_size=8, **{field: value})
    assert str(e.value).endswith(f"; did you mean '{meant}'?" if meant else "]")


@pytest.mark.parametrize("flags,needle", [
    (["--batch-size", "32", "--batch-sizes", "64,128"], "--batch-size and --batch-sizes"),
    (["--batch-size", "8", "--network-gbs", "100"], "--network-gbs: the link between nodes"),
    (["--batch-size", "8", "--interconnect", "nvlink"], "--interconnect: the link"),
    (["--batch-size", "8", "--device", ""], "--device '': name one"),
    (["--batch-size", "8", "--pp", "3", "--gpus", "8"],
     "--pp 3: --tp x --pp (1 x 3) does not divide"),
    (["--batch-size", "8", "--schedule", "gpipe"], "--schedule: the pipeline's; give --pp > 1"),
    (["--batch-size", "8", "--gpus", "8"], "--gpus 8: priced for a GPU from its spec sheet"),
    (["--batch-size", "8", "--device", "v100-sxm2-32gb", "--precision", "bf16"],
     "--precision 'bf16': the nvidia-v100-sxm2-32gb has no bf16"),
    (["--batch-size", "8", "--step", "fwd-bwd"],
     "--step 'fwd-bwd': priced for a GPU from its spec sheet (name one: --device NAME"),
    (["--input-shape", "x=0,3,64,64"], "--input-shape['x'] 0: expected a positive integer"),
    (["--batch-sizes", "8,4,8"], "--batch-sizes [8, 4, 8]: 8 is listed twice"),
    (["--batch-size", "8", "--gpus", "8,8"], "--gpus [8, 8]: 8 is listed twice"),
])
def test_the_cli_spells_the_field_as_its_flag(capsys, models, flags, needle):
    assert main(["predict", str(models / "cnn.onnx"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mdot: error: ") and err.count("\n") == 1 and needle in err, err


def test_the_table_shows_batch_and_gpus_when_both_vary_or_are_asked(capsys, models):
    args = ["predict", str(models / "attn.onnx"), "--device", "h100-sxm"]
    assert main(args + ["--batch-sizes", "4,8", "--gpus", "8"]) == 0
    header = capsys.readouterr().out.splitlines()[1].split()
    assert header[:3] == ["batch", "GPUs", "ms/iteration"] and "scaling" in header
    assert main(args + ["--batch-size", "4", "--gpus", "1,8", "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)
    assert main(args + ["--batch-size", "4", "--gpus", "8", "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)  # one row: one object


POSITIVE = st.integers(1, 64)
FIELDS = dict(
    batch_size=st.one_of(POSITIVE, st.tuples(POSITIVE, POSITIVE), st.none(), st.just(0),
                         st.just("8"), st.floats(allow_nan=True)),
    device=st.sampled_from([None, "h100-sxm", "l4", "rtx3090", "", "h100", "nope"]),
    precision=st.sampled_from([None, "fp32", "tf32", "amp-fp16", "amp-bf16", "bf16", "x"]),
    optimizer=st.sampled_from(["sgd", "adam", "adamw", "rmsprop"]),
    step=st.sampled_from([None, "train", "fwd-bwd", "bwd"]),
    gpus=st.one_of(st.sampled_from([1, 2, 8, 0, -1]), st.tuples(POSITIVE, POSITIVE)),
    nodes=st.sampled_from([1, 2, 0]),
    grad_accum=st.sampled_from([1, 4, 0]),
    activation_checkpointing=st.sampled_from([None, "full", "selective"]),
    strategy=st.sampled_from(["ddp", "zero1", "zero2", "fsdp", "tp"]),
    tp=st.sampled_from([1, 2, 3]),
    pp=st.sampled_from([1, 2, 4]),
    schedule=st.sampled_from([None, "1f1b", "gpipe", "interleaved"]),
    attention=st.sampled_from([None, "flash", "eager"]),
    interconnect=st.sampled_from([None, "nvlink", "pcie", "ib"]),
    network_gbs=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    offload=st.sampled_from([None, "optimizer", "params", "cpu", ["optimizer"]]),
    host_gbs=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    epochs=st.one_of(st.none(), st.floats(-1, 10)),
    dataset_size=st.one_of(st.none(), st.integers(-5, 10_000)),
)


@SETTINGS
@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_any_request_is_valid_or_one_named_error_and_predicts_or_says_why(models, fields):
    try:
        job = TrainingJob(model=str(models / "attn.onnx"), **fields)
    except RequestError as e:
        assert e.field and str(e).startswith(e.field) and "\n" not in str(e), str(e)
        return
    try:
        got = predict(job)
    except MdotError as e:  # a device the checkpoint lacks, a precision a GPU lacks, ...
        assert str(e) and "\n" not in str(e), str(e)
        return
    rows = got if isinstance(got, list) else [got]
    assert isinstance(got, list) == job.several
    for p in rows:
        assert math.isfinite(p.iteration_ms) and p.iteration_ms > 0
        assert 0 < p.scaling_efficiency <= 1 and p.gpus == p.gpus * 1 >= 1
        assert p.job_s is None or p.job_s > 0
        assert p.mfu is None or p.mfu > 0


@pytest.mark.parametrize("model", [123, 1.5, ["m.onnx"], {"model_type": "gpt2"}])
def test_a_model_of_the_wrong_type_is_refused_by_name(model):
    with pytest.raises(RequestError) as e:  # was a TypeError from deep in the loader
        TrainingJob(model=model, batch_size=4)
    assert e.value.field == "model" and "expected a path" in str(e.value)


@pytest.mark.parametrize("device", ["h100-sxm", None])  # a spec sheet, the default checkpoint
def test_a_model_that_cannot_be_read_is_an_mdot_error(tmp_path, device):
    """`except MdotError` holds every failure of a request, as the README says: a missing file
    was the converters' `ConversionError` alone, past such a handler."""
    from converters import ConversionError
    from mdot_jax import ModelError

    missing = tmp_path / "missing.onnx"
    with pytest.raises(MdotError, match=r"missing.onnx: no such file$") as e:
        predict(TrainingJob(model=str(missing), batch_size=4, device=device))
    assert isinstance(e.value, ModelError) and isinstance(e.value, ConversionError)


def test_a_models_error_is_said_in_the_requests_words(tmp_path):
    """The converters say `--image-size`, their command line's flag; a Python caller gave
    `image_size`, and reads the field it names from the error, as from a `RequestError`."""
    from mdot_jax import ModelError

    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="gpt2", n_embd=32, n_layer=1, n_head=2,
                                      vocab_size=64, n_positions=64)))
    with pytest.raises(ModelError, match=r"image_size 224 does not apply") as e:
        predict(TrainingJob(model=str(config), batch_size=2, seq_len=16, image_size=224,
                            device="h100-sxm"))
    assert e.value.field == "image_size" and "--image-size" not in str(e.value)


def test_a_pytorch_module_is_told_to_export_first():
    torch = pytest.importorskip("torch")
    with pytest.raises(RequestError, match=r"^model \(a Sequential\): .* export a PyTorch "
                       r"module first: converters.from_torch") as e:  # was a TypeError
        TrainingJob(model=torch.nn.Sequential(*[torch.nn.Linear(8, 8)] * 20), batch_size=4)
    assert e.value.field == "model"


def test_numpys_numbers_are_the_same_request(models):
    """A scheduler's batch sizes and GPU counts computed in NumPy: np.int64(8) is 8, an array a
    list of them (each was refused as 'expected a positive integer'); NumPy's bool is no
    count, and the answer is the same as for Python's numbers."""
    import numpy as np

    from mdot_jax.serving.plan import Plan

    base = dict(model=str(models / "attn.onnx"), device="h100-sxm")
    job = TrainingJob(**base, batch_size=np.int64(8), gpus=np.array([1, 8]), tp=np.int32(1),
                      nodes=np.int64(2), network_gbs=np.float32(50.0))
    assert (job.batch_size, job.gpus, job.tp) == (8, (1, 8), 1)
    assert type(job.batch_size) is int and type(job.network_gbs) is float
    assert [p.iteration_ms for p in predict(job)] == [
        p.iteration_ms for p in predict(TrainingJob(**base, batch_size=8, gpus=(1, 8),
                                                    nodes=2, network_gbs=50.0))]
    with pytest.raises(RequestError, match="batch_size"):
        TrainingJob(**base, batch_size=np.bool_(True))
    plan = Plan(TrainingJob(**base, batch_size=8, epochs=1, dataset_size=1000),
                devices="h100-sxm", gpus=np.array([1, 2]), deadline_h=np.float64(3))
    assert plan.gpus == (1, 2) and json.dumps([plan.gpus, plan.deadline_h])
