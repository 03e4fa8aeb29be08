"""ONNX files as users bring them: every common export of a few models, generated here, reads
with the framework's own parameter count and contraction FLOPs (within 1%), is recognised as a
training or an inference graph, and predicts (with the warnings it deserves)."""

import importlib.util
import io
import json
import pathlib
import warnings

import onnx
import pytest

from converters import convert
from mdot_jax.cli import main

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")
from torch.onnx import TrainingMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

CONTRACTIONS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum")
BATCH, SIZE, TOKENS = 2, 32, 16


class TwoInputs(torch.nn.Module):  # an image and a side input of metadata
    def __init__(self):
        super().__init__()
        self.image = torchvision.models.resnet18(num_classes=8)
        self.meta = torch.nn.Linear(16, 8)

    def forward(self, img, meta):
        return self.image(img) + self.meta(meta)


class Logits(torch.nn.Module):  # forward(ids) -> logits of a transformers model
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def _models():
    gpt2 = transformers.GPT2LMHeadModel._from_config(  # tied input and output embeddings
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500,
                                n_positions=TOKENS), attn_implementation="eager")
    bert = transformers.BertForSequenceClassification._from_config(
        transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                intermediate_size=128, vocab_size=500,
                                max_position_embeddings=TOKENS), attn_implementation="eager")
    image, ids = torch.randn(BATCH, 3, SIZE, SIZE), torch.randint(0, 500, (BATCH, TOKENS))
    models = {"resnet18": (torchvision.models.resnet18(), (image,), ["x"]),
              "two": (TwoInputs(), (image, torch.randn(BATCH, 16)), ["img", "meta"]),
              "gpt2": (Logits(gpt2), (ids,), ["ids"]), "bert": (Logits(bert), (ids,), ["ids"])}
    with torch.no_grad():  # distinct values, as trained weights have: exporters share
        for net, _, _ in models.values():  # initializers of equal value (zero biases)
            for p in net.parameters():
                p.normal_(0, 0.02)
    return models


def _reference(net, args):
    """The framework's own counts: unique parameters, forward FLOPs of the contractions."""
    net.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(*args)
    return sum(p.numel() for p in net.parameters()), counter.get_total_flops()


def _legacy(net, args, names, train, **kw):
    net.train(train)
    dynamic = {n: ({0: "N", 1: "T"} if a.dtype == torch.int64 else {0: "N"})
               for n, a in zip(names, args)}
    kw.setdefault("dynamic_axes", dynamic)
    buf = io.BytesIO()
    torch.onnx.export(net, args, buf, dynamo=False, input_names=names,
                      training=TrainingMode.TRAINING if train else TrainingMode.EVAL, **kw)
    return buf.getvalue()


def _dynamo(net, args, names, train):
    pytest.importorskip("onnxscript")
    net.train(train)
    program = torch.onnx.export(net, args, dynamo=True, input_names=names, verbose=False)
    return program.model_proto.SerializeToString()


# (file, model, exporter, expected graph kind)
CORPUS = [
    ("legacy-train", "resnet18", lambda *a: _legacy(*a, True), "training"),
    ("legacy-eval", "resnet18", lambda *a: _legacy(*a, False), "inference"),
    ("weight-free", "resnet18", lambda *a: _legacy(*a, True, export_params=False,
                                                   do_constant_folding=False), "training"),
    ("opset-11", "resnet18", lambda *a: _legacy(*a, True, opset_version=11), "training"),
    ("opset-20", "resnet18", lambda *a: _legacy(*a, True, opset_version=20), "training"),
    ("fixed-batch", "resnet18", lambda *a: _legacy(*a, False, dynamic_axes=None), "inference"),
    ("dynamo-train", "resnet18", lambda *a: _dynamo(*a, True), "inference"),  # BN folded
    ("dynamo-eval", "resnet18", lambda *a: _dynamo(*a, False), "inference"),
    ("two-inputs", "two", lambda *a: _legacy(*a, True), "training"),
    ("legacy-eval", "gpt2", lambda *a: _legacy(*a, False), "unknown"),
    ("legacy-train", "gpt2", lambda *a: _legacy(*a, True), "training"),
    ("dynamo-eval", "gpt2", lambda *a: _dynamo(*a, False), "unknown"),
    ("legacy-eval", "bert", lambda *a: _legacy(*a, False), "unknown"),
    ("legacy-train", "bert", lambda *a: _legacy(*a, True), "training"),
]


class Corpus:
    """The corpus's exports, each made the first time a test asks for it."""

    def __init__(self, root):
        self.root, self._models, self._files, self._refs = root, None, {}, {}

    def _model(self, name):
        self._models = self._models or _models()
        return self._models[name]

    def file(self, name, kind):
        """The export's path; a test skips where its exporter is not installed."""
        if (name, kind) not in self._files:
            export = next(e for k, n, e, _ in CORPUS if (n, k) == (name, kind))
            path = self.root / f"{name}-{kind}.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    path.write_bytes(export(*self._model(name)))
                except pytest.skip.Exception:
                    path = None
            self._files[(name, kind)] = path
        if self._files[(name, kind)] is None:
            pytest.skip("exporter not installed")
        return self._files[(name, kind)]

    def ref(self, name):
        """The framework's own (parameters, contraction FLOPs) of the model."""
        if name not in self._refs:
            net, args, _ = self._model(name)
            self._refs[name] = _reference(net, args)
        return self._refs[name]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(tmp_path_factory.mktemp("corpus"))


def _args(name):
    return ["--batch-size", str(BATCH)] + (["--seq-len", str(TOKENS)]
                                           if name in ("gpt2", "bert") else [])


# the fast tier: the TorchScript exporter on a CNN and a transformer (the dynamo exporter, 8 s
# of the 3-minute budget, in the slow tier with every other kind)
FAST = {("resnet18", "legacy-train"), ("gpt2", "legacy-train")}


@pytest.mark.parametrize("kind,name,expected", [
    pytest.param(k, n, e, id=f"{n}-{k}", marks=() if (n, k) in FAST else pytest.mark.slow)
    for k, n, _, e in CORPUS])
def test_every_export_reads_as_the_framework_counts_it(capsys, corpus, kind, name, expected):
    path = corpus.file(name, kind)
    assert main(["convert", str(path), "--json", *_args(name)]) == 0
    got = json.loads(capsys.readouterr().out)
    params, flops = corpus.ref(name)
    contractions = sum(v for k, v in got["flops_by_type"].items() if k in CONTRACTIONS)
    assert got["params"] == pytest.approx(params, rel=0.01)  # tied weights once, no constants
    assert contractions == pytest.approx(flops, rel=0.01)
    assert got["graph"]["kind"] == expected
    assert all(shape[0] == BATCH for shape in got["inputs"].values())  # data inputs only
    code = main(["predict", str(path), *_args(name), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] > 0
    warned = [line for line in err.splitlines() if line]
    assert all(line.startswith("mdot: warning: ") for line in warned), err
    assert any("an inference graph" in line for line in warned) == (expected == "inference")
    if name in ("gpt2", "bert"):  # the default checkpoint never saw a text model: its GPU's
        assert any("priced from the nvidia-rtx-3090's spec sheet" in line and  # spec sheet
                   "not tokens" in line for line in warned)
        assert json.loads(out)["source"].startswith("priced from its spec sheet")


@pytest.mark.slow
def test_an_inference_export_predicts_as_its_training_export(capsys, corpus):
    """BatchNormalization folded away (TorchScript eval, dynamo) or in inference mode is put
    back in training mode: the same operator sequence, so the same prediction."""
    ms = {}
    for kind in ("legacy-train", "legacy-eval", "opset-11", "dynamo-train", "dynamo-eval"):
        if kind.startswith("dynamo") and importlib.util.find_spec("onnxscript") is None:
            continue
        main(["predict", str(corpus.file("resnet18", kind)), "--batch-size", "8", "--json"])
        ms[kind] = json.loads(capsys.readouterr().out)["iteration_ms"]
    assert ms["legacy-eval"] == pytest.approx(ms["legacy-train"], rel=1e-6)
    for kind in ("opset-11", "dynamo-train", "dynamo-eval"):  # other operators, same work
        if kind in ms:
            assert ms[kind] == pytest.approx(ms["legacy-train"], rel=0.03), kind


@pytest.mark.slow
def test_a_dynamo_export_reads_its_layers_as_the_torchscript_export_does(capsys, corpus):
    """The dynamo exporter names nodes by counters, its module paths in their metadata: the
    layers, what full checkpointing recomputes (the layers, not the embedding or the head) and
    `--top`'s stacks read as from the TorchScript exporter's names."""
    from converters.attention import attention_blocks, layer_ids

    again, layers = {}, {}
    args = [*_args("gpt2"), "--device", "h100-sxm", "--precision", "amp-bf16"]
    for kind in ("legacy-eval", "dynamo-eval"):
        path = str(corpus.file("gpt2", kind))
        seq = convert(path, batch_size=BATCH, seq_len=TOKENS, fuse=True)
        layers[kind] = sorted(set(layer_ids(seq, attention_blocks(seq)).tolist()))
        assert main(["predict", path, *args, "--activation-checkpointing", "full", "--json"]) == 0
        again[kind] = json.loads(capsys.readouterr().out)["phases"]["recomputation"]
        assert main(["predict", path, *args, "--top", "3"]) == 0
        assert "/transformer/h.*/" in capsys.readouterr().out.split("most expensive")[1]
    assert layers["dynamo-eval"] == layers["legacy-eval"] == [-1, 0, 1]
    assert again["dynamo-eval"] == pytest.approx(again["legacy-eval"], rel=0.01)


def test_the_image_sets_the_input_size_not_the_side_input(capsys, corpus):
    assert main(["predict", str(corpus.file("two", "two-inputs")), "--batch-size", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_size"] == SIZE


def test_a_baked_in_batch_is_named(capsys, corpus):
    assert main(["convert", str(corpus.file("resnet18", "fixed-batch")), "--batch-size", "4"]) == 0
    capsys.readouterr()  # resnet flattens by its own shape: any batch is fine

    class Baked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4 * 30 * 30, 2)

        def forward(self, x):
            return self.fc(self.conv(x).reshape(1, -1))

    path = corpus.root / "baked.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path.write_bytes(_legacy(Baked(), (torch.randn(1, 3, SIZE, SIZE),), ["x"], True,
                                 dynamic_axes=None))
    assert main(["convert", str(path), "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "exported at (input 'x' dim 0 = 1); predict at --batch-size 1," in err
    assert main(["convert", str(path), "--batch-size", "1"]) == 0


def test_tied_weights_are_counted_once_even_after_constant_folding(capsys, corpus):
    model = onnx.load(str(corpus.file("gpt2", "legacy-eval")))
    # the exporter folds the output projection into a transposed copy of the embedding
    assert sum("MatMul" in t.name for t in model.graph.initializer) >= 1
    main(["convert", str(corpus.file("gpt2", "legacy-eval")), "--json", *_args("gpt2")])
    assert json.loads(capsys.readouterr().out)["params"] == pytest.approx(corpus.ref("gpt2")[0],
                                                                          rel=0.01)


KERAS = pathlib.Path(__file__).parent / "data" / "keras"  # made by its make.py (tf2onnx)


@pytest.mark.parametrize("name", ["keras-cnn", "keras-mobilenetv2"])
def test_a_keras_export_reads_as_keras_counts_it_and_as_a_training_step(capsys, name):
    """tf2onnx exports inference: BatchNormalization folded into Conv (its shift as the
    Conv's bias) or lowered to a multiply and an add; both are put back in training mode."""
    ref = json.loads((KERAS / "counts.json").read_text())[name]
    path = KERAS / f"{name}.onnx"
    assert main(["convert", str(path), "--json", "--batch-size", str(BATCH)]) == 0
    got = json.loads(capsys.readouterr().out)
    contractions = sum(v for k, v in got["flops_by_type"].items() if k in CONTRACTIONS)
    assert got["params"] == pytest.approx(ref["params"], rel=0.01)
    assert contractions == pytest.approx(ref["flops_per_sample"] * BATCH, rel=0.01)
    assert got["graph"]["kind"] == "inference" and got["graph"]["producer"].startswith("tf2onnx")
    restored = got["graph"]["restored"]
    assert restored["batchnorm_unfolded"] >= 1 and got["flops_by_type"]["BatchNormalization"] > 0
    assert got["inputs"] == {"image": [BATCH, ref["image_size"], ref["image_size"], 3]}
    assert main(["predict", str(path), "--batch-size", "8", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["input_size"] == ref["image_size"]  # NHWC: the side, not 3
    assert "an inference graph" in err and "tf2onnx exports inference graphs only" in err
