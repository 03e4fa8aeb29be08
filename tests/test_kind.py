"""What kind of graph came in: training or inference export, precision, control flow."""

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import conv_bn_relu, model, value

from converters import convert
from converters.kind import graph_kind
from converters.training_view import as_training
from mdot_jax.serving.model_facts import graph_warnings


def test_batchnorm_mode_tells_training_from_inference_exports():
    train, infer = graph_kind(conv_bn_relu(training=True)), graph_kind(conv_bn_relu())
    assert train["kind"] == "training" and train["batchnorm_training"] == 1
    assert infer["kind"] == "inference" and infer["batchnorm_inference"] == 1
    assert train["opset"] == 17 and train["precision"] == "fp32" and not train["control_flow"]
    # recorded in the operator sequence, and warned about when predicting
    assert convert(conv_bn_relu(), batch_size=2).meta["graph"]["kind"] == "inference"
    [warning] = graph_warnings(infer)
    assert warning.startswith("an inference graph (1 BatchNormalization in inference mode)")
    assert graph_warnings(train) == []


def test_another_frameworks_export_says_how_it_is_priced():
    g = dict(graph_kind(conv_bn_relu()), producer="jax2onnx 0.17.1")
    said = graph_warnings(g)
    assert said[0].startswith("exported by jax2onnx: priced as eager PyTorch trains the graph")
    assert said[1].endswith("jax2onnx exports inference graphs only")
    assert not any("exported by" in w for w in graph_warnings(graph_kind(conv_bn_relu())))


def test_a_gpu_priced_from_its_spec_sheet_says_the_graph_is_an_inference_one(tmp_path):
    """Said for a checkpoint's device only: a GPU priced an inference export silently."""
    from mdot_jax import TrainingJob, predict

    for training in (False, True):
        onnx.save(conv_bn_relu(training=training), tmp_path / "m.onnx")
        p = predict(TrainingJob(model=str(tmp_path / "m.onnx"), batch_size=2,
                                device="h100-sxm"))
        said = [w for w in p.warnings if w.startswith("an inference graph")]
        assert len(said) == (not training)


def test_an_inference_graph_is_read_as_its_training_step():
    view = as_training(conv_bn_relu())
    [bn] = [n for n in view.graph.node if n.op_type == "BatchNormalization"]
    assert [a.i for a in bn.attribute if a.name == "training_mode"] == [1]
    assert len(bn.output) == 3
    kind = graph_kind(view)  # reported as exported, with what was put back
    assert kind["kind"] == "inference" and kind["batchnorm_inference"] == 1
    assert kind["restored"] == {"batchnorm_to_training": 1, "batchnorm_unfolded": 0}
    training = conv_bn_relu(training=True)
    assert as_training(training) is training  # a training graph is left as it is
    seq, ref = convert(conv_bn_relu(), batch_size=2), convert(training, batch_size=2)
    np.testing.assert_array_equal(seq.load, ref.load)


def test_opset_11_training_batchnorm_is_recognised_by_its_extra_outputs():
    m = conv_bn_relu()
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    del bn.attribute[:]
    bn.output.extend(["rm", "rv", "sm", "sv"])
    assert graph_kind(m)["kind"] == "training"


def test_no_batchnorm_no_dropout_is_unknown_and_control_flow_is_named():
    relu = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [value("x", [2, 3])],
                 [value("y", None)])
    assert graph_kind(relu)["kind"] == "unknown"
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"])], "body",
                             [value("i", [], TensorProto.INT64),
                              value("cond", [], TensorProto.BOOL),
                              value("c", [2, 3])],
                             [value("cond_out", [], TensorProto.BOOL), value("c_out", [2, 3])])
    loop = model([helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)],
                 [value("x", [2, 3]), value("n", [], TensorProto.INT64)], [value("y", None)])
    g = graph_kind(loop)
    assert g["control_flow"] == {"Loop": 1}
    assert any("control flow {'Loop': 1}" in w for w in graph_warnings(g, "fp32"))


def test_weight_precision_is_reported():
    m = conv_bn_relu(training=True)
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float16), "w")
    m.graph.initializer.append(w)
    assert graph_kind(m)["precision"] == "mixed"
    q = model([helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q")],
              [value("x", [2, 3]), value("s", [])], [value("y", None)])
    assert graph_kind(q)["precision"] == "int8"
    assert any("weights are int8" in w for w in graph_warnings(graph_kind(q), "fp32"))


def test_real_exports_of_one_model_in_both_modes():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from converters import from_torch

    net = torchvision.models.resnet18()
    x = torch.randn(2, 3, 32, 32)
    assert graph_kind(from_torch(net, x))["kind"] == "training"
    buf = io.BytesIO()
    torch.onnx.export(net.eval(), (x,), buf, dynamo=False, input_names=["x"])
    kind = graph_kind(onnx.load_from_string(buf.getvalue()))
    # the legacy exporter in eval() folds BatchNormalization into Conv: anonymous Conv weights
    assert kind["kind"] == "inference" and kind["batchnorm_folded"] == 20
    assert "20 BatchNormalization folded into Conv" in graph_warnings(kind, "fp32")[0]
    # without constant folding nothing is folded, and a model without BatchNormalization
    # (named parameters only) is no evidence either
    buf = io.BytesIO()
    torch.onnx.export(net.eval(), (x,), buf, dynamo=False, input_names=["x"],
                      do_constant_folding=False)
    assert graph_kind(onnx.load_from_string(buf.getvalue()))["kind"] == "inference"
    buf = io.BytesIO()
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 30 * 30, 4))
    torch.onnx.export(plain.eval(), (x,), buf, dynamo=False, input_names=["x"])
    assert graph_kind(onnx.load_from_string(buf.getvalue()))["kind"] == "unknown"


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_exporting_leaves_the_model_as_it_was(mode):
    """The export traces the forward in train mode, which moves BatchNorm's running statistics:
    a trained model handed to `from_torch` comes back with its statistics and mode unchanged."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from converters import from_torch

    net = getattr(torchvision.models.resnet18(), mode)()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    from_torch(net, torch.randn(2, 3, 32, 32))
    assert net.training is (mode == "train")
    assert [k for k, v in net.state_dict().items() if not torch.equal(v, before[k])] == []

    class Grown(torch.nn.Module):  # a cache the forward replaces with a longer one
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.arange(4.0), persistent=False)

        def forward(self, x):
            self.cache = torch.arange(float(x.shape[1]))
            return x * self.cache

    grown = torch.nn.Sequential(Grown())
    held = grown[0].cache
    from_torch(grown, torch.ones(2, 8))
    assert grown[0].cache is held and torch.equal(held, torch.arange(4.0))


def test_every_input_tensor_is_a_data_input_and_none_is_no_input():
    """Example inputs flattened: a list's (or a dict argument's) tensors each a data input
    with a batch dim (`input0_0`, `input0_1`; `input0_a`); a None argument no input, so no
    parameter takes its name (the weight of `(x, None)` was read as a second data input);
    names that do not match the tensors are refused, naming them."""
    torch = pytest.importorskip("torch")
    from converters import ConversionError, from_torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, extra=None):
            x = x if torch.is_tensor(x) else x["a"] + x["b"] if isinstance(x, dict) else \
                x[0] + x[1]
            return self.fc(x) if extra is None else self.fc(x) + extra

    x = torch.randn(2, 4)
    for args, inputs in (((x, None), ["input0"]), (([x, x],), ["input0_0", "input0_1"]),
                         ((x, x), ["input0", "input1"]),
                         (({"a": x, "b": x},), ["input0_a", "input0_b"])):  # a batch dict: no
        # input at all, its tensors bound as constants (the batch size asked ignored)
        seq = convert(from_torch(Net(), args), batch_size=8)
        assert seq.meta["inputs"] == {n: [8, 4] for n in inputs} and seq.meta["params"] == 20
    with pytest.raises(ConversionError, match=r"input_names: 2 names for the 1 input tensors"):
        from_torch(Net(), (x, None), input_names=["x", "extra"])

    class Two(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    with pytest.raises(ConversionError, match="missing .*inputs go as a tuple .*not a list"):
        from_torch(Two(), [x, x])


def test_a_language_model_exported_without_labels_is_priced_with_its_loss(tmp_path):
    """A causal LM exported without labels ends at its logits: its step was priced without the
    loss every language model trains on (GPT-2 124M at 8 x 1,024 tokens: 13% faster and 4 GB
    smaller than its config.json's step, whose export holds it). From a spec sheet it is
    priced as the config's, said; a checkpoint's graph, an image model's and a graph with a
    loss are left as exported."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import json

    from converters import from_torch
    from converters.training_view import lm_logits
    from mdot_jax import TrainingJob, predict

    fields = dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=500,
                  n_positions=128)
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with torch.device("meta"):
        lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(**fields))
    ids = torch.zeros(1, 16, dtype=torch.long)
    onnx.save(from_torch(lm, ids), tmp_path / "lm.onnx")
    job = dict(batch_size=4, seq_len=64, device="h100-sxm", precision="amp-bf16",
               optimizer="adamw")
    file, config = (predict(TrainingJob(model=str(tmp_path / m), **job))
                    for m in ("lm.onnx", "config.json"))
    assert file.memory_gb == pytest.approx(config.memory_gb)
    assert file.iteration_ms == pytest.approx(config.iteration_ms, rel=0.05)  # but the four
    # small kernels that shift the config's labels (Pad, Slice, Reshape, Cast)
    bare = predict(TrainingJob(model=from_torch(lm, ids), **job))  # not from the file: in
    assert bare.iteration_ms == pytest.approx(file.iteration_ms)  # memory, the same
    assert any("ends at logits of 500 classes a position" in w and "priced with the loss" in w
               for w in file.warnings)
    cpu = predict(TrainingJob(model=str(tmp_path / "lm.onnx"), batch_size=4, seq_len=64,
                              checkpoint="cpu-amd-epyc-f26m2-2t"))  # trained on graphs as
    assert any("with no loss: priced as converted" in w for w in cpu.warnings)  # exported
    assert "SoftmaxCrossEntropyLoss" not in convert(  # as exported: a checkpoint's graphs
        str(tmp_path / "lm.onnx"), batch_size=4).op_names.tolist()
    assert lm_logits(from_torch(lm, {"input_ids": ids, "labels": ids})) is None  # a loss
    cut = onnx.load(tmp_path / "lm.onnx")  # a view of the tokens with no input (a mutated
    next(n for n in cut.graph.node if n.op_type == "Reshape").ClearField("input")  # file's)
    assert lm_logits(cut) is None  # raised IndexError
    assert lm_logits(conv_bn_relu()) is None  # no language model's logits


def test_logits_of_the_last_position_alone_are_said_to_be_an_inference_forward(tmp_path):
    """nanoGPT's forward without targets computes the head at the last position alone: priced
    as exported, with its loss, and said."""
    torch = pytest.importorskip("torch")
    from converters import from_torch
    from mdot_jax import TrainingJob, predict

    class Last(torch.nn.Module):  # nanoGPT's inference path
        def __init__(self):
            super().__init__()
            self.wte, self.mix = torch.nn.Embedding(100, 16), torch.nn.Linear(16, 16)

        def forward(self, idx):
            x = self.mix(self.wte(idx))
            return x[:, [-1], :] @ self.wte.weight.T

    onnx.save(from_torch(Last(), torch.zeros(1, 24, dtype=torch.long)), tmp_path / "last.onnx")
    p = predict(TrainingJob(model=str(tmp_path / "last.onnx"), batch_size=2, device="h100-sxm"))
    assert any("logits are of one position of each sequence of 24 tokens" in w
               for w in p.warnings)
