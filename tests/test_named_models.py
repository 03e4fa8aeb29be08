"""Models by name (`serving.named_models`): a name, its Hub repository or a fine-tuned
variant's name means the shipped config.json; a path that exists wins; an unknown name is one
error naming the close ones; every shipped config exports at the parameter count its index
records (slow: all of them, up to DeepSeek-V3's 671B)."""

import json

import pytest

from mdot_jax import RequestError, TrainingJob
from mdot_jax.cli import main
from mdot_jax.serving.named_models import HOME, find, named, resolve, said


@pytest.mark.parametrize("asked, name", [
    ("llama-3.1-8b", "llama-3.1-8b"), ("LLAMA-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),  # the old name, a variant
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"), ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"), ("mistralai/Mixtral-8x7B-Instruct-v0.1",
                                                  "mixtral-8x7b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"), ("openai-community/gpt2", "gpt2"),
    ("google-bert/bert-base-uncased", "bert-base-uncased")])
def test_a_name_a_repository_or_a_variant_means_the_shipped_config(asked, name):
    assert resolve(asked) == str(HOME / name / "config.json")
    assert TrainingJob(model=asked, batch_size=1).model == str(HOME / name / "config.json")


def test_a_path_that_exists_is_a_path_and_a_files_name_is_its_readers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()  # the user's own folder shadows the name
    assert resolve("gpt2") == "gpt2"
    assert resolve("missing.onnx") == "missing.onnx"  # the loader says it is not there
    assert resolve(b"onnx bytes") == b"onnx bytes"


def test_an_unknown_name_is_one_error_naming_the_close_ones():
    with pytest.raises(RequestError, match=r"model 'llama-3-7b': no such file, nor a named "
                       r"model \(did you mean .*llama-3-8b") as e:
        TrainingJob(model="llama-3-7b", batch_size=1)
    assert e.value.field == "model" and "\n" not in str(e.value)
    with pytest.raises(RequestError, match=r"'xyzzy': no such file, nor a named model; "):
        resolve("xyzzy")
    with pytest.raises(RequestError, match=r"model 'x{60}\.\.\.': no such file"):
        resolve("x" * 5000)  # too long for a path: the file system is not asked to fail
    assert "huggingface.co" not in str(e.value)
    with pytest.raises(RequestError, match=r"'org/Some-Model-8B': .*; any Hugging Face model: "
                       r"give its config.json \(https://huggingface.co/org/Some-Model-8B/blob/"):
        resolve("org/Some-Model-8B")  # a Hub repository's id: where its config is


def test_an_error_about_a_named_models_config_names_the_model_not_the_packages_file():
    message = f"{find('gpt2').config}: 2048 tokens are more than its n_positions (1024) allows"
    assert said(message) == "gpt2: 2048 tokens are more than its n_positions (1024) allows"
    # from Python too (the CLI and the service said it so; `predict` and `plan` named the file)
    from mdot_jax import MdotError, predict
    from mdot_jax.serving.plan import Plan, plan

    job = TrainingJob(model="gpt2", seq_len=128, batch_size=4, target_len=64, train_tokens=10**6)
    for call in (lambda: predict(job), lambda: plan(Plan(job, devices="h100-sxm"))):
        with pytest.raises(MdotError, match="^gpt2: target_len 64: ") as e:
            call()
        assert e.value.field == "target_len" and str(HOME) not in str(e.value)


def test_the_index_and_the_config_files_agree():
    folders = {p.parent.name for p in HOME.glob("*/config.json")}
    assert folders == set(named())
    for m in named().values():
        assert m.fields["model_type"] and m.fields["architectures"], m.name
        assert find(m.repo) is m and find(m.name) is m  # no name or repository means two
        assert m.source.startswith("https://huggingface.co/") and m.parameters > 0


def test_mdot_models_lists_them_and_predict_and_convert_take_a_name(capsys):
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed] == list(named())
    by_name = {m["name"]: m for m in listed}
    assert by_name["llama-3.1-8b"]["positions"] == 131072 and by_name["gpt2"]["positions"] == 1024
    assert by_name["resnet-50"]["positions"] is None  # images
    assert main(["models"]) == 0
    assert "llama-3.1-8b" in capsys.readouterr().out
    assert main(["models", "QWEN3", "--json"]) == 0  # the names holding it, either case
    assert {m["name"][:5] for m in json.loads(capsys.readouterr().out)} == {"qwen3"}
    assert main(["models", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("mdot: error: no named model matches 'nosuch'")
    assert main(["predict", "lama-3.1-8b", "--batch-size", "1", "--seq-len", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdot: error: MODEL 'lama-3.1-8b'") and "llama-3.1-8b" in err


def test_a_checkpoint_that_read_no_loss_prices_a_configs_model_without_its_loss():
    """A config.json's classifier exports its loss; the default checkpoint read graphs that end
    at their outputs (its measured steps took their loss), so the loss was an operator it never
    trained on: ResNet-50 by name was unbanded, "extrapolation", where the same network's
    export without a loss is banded. The loss is left out, said; the rest priced as before."""
    from mdot_jax import predict
    from mdot_jax.serving.model_source import sequence
    from mdot_jax.serving.predict import Predictor, prefix
    from mdot_jax.storage.shipped import resolve_checkpoint

    p = predict(TrainingJob(model="resnet-50", batch_size=32))
    assert p.interval_ms and not any("never trained on" in w for w in p.warnings)
    assert any(w.startswith("the model's loss (SoftmaxCrossEntropyLoss) left out") for w in
               p.warnings)
    whole = sequence(TrainingJob(model="resnet-50", batch_size=32), 32, 2)
    assert whole.op_names[-1] == "SoftmaxCrossEntropyLoss"  # the export keeps it
    head = prefix(whole, k := whole.num_ops - 1)  # the first k operators, the edges among them
    assert (head.op_type == whole.op_type[:k]).all() and (head.load == whole.load[:k]).all()
    assert len(head.edges) == int((whole.edges[:, 1] < k).sum()) and (head.edges < k).all()
    cut = predict(TrainingJob(model=head, batch_size=32))
    assert cut.iteration_ms == pytest.approx(p.iteration_ms, rel=1e-6)
    assert not any("loss" in w and "left out" in w for w in cut.warnings)
    # the checkpoint's own predictor reads it alike (`mdot adapt` prices rows through it)
    direct = Predictor.load(resolve_checkpoint("timm-rtx3090")).predict(whole, batch_size=32)
    assert direct.iteration_ms == pytest.approx(p.iteration_ms, rel=1e-6)
    assert any("left out of its graph" in w for w in direct.warnings) and direct.interval_ms


@pytest.mark.slow
@pytest.mark.parametrize("name", list(named()))
def test_each_named_model_exports_at_its_published_parameter_count(name):
    """The config's fields and the count its model card publishes agree: a wrong width,
    depth, vocabulary or expert count would not."""
    from converters import convert, from_hf_config
    from converters.hf_heads import input_kind

    m = named()[name]
    image = input_kind(m.fields) != "tokens"
    graph = from_hf_config(m.config, seq_len=0 if image else 64)
    assert convert(graph, batch_size=1, seq_len=None if image else 64).params == m.parameters
