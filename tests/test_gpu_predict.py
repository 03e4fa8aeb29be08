"""A training step on any catalogued GPU from its spec sheet (`serving.spec_sheet`, `mdot predict
--device NAME`): every GPU and precision prices, the rules of the composition hold, whatever
is extrapolated is said, and bad requests get one-line errors."""

import dataclasses
import json
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx_builders import attention, conv_bn_relu

from converters import convert
from converters.vocab import VOCAB
from mdot_jax import RequestError, TrainingJob
from mdot_jax.cli import main
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.classify import classify
from mdot_jax.gpu.spec_sheet import PRECISIONS, load_step_model, price
from mdot_jax.storage.shipped import STEP_MODEL_DIR

UNSEEN = {"nvidia-h100-sxm", "nvidia-l4", "nvidia-a100-pcie-80gb"}


@pytest.fixture(scope="module")
def step_model():
    return load_step_model()


def _seq(m, batch=4, **kw):
    return convert(m, batch_size=batch, fuse=True, **kw)


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_shipped_step_model_never_saw_the_unseen_gpus(step_model):
    # NeuSight's unseen GPUs: none of their rows; the H100 only as XLA's tensor-core GEMMs
    assert set(step_model.info.get("tensor_cores", {})) <= {"nvidia-h100-sxm"}
    assert not UNSEEN & (set(step_model.info["fitted_gpus"]) - {"nvidia-h100-sxm"})
    assert set(step_model.info["fitted_gpus"]) == set(step_model.ops.gpus)
    lo, hi = step_model.band
    assert lo < 0 < hi


def test_every_catalogued_gpu_prices_every_precision(step_model):
    seqs = [_seq(conv_bn_relu(training=True)), _seq(attention())]
    for gpu in gpus.catalog().values():
        for precision in PRECISIONS:
            for seq in seqs:
                if precision in ("amp-bf16", "bf16") and not gpu.tflops["bf16"]:
                    with pytest.raises(ValueError, match="no bf16 arithmetic"):
                        price(seq, gpu, step_model, precision=precision)
                    continue
                if precision == "fp8" and not gpu.tflops["fp8"]:  # before Ada and Hopper
                    with pytest.raises(ValueError, match="has no fp8 tensor cores") as e:
                        price(seq, gpu, step_model, precision=precision)
                    instead = str(e.value).rsplit("use ", 1)[1]  # what it says runs there
                    assert price(seq, gpu, step_model, precision=instead).iteration_ms > 0
                    continue
                p = price(seq, gpu, step_model, precision=precision)
                assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0, (gpu.name, precision)
                assert p.iteration_ms == pytest.approx(sum(p.phases.values()))
                assert p.iteration_ms == pytest.approx(sum(o["ms"] for o in p.operators))
                measured = step_model.info.get("tensor_cores", {}).get(gpu.name, ())
                backed = {"tf32": "tf32", "amp-bf16": "bf16"}.get(precision) in measured
                if precision != "fp32" and not (backed and seq is seqs[1]):
                    assert any("not measured yet" in w or "tensor cores" in w
                               or "measured GEMMs reach" in w
                               for w in p.warnings) and p.interval_ms is None
                elif precision != "fp32":  # the H100's GEMMs at bf16 and TF32: measured
                    assert p.interval_ms is not None, (gpu.name, precision)


def test_gemms_batched_gemms_and_grouped_convolutions_are_classified():
    seq = _seq(attention(seq=8, dim=16), batch=2)
    kinds = {str(n): classify(VOCAB[t], c, x) for t, n, c, x in
             zip(seq.op_type, seq.node_names, seq.config, seq.load)}
    # a weight transposed on its way is still one matrix for the whole batch
    assert kinds["k"] == ("linear", "linear", (1, 16, 16, 16)) == kinds["q"]
    assert kinds["scores"] == ("bmm", "bmm", (2, 8, 8, 16))
    assert kinds["softmax"] == ("softmax", "softmax", (16, 8))
    assert kinds["k_t"][0] == "free"


def test_the_step_composes_as_its_rules_say(step_model):
    h100, t4, v100 = gpus.find("h100-sxm"), gpus.find("t4"), gpus.find("v100-sxm2-32gb")
    seq = _seq(attention(seq=256, dim=512), batch=8)
    train = price(seq, h100, step_model)
    fwd_bwd = price(seq, h100, step_model, step="fwd-bwd")
    assert "update" not in fwd_bwd.phases and train.phases["update"] > 0
    # no update, no optimizer state: the gradients stay
    states = {p.memory_parts["model_states"] for p in (train, fwd_bwd)}
    assert states == {seq.params * 12 / 1e9, seq.params * 8 / 1e9}
    assert train.phases["forward"] == fwd_bwd.phases["forward"]
    adamw = price(seq, h100, step_model, optimizer="adamw")
    assert adamw.phases["update"] > train.phases["update"]
    assert price(seq, t4, step_model).iteration_ms > 2 * train.iteration_ms
    # the GPU's time: shorter on tensor cores; a step this small waits on the host, where
    # autocast's casts are more kernels to issue
    assert price(seq, h100, step_model, precision="amp-fp16", host_ms=0).iteration_ms \
        < price(seq, h100, step_model, host_ms=0).iteration_ms
    assert price(seq, h100, step_model, precision="amp-fp16", host_ms=0.05).iteration_ms \
        > price(seq, h100, step_model, host_ms=0.05).iteration_ms
    # measured operator kinds at fp32: a band of whole steps on GPUs left out of the fit
    lo, hi = train.interval_ms
    assert lo < train.iteration_ms < hi
    # convolutions: TF32 under PyTorch's defaults on Ampere and later (warned, no band); on a
    # V100 (no TF32) a 3x3 stride-1 convolution is what was measured
    conv = _seq(conv_bn_relu(training=True, size=32), batch=16)
    on_h100 = price(conv, h100, step_model)
    assert any("TF32" in w for w in on_h100.warnings) and on_h100.interval_ms is None
    assert price(conv, v100, step_model).interval_ms is not None


def test_a_fused_update_moves_the_bytes_of_one_kernel_not_eight(step_model, capsys, tmp_path):
    """torch.optim's fused AdamW reads p, g, m, v and writes p, m, v once: 7 / 3 of a binary
    pass, one launch; its foreach kernels 8 passes (9 with fp16's unscaling), one launch each."""
    h100 = gpus.find("h100-sxm")
    seq = _seq(attention(seq=256, dim=512), batch=8)
    foreach, fused = (price(seq, h100, step_model, optimizer="adamw", precision="amp-fp16",
                            host_ms=0, fused_optimizer=f) for f in (False, True))
    assert fused.phases["update"] == pytest.approx(foreach.phases["update"] * (7 / 3) / 9)
    assert foreach.phases["forward"] == fused.phases["forward"]
    assert any("fused kernel" in w for w in fused.warnings)
    assert any("fused_optimizer" in w for w in foreach.warnings)  # the choice is said
    # the host issues one kernel for the update, not nine
    slow = [price(seq, h100, step_model, optimizer="adamw", precision="amp-fp16",
                  host_ms=1.0, fused_optimizer=f).iteration_ms for f in (False, True)]
    assert slow[0] - slow[1] == pytest.approx(8.0, rel=0.05)
    _a_gpus_flag(capsys, tmp_path, "--fused-optimizer", "fused kernel", "yes")


def test_an_8bit_adamw_holds_a_quarter_of_the_state_in_a_kernel_a_tensor(step_model):
    """bitsandbytes' AdamW8bit: two one-byte states a parameter (and a scale a block of 256),
    not AdamW's eight bytes; 16 bytes a parameter moved (4 / 3 of a pass) in one kernel a
    parameter tensor, each issued by the host; not fused, not Megatron's."""
    from mdot_jax.serving.memory import step_memory

    h100 = gpus.find("h100-sxm")
    seq = _seq(attention(seq=256, dim=512), batch=8)
    tensors = int((seq.column("params") > 0).sum())
    state = {o: step_memory(seq, "amp-bf16", o).optimizer for o in ("adamw", "adamw-8bit")}
    assert state["adamw-8bit"] == pytest.approx(state["adamw"] * (1 + 4 / 256) / 4)
    full, eight = (price(seq, h100, step_model, optimizer=o, precision="amp-bf16", host_ms=0)
                   for o in ("adamw", "adamw-8bit"))
    assert eight.phases["forward"] == full.phases["forward"]
    # a sixth of the bytes, each small kernel's fixed cost besides
    assert 0.9 * (4 / 3) / 8 < eight.phases["update"] / full.phases["update"] < 1
    assert any("bitsandbytes' blockwise kernel a parameter tensor" in w for w in eight.warnings)
    slow = [price(seq, h100, step_model, optimizer=o, precision="amp-bf16", host_ms=1.0
                  ).iteration_ms for o in ("adamw", "adamw-8bit")]
    assert slow[1] - slow[0] == pytest.approx(tensors - 8, rel=0.05)  # launches, 1 ms each
    for field, value in (("fused_optimizer", True), ("framework", "megatron")):
        with pytest.raises(RequestError, match=f"^{field}: optimizer adamw-8bit runs"):
            TrainingJob(model="m.onnx", batch_size=4, device="h100-sxm",
                        optimizer="adamw-8bit", precision="amp-bf16", **{field: value})


def _a_gpus_flag(capsys, tmp_path, flag, said, bad):
    """`flag` is refused for a checkpoint, said on a GPU (a warning holding `said`), and a
    request's field given `bad` (not a bool) is an error naming it."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(training=True), path)
    code, _, err = run(capsys, "predict", path, "--batch-size", 4, "--checkpoint",
                       "cpu-amd-epyc-f26m2-2t", flag)
    assert code == 2 and f"{flag}: priced for a GPU from its spec sheet" in err
    assert "(--device NAME, no checkpoint); checkpoint cpu-amd-epyc-f26m2-2t predicts" in err
    code, out, _ = run(capsys, "predict", path, "--batch-size", 4, "--device", "h100-sxm",
                       "--optimizer", "adamw", flag, "--json")
    assert code == 0 and any(said in w for w in json.loads(out)["warnings"])
    field = flag.removeprefix("--").replace("-", "_")
    with pytest.raises(RequestError, match=re.escape(f"{field} {bad!r}: true or false")):
        TrainingJob(model=path, batch_size=4, device="h100-sxm", **{field: bad})


def test_clipping_the_gradients_costs_a_pass_and_six_launches(step_model, capsys, tmp_path):
    """clip_grad_norm_ reads every gradient for the norm and scales each (one 12-byte pass in
    all, in six launches with the norm's scalar kernels), before the update, whichever it is."""
    h100 = gpus.find("h100-sxm")
    seq = _seq(attention(seq=256, dim=512), batch=8)
    for fused in (False, True):
        plain, clipped = (price(seq, h100, step_model, optimizer="adamw", host_ms=0,
                                fused_optimizer=fused, clip_grad_norm=c) for c in (False, True))
        passes = 7 / 3 if fused else 8  # the update's own, as in the test above
        assert clipped.phases["update"] == pytest.approx(plain.phases["update"] * (passes + 1)
                                                         / passes)
        assert any("after clipping" in w for w in clipped.warnings)
        assert not any("clipping" in w for w in plain.warnings)
    slow = [price(seq, h100, step_model, optimizer="adamw", host_ms=1.0,
                  clip_grad_norm=c).iteration_ms for c in (False, True)]
    assert slow[1] - slow[0] == pytest.approx(6.0, rel=0.05)
    _a_gpus_flag(capsys, tmp_path, "--clip-grad-norm", "after clipping", 1.0)


def test_the_first_convolution_has_no_data_gradient(step_model):
    h100 = gpus.find("h100-sxm")
    conv = _seq(conv_bn_relu(training=True, size=32), batch=16)
    p = price(conv, h100, step_model, step="fwd-bwd")
    by_name = {o["name"]: o["ms"] for o in p.operators}
    # its backward is the weight gradient only: less than twice its forward
    fw = step_model.ops.predict(["conv"], [(1, 16 * 1024, 4, 27, 16 * 3 * 1024)],
                                [h100])[0]
    assert by_name["conv"] < 2.5 * fw


def test_a_linear_weight_read_directly_or_through_a_view_costs_the_same(step_model):
    """The dynamo exporter hands a linear layer its weight as it is ([K, N], folded), the
    TorchScript exporter through a Transpose (a view): the same kernels, and no accumulation
    kernel for the weight, whose gradient its GEMM writes (the bias's reduction stays); the
    first layer, reading the graph's input, has no data gradient either way."""
    from onnx_builders import model, value

    def linear(view, first):
        w = "wt" if view else "w"
        nodes = ([onnx.helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0])] if view
                 else []) + [onnx.helper.make_node("Relu", ["x"], ["r"]),
                             onnx.helper.make_node("MatMul", ["x" if first else "r", "w"], ["h"]),
                             onnx.helper.make_node("Add", ["h", "b"], ["y"])]
        m = model(nodes, [value("x", ["N", 64, 256]), value(w, [512, 256] if view else [256, 512]),
                          value("b", [512])], [value("y", None), value("r", None)])
        m.metadata_props.add(key="mdot.data_inputs", value="x")
        return _seq(m, batch=8)

    h100 = gpus.find("h100-sxm")
    kernels = {}
    for view in (True, False):
        for first in (True, False):
            kernels[view, first] = ks = []
            price(linear(view, first), h100, step_model, precision="amp-bf16", kernels=ks)
    for first in (True, False):
        assert len(kernels[True, first]) == len(kernels[False, first])
        np.testing.assert_allclose(sum(kernels[True, first]), sum(kernels[False, first]),
                                   rtol=1e-9)
    # no data gradient, and no fp32 Relu output cast for the GEMM, forward and backward
    assert len(kernels[False, True]) == len(kernels[False, False]) - 3


def test_predict_prices_a_catalogued_gpu_from_its_spec_sheet(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(attention(seq=64, dim=64), model)
    args = ["predict", model, "--batch-size", "4"]
    code, out, err = run(capsys, *args, "--device", "h100-sxm", "--json")
    row = json.loads(out)
    assert code == 0 and row["device"] == "nvidia-h100-sxm" and "spec sheet" in row["source"]
    assert set(row["phases"]) - {"launch gaps"} == {"forward", "backward", "update"}
    code, out, _ = run(capsys, *args, "--device", "l4", "--top", "3", "--step", "fwd-bwd",
                       "--optimizer", "adamw")
    assert code == 0 and "most expensive operators" in out and "update" not in out
    # the checkpoint's own GPU takes the checkpoint for the image models it was trained on,
    # unless the spec sheet is asked for; another kind of model, the spec sheet, said
    image = tmp_path / "cnn.onnx"
    onnx.save(conv_bn_relu(), image)
    code, out, _ = run(capsys, "predict", image, "--batch-size", "4", "--device", "rtx3090",
                       "--json")
    assert "spec sheet" not in json.loads(out)["source"]
    code, out, _ = run(capsys, *args, "--device", "rtx3090", "--json")
    row = json.loads(out)
    assert "spec sheet" in row["source"] and any(
        "trained on image models only, not signal; at amp-fp16" in w for w in row["warnings"])
    # at the checkpoint's precision, the device's usual, where none is named
    code, out, _ = run(capsys, *args, "--device", "rtx3090", "--precision", "amp-fp16",
                       "--json")
    assert json.loads(out)["iteration_ms"] == pytest.approx(row["iteration_ms"])
    code, out, _ = run(capsys, *args, "--device", "rtx3090", "--checkpoint",
                       "gpu-spec-sheet", "--json")
    assert "spec sheet" in json.loads(out)["source"]
    # a precision the checkpoint never trained on (amp-fp16 only): the spec sheet, said; named
    # as the checkpoint, it extrapolates, and says so
    code, out, _ = run(capsys, *args, "--device", "rtx3090", "--precision", "fp32", "--json")
    row = json.loads(out)
    assert "spec sheet" in row["source"] and any(
        "the checkpoint measured on it was trained at amp-fp16 only" in w for w in row["warnings"])
    # no device named: the default checkpoint's GPU, routed as if named (a multi-GPU step
    # asks for a device)
    for extra in ((), ("--precision", "fp32")):
        named = run(capsys, *args, "--device", "rtx3090", *extra, "--json")[1]
        code, out, _ = run(capsys, *args, *extra, "--json")
        assert code == 0 and json.loads(out) == json.loads(named)
    code, _, err = run(capsys, *args, "--gpus", "2")
    assert code == 2 and "--gpus 2: priced for a GPU from its spec sheet (name one: --device " \
        "NAME" in err
    code, out, _ = run(capsys, *args, "--device", "rtx3090", "--checkpoint", "timm-rtx3090",
                       "--precision", "fp32", "--json")
    row = json.loads(out)
    assert "spec sheet" not in row["source"] and any(
        "precision fp32 was never trained on" in w for w in row["warnings"])
    (tmp_path / "gpu.json").write_text(json.dumps(dict(gpus.find("l4").to_json(),
                                                       name="mine")))
    code, out, _ = run(capsys, *args, "--device-spec", tmp_path / "gpu.json", "--json")
    assert code == 0 and json.loads(out)["device"] == "mine"
    for extra, needle in [(("--device", "v100-sxm2-32gb", "--precision", "amp-bf16"),
                           "error: --precision 'amp-bf16': the nvidia-v100-sxm2-32gb has no bf16"),
                          (("--device", "rtx3090", "--checkpoint", "timm-rtx3090", "--step",
                            "fwd-bwd"), "--step"),
                          (("--device", "t4", "--precision", "bf16"), "no bf16 arithmetic"),
                          (("--device-spec", tmp_path / "gpu.json", "--device", "l4"),
                           "--device-spec"),
                          (("--checkpoint", "gpu-spec-sheet",), "--device")]:
        code, _, err = run(capsys, *args, *extra)
        assert code == 2 and needle in err and err.count("\n") == 1, (extra, err)


def test_channels_last_is_priced_where_the_step_model_measured_the_layouts(capsys, tmp_path):
    model = tmp_path / "c.onnx"
    onnx.save(conv_bn_relu(), model)
    args = ["predict", model, "--batch-size", "64", "--device", "a100-sxm-80gb",
            "--precision", "amp-bf16", "--json"]
    rows = {lay: json.loads(run(capsys, *args, "--layout", lay)[1]) for lay in ("nchw", "nhwc")}
    # its kernels (the step itself waits on the host: a small model)
    assert rows["nhwc"]["phases"]["forward"] < rows["nchw"]["phases"]["forward"]
    assert [any("channels-last" in w for w in r["warnings"]) for r in rows.values()] == [
        False, True]
    bare = tmp_path / "no-layouts"  # a step model fitted without `--channels-last`
    shutil.copytree(STEP_MODEL_DIR, bare)
    meta = json.loads((bare / "step_model.json").read_text())
    del meta["channels_last"]
    (bare / "step_model.json").write_text(json.dumps(meta))
    code, _, err = run(capsys, *args, "--layout", "nhwc", "--checkpoint", bare)
    assert code == 2 and "--layout" in err and "NCHW only" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_step_model_adapts_to_a_gpus_measured_steps(capsys, tmp_path):
    # steps that keep the GPU busy (smaller ones wait on the host alike)
    for i, seq in enumerate((256, 512, 1024)):
        onnx.save(attention(seq=seq, dim=256), tmp_path / f"m{i}.onnx")
    # step times "measured" at twice the spec-sheet price: the fit must find the factor
    l4, step_model = gpus.find("l4"), load_step_model()
    rows = []
    for i, seq in enumerate((256, 512, 1024)):
        for b in (2, 8):
            ms = price(_seq(attention(seq=seq, dim=256), batch=b), l4, step_model).iteration_ms
            rows.append(f"m{i}.onnx,{b},fp32,{2 * ms}")
    (tmp_path / "mine.csv").write_text("model,batch_size,precision,ms\n" + "\n".join(rows))
    adapt = ["adapt", "--from-measurements", tmp_path / "mine.csv", "--base", "gpu-spec-sheet",
             "--out", tmp_path / "my-l4"]
    code, _, err = run(capsys, *adapt)
    assert code == 2 and "--device-name" in err and err.count("\n") == 1
    code, out, _ = run(capsys, *adapt, "--device-name", "l4")
    assert code == 0 and "nvidia-l4" in out and "expected error: 0.0%" in out
    assert "unadapted, gpu-spec-sheet erred by 50.0% on these rows\n" in out
    args = ["predict", tmp_path / "m1.onnx", "--batch-size", "4", "--json"]
    plain = json.loads(run(capsys, *args, "--device", "l4")[1])
    code, out, _ = run(capsys, *args, "--checkpoint", tmp_path / "my-l4")
    adapted = json.loads(out)
    assert code == 0 and adapted["device"] == "nvidia-l4" and "adapted" in adapted["source"]
    assert adapted["iteration_ms"] == pytest.approx(2 * plain["iteration_ms"], rel=1e-6)
    assert adapted["interval_ms"] is not None and "6 steps measured" in adapted["band_from"]
    code, out, err = run(capsys, *args[:-1], "--checkpoint", tmp_path / "my-l4")
    assert "band: where 80% of the measured times fell, for predictions like these, on the 6 " \
        "steps measured on the nvidia-l4" in out
    # adapted at fp32: at another precision its fit is not measured, nor its band
    code, out, err = run(capsys, *args, "--checkpoint", tmp_path / "my-l4", "--precision", "tf32")
    assert code == 0 and json.loads(out)["interval_ms"] is None and "no band" in err
    code, out, err = run(capsys, *args, "--checkpoint", tmp_path / "my-l4", "--device", "t4")
    assert code == 0 and "priced unadapted" in err
    assert json.loads(out)["source"].endswith("unadapted (adapted to the nvidia-l4's steps)")
    code, _, err = run(capsys, *adapt, "--device-name", "l4")  # never replaced unasked
    assert code == 2 and "--force" in err


@pytest.mark.slow
def test_an_adaptation_can_be_a_machine_of_its_own_kernel_speed_and_host(capsys, tmp_path):
    """Steps "measured" on a GPU whose kernels take 1.5x their price and whose host issues one
    every 30 us (the shipped host: ~41): small steps faster than priced, large ones slower. The
    adaptation picks the machine form, and the adapted model prices a job it never saw as such
    a machine runs it."""
    from mdot_jax import predict
    from mdot_jax.gpu.host import launch_bound, recording_kernels

    def job(seq, b, **kw):
        return TrainingJob(model=str(tmp_path / f"m{seq}.onnx"), batch_size=b,
                           device="h100-sxm", precision="amp-bf16", **kw)

    def machine(j):  # the step as that machine runs it
        with recording_kernels() as recorded:
            predict(j)
        return launch_bound([1.5 * t for t in recorded[-1]], 0.03)

    for seq in (64, 256, 512):
        onnx.save(attention(seq=seq, dim=256, heads=4), tmp_path / f"m{seq}.onnx")
    rows = [f"m{seq}.onnx,{b},amp-bf16,{machine(job(seq, b))}"
            for seq, b in ((64, 1), (64, 8), (256, 4), (256, 32), (512, 16), (512, 64))]
    (tmp_path / "mine.csv").write_text("model,batch_size,precision,ms\n" + "\n".join(rows))
    code, out, _ = run(capsys, "adapt", "--from-measurements", tmp_path / "mine.csv", "--base",
                       "gpu-spec-sheet", "--out", tmp_path / "mine", "--device-name", "h100-sxm")
    assert code == 0 and "machine fit: kernels at" in out and "edge" not in out, out
    fitted = json.loads((tmp_path / "mine" / "step_model.json").read_text())["adaptation"]
    assert np.exp(fitted["a"]) == pytest.approx(1.5, rel=0.03)
    assert fitted["host_ms"] == pytest.approx(0.03, abs=0.002)
    unseen = job(256, 12)
    adapted = predict(dataclasses.replace(unseen, device=None, checkpoint=str(tmp_path / "mine")))
    assert adapted.iteration_ms == pytest.approx(machine(unseen), rel=0.02)
    assert adapted.interval_ms is not None and "6 steps measured" in adapted.band_from
    code, _, err = run(capsys, "adapt", "--from-measurements", tmp_path / "mine.csv", "--base",
                       tmp_path / "mine", "--out", tmp_path / "again", "--device-name",
                       "h100-sxm")  # a machine's fit does not compose with another fit
    assert code == 2 and "its GPU's kernels and host already" in err and err.count("\n") == 1


@pytest.mark.slow
def test_adapting_prices_the_rows_as_predict_will(capsys, tmp_path):
    """At AMP on an H100 PyTorch runs FlashAttention and the rows trained with AdamW: the
    adaptation is fitted to the prices `mdot predict` gives those jobs, so steps measured at
    twice those prices come out at exactly twice (eager attention or SGD would not)."""
    from mdot_jax import TrainingJob, predict

    onnx.save(attention(seq=256, dim=256, heads=4), tmp_path / "m.onnx")
    job = dict(model=str(tmp_path / "m.onnx"), device="h100-sxm", precision="amp-bf16",
               optimizer="adamw")
    ms = {b: predict(TrainingJob(**job, batch_size=b)).iteration_ms for b in (8, 32)}
    rows = [f"m.onnx,{b},amp-bf16,adamw,{2 * t}" for b, t in ms.items()]
    (tmp_path / "mine.csv").write_text("model,batch_size,precision,optimizer,ms\n"
                                       + "\n".join(rows))
    code, out, _ = run(capsys, "adapt", "--from-measurements", tmp_path / "mine.csv", "--base",
                       "gpu-spec-sheet", "--out", tmp_path / "mine", "--device-name", "h100-sxm")
    assert code == 0 and "expected error: 0.0%" in out, out
    adapted = predict(TrainingJob(**dict(job, device=None), batch_size=16,
                                  checkpoint=str(tmp_path / "mine")))
    plain = predict(TrainingJob(**job, batch_size=16))
    assert adapted.iteration_ms == pytest.approx(2 * plain.iteration_ms, rel=1e-6)
    # a CNN's rows measured in channels-last, priced so (a `layout` column)
    onnx.save(conv_bn_relu(size=64), tmp_path / "c.onnx")
    cnn = dict(model=str(tmp_path / "c.onnx"), device="h100-sxm", precision="amp-bf16",
               layout="nhwc")
    ms = {b: predict(TrainingJob(**cnn, batch_size=b)).iteration_ms for b in (64, 256)}
    rows = [f"c.onnx,{b},amp-bf16,nhwc,{2 * t}" for b, t in ms.items()]
    (tmp_path / "nhwc.csv").write_text("model,batch_size,precision,layout,ms\n" + "\n".join(rows))
    code, out, _ = run(capsys, "adapt", "--from-measurements", tmp_path / "nhwc.csv", "--base",
                       "gpu-spec-sheet", "--out", tmp_path / "nhwc", "--device-name", "h100-sxm")
    assert code == 0 and "expected error: 0.0%" in out, out


def test_a_host_slower_than_the_kernels_leaves_the_gpu_waiting():
    from mdot_jax.gpu.host import launch_bound

    assert launch_bound([], 0.01) == 0
    assert launch_bound([1.0, 1.0], 0.0) == 2.0  # GPU-bound: the kernels back to back
    assert launch_bound([0.001] * 100, 0.01) == pytest.approx(100 * 0.01 + 0.001)  # host-bound
    # a long kernel lets the host run ahead: the short ones after it queue up
    assert launch_bound([1.0] + [0.001] * 50, 0.01) == pytest.approx(0.01 + 1.0 + 0.05)
    t = np.random.default_rng(0).random(200) * 0.02
    end = 0.0
    for k, tk in enumerate(t):  # the recursion the closed form solves
        end = max((k + 1) * 0.01, end) + tk
    assert launch_bound(t, 0.01) == pytest.approx(end)


def test_the_launch_bound_grid_is_the_launch_bound_at_every_point():
    from mdot_jax.gpu.host import launch_bound, launch_bound_grid

    steps = [list(np.random.default_rng(i).exponential(0.02, 50 * i + 1)) for i in range(4)]
    speeds, hosts = np.asarray([0.5, 1.0, 3.0]), np.asarray([0.0, 0.01, 0.05])
    grid = launch_bound_grid(steps, speeds, hosts)
    for i, ks in enumerate(steps):
        for s, g in enumerate(speeds):
            for h, host in enumerate(hosts):
                assert grid[i, s, h] == pytest.approx(launch_bound([g * k for k in ks], host))


def test_the_host_is_the_frameworks_and_its_fit_prices_as_a_step_does(step_model):
    import dataclasses

    from mdot_jax.gpu import gpu_fit
    from mdot_jax.gpu.host import launch_bound

    one = dataclasses.replace(step_model, info=dict(step_model.info, host_ms_per_kernel=0.03))
    each = dataclasses.replace(step_model, info=dict(step_model.info, host_ms_per_kernel=dict(
        pytorch=0.03, megatron=0.05)))
    assert one.host_ms("pytorch") == one.host_ms("megatron") == 0.03
    assert (each.host_ms("pytorch"), each.host_ms("megatron"), each.host_ms("jax")) == (
        0.03, 0.05, 0.0)
    h100 = gpus.find("h100-sxm")
    seqs = [_seq(attention(seq=s, dim=64), batch=2) for s in (8, 256)]
    samples = [type("S", (), dict(seq=q, label_ms=1.0, workload=type("W", (), dict(
        precision="amp-bf16", layout="nchw"))))() for q in seqs]
    # the fit sees the kernels a step priced behind a host runs: any host gives the step's time
    for (kernels, _), q in zip(gpu_fit.step_kernels(one, samples, h100), seqs):
        for h in (0.005, 0.03, 0.2):
            step = price(q, h100, one, precision="amp-bf16", fit=False, host_ms=h)
            assert launch_bound(kernels, h) == pytest.approx(step.iteration_ms, rel=1e-9)
    slow = [(k, launch_bound(k, 0.05)) for k, _ in gpu_fit.step_kernels(one, samples, h100)]
    best, mape, _ = gpu_fit.best_host(slow)  # steps measured behind a 50 us host
    assert best == pytest.approx(0.05, rel=0.06) and mape < 3


def test_autocast_adds_its_casts_and_the_host_its_gaps(step_model):
    h100 = gpus.find("h100-sxm")
    seq = _seq(attention(seq=8, dim=16), batch=2)  # a tiny step: launch-bound
    kernels32, kernels16 = [], []
    price(seq, h100, step_model, host_ms=0.0, kernels=kernels32)
    p = price(seq, h100, step_model, precision="amp-bf16", host_ms=0.0, kernels=kernels16)
    # both weights (one transposed on the way) cast forward and their gradients back; the
    # softmax's fp32 output cast where the second batched GEMM reads it, and the half scores
    # and mix softmax and layer norm read cast up, each forward and backward (`gpu.autocast`)
    assert len(kernels16) - len(kernels32) == 2 * 2 + 3 * 2
    assert "launch gaps" not in p.phases
    fsdp: list[float] = []  # FSDP gathers the weights in the half type: the activations' alone
    price(seq, h100, step_model, precision="amp-bf16", host_ms=0.0, kernels=fsdp,
          half_weights=True)
    assert len(fsdp) - len(kernels32) == 3 * 2
    slow = price(seq, h100, step_model, precision="amp-bf16", host_ms=0.05)
    assert slow.phases["launch gaps"] > 0
    assert slow.iteration_ms == pytest.approx(sum(o["ms"] for o in slow.operators))
    assert slow.iteration_ms >= 0.05 * len(kernels16)
    # a launch-bound step says how much of it is the host's, and how to fit one's own
    assert any(w.startswith("launch-bound: ") and "50 us a kernel under pytorch" in w
               and "--base gpu-spec-sheet --device-name nvidia-h100-sxm" in w
               for w in slow.warnings)
    assert not any(w.startswith("launch-bound") for w in p.warnings)


def test_bf16_trains_the_whole_model_in_it_without_casts_at_two_bytes_an_element(step_model,
                                                                                  tmp_path):
    from mdot_jax import predict
    from mdot_jax.gpu.spec_sheet import CASTS
    from mdot_jax.serving.attention_choice import choose
    from mdot_jax.serving.memory import ParamBytes, param_bytes, step_memory

    h100, seq = gpus.find("h100-sxm"), _seq(attention(seq=64, dim=64), batch=8)
    amp, whole = (price(seq, h100, step_model, precision=p, optimizer="adamw", host_ms=0.0)
                  for p in ("amp-bf16", "bf16"))
    assert any(o["type"] == CASTS for o in amp.operators)
    assert not any(o["type"] == CASTS for o in whole.operators)
    # softmax and layer norm read and write bf16, not fp32; the update's passes two bytes
    assert whole.phases["forward"] < amp.phases["forward"]
    assert whole.phases["update"] < amp.phases["update"]
    assert any(w.startswith("bf16: the whole model") for w in whole.warnings)
    assert not any(w.startswith("bf16: the whole model") for w in amp.warnings)
    # torch.optim's state in the parameters' type; bitsandbytes' a byte whatever they are
    assert param_bytes("bf16", "adamw") == ParamBytes(2.0, 0.0, 2.0, 4.0)  # 8 bytes in all
    held = [(m.parameters + m.gradients + m.optimizer, m.activations) for m in (
        step_memory(seq, p, "adamw") for p in ("amp-bf16", "bf16"))]
    assert held[1][0] == pytest.approx(held[0][0] / 2)  # 8 bytes a parameter, not 16
    assert held[1][1] < held[0][1]  # no half copy of each weight, as autocast keeps
    onnx.save(attention(seq=64, dim=64), tmp_path / "a.onnx")  # DDP's buckets: in their type
    grown = [(two[1].memory_parts["model_states"] - two[0].memory_parts["model_states"])
             for two in (predict(TrainingJob(model=str(tmp_path / "a.onnx"), batch_size=8,
                                             device="h100-sxm", precision=p, optimizer="adamw",
                                             gpus=[1, 2])) for p in ("amp-bf16", "bf16"))]
    assert grown[1] == pytest.approx(grown[0] / 2)
    eight_bit = (param_bytes(p, "adamw-8bit").optimizer for p in ("bf16", "fp32"))
    assert len(set(eight_bit)) == 1
    assert choose(None, 8.0, "bf16", [None], 1, None)[0] == "flash"  # SDPA's flash runs
    assert choose(None, 7.0, "bf16", [None], 1, None)[0] == "eager"


def test_a_launch_bound_step_says_its_time_on_each_machine_measured(step_model):
    """The shipped host pools three lease machines; a launch-bound price also says the step
    at the fastest and the slowest machine's own host (`host_range_ms_per_kernel`), each the
    price at that host; a host given (an adapted machine's, a study's) says none."""
    import dataclasses
    import re

    lo, hi = step_model.host_range("pytorch")
    assert lo < step_model.host_ms("pytorch") < hi and step_model.host_range("megatron") is None
    h100 = gpus.find("h100-sxm")
    seq = _seq(attention(seq=8, dim=64), batch=2)
    p = price(seq, h100, step_model, precision="amp-bf16")
    said = next(w for w in p.warnings if w.startswith("launch-bound: "))
    ends = re.search(r"issue kernels at (\d+)-(\d+) us: one GPU's step ([\d.]+)-([\d.]+) ms", said)
    assert ends and (int(ends[1]), int(ends[2])) == (round(1e3 * lo), round(1e3 * hi))
    for at, h in ((ends[3], lo), (ends[4], hi)):
        assert float(at) == pytest.approx(price(seq, h100, step_model, precision="amp-bf16",
                                                host_ms=h).iteration_ms, rel=0.01)
    given = price(seq, h100, step_model, precision="amp-bf16", host_ms=0.05)
    assert not any("machines we measured" in w for w in given.warnings)
    bare = dataclasses.replace(step_model, info={
        k: v for k, v in step_model.info.items() if k != "host_range_ms_per_kernel"})
    assert not any("machines we measured" in w
                   for w in price(seq, h100, bare, precision="amp-bf16").warnings)


def test_recomputed_nodes_run_their_forward_again_before_their_backward(step_model):
    """Checkpointing's nodes: their forward kernels priced once more in the backward, each
    just before its node's backward kernels, and issued by the host like the rest."""
    h100 = gpus.find("h100-sxm")
    seq = _seq(attention(seq=8, dim=16), batch=2)
    plain, again = [], []
    p = price(seq, h100, step_model, host_ms=0.0, kernels=plain)
    everything = price(seq, h100, step_model, host_ms=0.0, kernels=again,
                       recompute=range(seq.num_ops))
    n_fw = len(again) - len(plain)  # the forward's kernels, once more
    assert n_fw > 0 and everything.phases["recomputation"] == pytest.approx(p.phases["forward"])
    assert sorted(again) == pytest.approx(sorted(plain + plain[:n_fw]))
    assert again[:n_fw] == plain[:n_fw]  # the forward first, then the backward
    # each node's time holds its forward's second run: the operators sum to the step
    assert sum(o["ms"] for o in everything.operators) == pytest.approx(everything.iteration_ms)
    assert everything.node_ms(seq.num_ops).sum() == pytest.approx(
        p.node_ms(seq.num_ops).sum() + p.phases["forward"])
    first = min(o["index"] for o in p.operators if "index" in o)
    some = price(seq, h100, step_model, host_ms=0.0, recompute={first})
    assert 0 < some.phases["recomputation"] < p.phases["forward"]
    slow, slow_again = (price(seq, h100, step_model, host_ms=0.05, recompute=r)
                        for r in ((), range(seq.num_ops)))
    assert slow_again.iteration_ms >= slow.iteration_ms + 0.05 * n_fw  # the host issues them


def test_mfu_counts_each_flop_at_the_peak_it_can_reach(tmp_path):
    """PyTorch's cuDNN runs fp32 convolutions in TF32 on GPUs that have it: a conv net's MFU
    at fp32 is over the TF32 peak there (it was 148% of the fp32 one on an A100), never above 1
    on any catalogued GPU at any precision it has."""
    from mdot_jax import TrainingJob, predict
    from mdot_jax.gpu.peaks import peak_ms

    onnx.save(conv_bn_relu(size=64), tmp_path / "c.onnx")
    a100 = gpus.find("a100-sxm-80gb")
    p = predict(TrainingJob(model=str(tmp_path / "c.onnx"), batch_size=256, device=a100.name))
    seq = _seq(conv_bn_relu(size=64), batch=256)
    flops = seq.total("fwd_flops") + seq.total("bwd_flops")
    assert peak_ms(seq, a100, "fp32") < 1e-9 * flops / a100.tflops["fp32"]  # the TF32 peak's
    assert p.mfu == pytest.approx(peak_ms(seq, a100, "fp32") / p.iteration_ms, rel=1e-6)
    for name, gpu in gpus.catalog().items():
        for precision in ("fp32", "tf32", "amp-fp16", "amp-bf16"):
            if precision == "amp-bf16" and not gpu.tflops.get("bf16"):
                continue
            p = predict(TrainingJob(model=seq, batch_size=256, device=name,
                                    precision=precision, checkpoint="gpu-spec-sheet"))
            assert 0 < p.mfu <= 1, (name, precision)


def test_mfu_counts_the_keys_a_causal_query_needs():
    """A decoder at a long sequence is mostly attention: FlashAttention computes the keys at
    and before each query, and MFU counts those (it counted every key the graph masks: 109%
    for a 1.3B decoder at 65,536 tokens on A100s)."""
    pytest.importorskip("transformers")
    from converters import from_hf_config
    from converters.attention import attention_blocks
    from mdot_jax import TrainingJob, predict
    from mdot_jax.gpu.peaks import peak_ms

    graph = from_hf_config(dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=2,
                                vocab_size=64, n_positions=16384), seq_len=16384)
    seq = convert(graph, batch_size=1, seq_len=16384, fuse=True)
    a100, blocks = gpus.find("a100-sxm-80gb"), attention_blocks(seq)
    assert len(blocks) == 2 and all(b.causal for b in blocks)
    full, needed = peak_ms(seq, a100, "amp-bf16"), peak_ms(seq, a100, "amp-bf16", blocks)
    assert 0.5 < needed / full < 0.6  # attention, half of it counted, is most of the FLOPs
    p = predict(TrainingJob(model=seq, batch_size=1, device=a100.name, precision="amp-bf16",
                            attention="flash"))
    assert p.mfu == pytest.approx(needed / p.iteration_ms, rel=1e-6) and p.mfu < 0.8


def test_fp8_runs_the_linear_layers_at_the_fp8_peak_with_their_casts(step_model):
    """`fp8`: as amp-bf16, but each linear layer's three GEMMs at the FP8 peak (the share the
    H200's measured fp8 GEMMs reach) and six scale-and-cast kernels around it; large layers
    come out faster, the rest of the step as at amp-bf16; no fp8 GEMMs in a step model: the
    16-bit GEMMs' share of the FP8 peak, said so."""
    seq = _seq(attention(seq=2048, dim=4096), batch=4)
    h100 = gpus.find("h100-sxm")
    runs: dict = {p: [] for p in ("amp-bf16", "fp8")}
    got = {p: price(seq, h100, step_model, precision=p, kernels=runs[p]) for p in runs}
    linear = [i for i, (n, c, x) in enumerate(zip(seq.op_names, seq.config, seq.load))
              if classify(n, c, x)[1] == "linear"]
    assert len(runs["fp8"]) - len(runs["amp-bf16"]) == 6 * len(linear) > 0
    ms = {p: got[p].node_ms(seq.num_ops) for p in got}  # each node's, its casts too
    assert all(ms["fp8"][i] < ms["amp-bf16"][i] for i in linear)  # 275 GFLOP GEMMs
    assert got["fp8"].iteration_ms < got["amp-bf16"].iteration_ms
    others = [i for i in range(seq.num_ops) if i not in linear]
    assert [ms["fp8"][i] for i in others] == pytest.approx([ms["amp-bf16"][i] for i in others])
    assert got["fp8"].memory_gb == got["amp-bf16"].memory_gb
    assert any("63% of the nvidia-h100-sxm's fp8 peak" in w and "nvidia-h200-sxm's measured"
               in w for w in got["fp8"].warnings)
    bare = dataclasses.replace(step_model, info={k: v for k, v in step_model.info.items()
                                                 if k != "fp8_gemms"})  # the cached one kept
    assert any("no fp8 GEMMs measured" in w
               for w in price(seq, h100, bare, precision="fp8").warnings)
    from mdot_jax import RequestError, TrainingJob, predict

    for name in ("h100-sxm", "l4", "rtx-4090"):  # MFU over the peaks each FLOP can reach
        p = predict(TrainingJob(model=seq, batch_size=4, device=name, precision="fp8"))
        assert 0 < p.mfu <= 1, name
    with pytest.raises(RequestError) as e:  # a checkpoint measured no fp8 step
        predict(TrainingJob(model=seq, batch_size=4, precision="fp8"))
    assert e.value.field == "precision" and "spec sheet" in str(e.value)
    odd = _seq(attention(seq=64, dim=1000), batch=4)  # a width FP8 GEMMs do not take
    n = [[], []]
    price(odd, h100, step_model, precision="fp8", kernels=n[0])
    price(odd, h100, step_model, precision="amp-bf16", kernels=n[1])
    assert len(n[0]) == len(n[1])  # no casts: the linear layers stay at bf16


def test_a_model_exported_in_a_half_type_trains_in_it_unless_asked(tmp_path):
    """A graph whose weights are bf16 (a model exported after `.to(torch.bfloat16)`): priced at
    amp-bf16 where the job names no precision, its activations at the width they are trained
    in (not halved again), as its fp32 twin at amp-bf16; fp32 as asked, with a note; by a
    checkpoint, as its fp32 twin."""
    from onnx import TensorProto, helper
    from onnx_builders import model, value

    from mdot_jax import predict

    def mlp(dtype):
        m = model([helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
                   helper.make_node("Relu", ["h"], ["r"], name="act"),
                   helper.make_node("MatMul", ["r", "w2"], ["y"], name="down")],
                  [value("x", ["N", 128, 256], dtype), value("w1", [256, 1024], dtype),
                   value("w2", [1024, 256], dtype)], [value("y", None, dtype)])
        m.metadata_props.add(key="mdot.data_inputs", value="x")
        onnx.save(m, path := tmp_path / f"{dtype}.onnx")
        return path

    half, full = mlp(TensorProto.BFLOAT16), mlp(TensorProto.FLOAT)
    assert convert(half, batch_size=2).meta["half_type"] == "bf16"
    assert "half_type" not in convert(full, batch_size=2).meta

    def job(path, **kw):
        return predict(TrainingJob(model=path, batch_size=32, device="a100-sxm4-80gb",
                                   optimizer="adamw", **kw))

    default, twin = job(half), job(full, precision="amp-bf16")
    assert default.iteration_ms == pytest.approx(twin.iteration_ms)
    assert default.memory_gb == pytest.approx(twin.memory_gb, rel=1e-6)
    assert any(w.startswith("precision: amp-bf16, as the model was exported in bf16")
               for w in default.warnings)
    asked = job(half, precision="fp32")
    assert asked.iteration_ms == pytest.approx(job(full, precision="fp32").iteration_ms)
    assert any("as asked, though the model was exported in bf16" in w for w in asked.warnings)
    other = job(half, precision="amp-fp16")  # the other half type: said, priced as asked
    assert other.iteration_ms == pytest.approx(job(full, precision="amp-fp16").iteration_ms)
    assert "precision: amp-fp16 as asked, though the model was exported in bf16" in other.warnings
    assert not any("exported in" in w for w in job(half, precision="amp-bf16").warnings)
    assert not any("exported in" in w for w in job(full).warnings)
    # a checkpoint learned from fp32 exports reads a half graph at their width (a CNN's: the
    # features of its convolutions weigh the bytes; ONNX's Conv takes fp16, bf16 from opset 22)
    def cnn(dtype):
        m = model([helper.make_node("Conv", ["x", "w1"], ["h"], name="c1", kernel_shape=[3, 3]),
                   helper.make_node("Relu", ["h"], ["r"], name="act"),
                   helper.make_node("Conv", ["r", "w2"], ["y"], name="c2", kernel_shape=[3, 3])],
                  [value("x", ["N", 3, 64, 64], dtype), value("w1", [32, 3, 3, 3], dtype),
                   value("w2", [32, 32, 3, 3], dtype)], [value("y", None, dtype)])
        m.metadata_props.add(key="mdot.data_inputs", value="x")
        onnx.save(m, path := tmp_path / f"cnn{dtype}.onnx")
        return predict(TrainingJob(model=path, batch_size=32))

    on = [cnn(TensorProto.FLOAT16), cnn(TensorProto.FLOAT)]
    assert on[0].iteration_ms == pytest.approx(on[1].iteration_ms)
    assert on[0].memory_gb == pytest.approx(on[1].memory_gb)



def test_the_benchmarks_tell_a_model_with_attention_from_its_graph_not_its_name():
    """A rule of names had read every ResNet-50 as a transformer ("t5" in "resnet50")."""
    from benches import bench

    tensor_cores = bench("bench_tensor_cores")
    assert tensor_cores._kind(_seq(attention())) == "transformer"
    assert tensor_cores._kind(_seq(conv_bn_relu(training=True))) == "cnn"


def test_attention_the_model_computes_itself_is_priced_as_it_runs(tmp_path):
    """By default a block is fused where the model calls SDPA (its export says so) and runs as
    the graph shows it where its code computes softmax(Q K^T) V itself; asked, every block."""
    import torch
    from test_symbolics import _Attending

    from converters import from_torch
    from mdot_jax.serving.front import predict

    path = tmp_path / "attending.onnx"
    onnx.save(from_torch(_Attending(), torch.randn(2, 64, 16)), path)
    job = dict(model=str(path), batch_size=8, device="h100-sxm", precision="amp-bf16")
    default, eager, flash = (predict(TrainingJob(**job, attention=a)) for a in
                             (None, "eager", "flash"))
    assert any("flash for the 1 of 2 attention blocks" in w for w in default.warnings)
    assert eager.iteration_ms > default.iteration_ms > flash.iteration_ms


def test_each_class_says_what_backs_it_once(step_model):
    """One line a class of kernels: a CNN's convolutions are said as convolutions (the line
    read "matmuls and convolutions" for a model without a matmul), and a transformer's
    matmuls only by the measured GEMMs' line (it also read "not measured yet")."""
    gpu = gpus.find("h100-sxm")
    cnn = price(_seq(conv_bn_relu(training=True)), gpu, step_model, precision="amp-bf16")
    attn = price(_seq(attention()), gpu, step_model, precision="amp-bf16")
    assert any(w.startswith("amp-bf16 convolutions priced from") for w in cnn.warnings)
    assert not any("matmuls" in w for w in cnn.warnings)
    assert any("measured GEMMs reach" in w for w in attn.warnings)
    assert not any("not measured yet" in w or "convolutions" in w for w in attn.warnings)


def test_an_operator_the_converter_does_not_know_is_named_where_it_is_priced(step_model):
    """A type outside the vocabulary (Hardmax; Mask2Former's GridSample was one) was said as
    "<unk>"."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], name="hard"),
         helper.make_node("Relu", ["y"], ["z"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    seq = _seq(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    said = price(seq, gpus.find("h100-sxm"), step_model).warnings
    assert "no GPU measurements of Hardmax (1): priced as copies" in said
    assert "operators unknown to the converter (their FLOPs not counted): Hardmax (1)" in said
    assert not any("<unk>" in w for w in said)


def test_an_empty_tensor_costs_nothing(step_model):
    """A shifted window's slice of none of the frames (torchvision's Swin3D at 8 frames) has an
    empty output: its price was a log of zero work ("math domain error")."""
    from onnx import TensorProto, helper

    at = [helper.make_tensor(n, TensorProto.INT64, [1], [v])
          for n, v in (("start", 8), ("end", 8), ("axis", 1))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "start", "end", "axis"], ["none"], name="none"),
         helper.make_node("Relu", ["none"], ["shifted"], name="shifted"),
         helper.make_node("Concat", ["x", "shifted"], ["joined"], name="join", axis=1),
         helper.make_node("Relu", ["joined"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], at)
    seq = _seq(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    p = price(seq, gpus.find("h100-sxm"), step_model)
    by_name = {o["name"]: o["ms"] for o in p.operators}
    assert by_name.get("shifted", 0) == 0 and by_name["relu"] > 0 and np.isfinite(p.iteration_ms)


def _lstm(steps, batch, bidirectional=False):
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(32, 64, batch_first=True, bidirectional=bidirectional)

        def forward(self, x):  # [B, T, 32] -> [B, T, 64 D]
            return self.lstm(x)[0]

    from converters import from_torch

    return _seq(from_torch(Tagger(), torch.randn(batch, steps, 32)), batch=batch)


def test_a_recurrent_layer_runs_its_steps_one_after_another(step_model):
    """An LSTM was priced as a copy of its largest tensor, its steps' GEMMs unpriced."""
    from mdot_jax.gpu.recurrent import kept_bytes, kernels

    h100 = gpus.find("h100-sxm")
    v100 = gpus.find("v100-sxm2-32gb")  # no TF32: its fp32 GEMMs on CUDA cores, a step's each
    short, long = (price(_lstm(t, 1024 // t), v100, step_model) for t in (8, 128))
    assert long.iteration_ms > 4 * short.iteration_ms  # as many tokens, 16x the steps
    assert long.interval_ms is None  # not measured: no band
    said = next(w for w in long.warnings if w.startswith("recurrent layers (1 LSTM)"))
    assert "priced as copies" not in " ".join(long.warnings) and "not measured" in said
    # the forward's GEMMs do the layer's FLOPs; two directions, twice the steps
    seq = _lstm(16, 4, bidirectional=True)
    i = seq.op_names.tolist().index("LSTM")
    fw = [(dims, n) for phase, op, dims, n in kernels("LSTM", seq.config[i], True, True)
          if phase == "fw" and op == "linear"]
    assert sum(2 * np.prod(d) * n for d, n in fw) == seq.load[i, 0]
    assert fw[1][1] == 2 * 16
    # every step's gates kept for the backward: 16 steps x 4 x 2 directions x 4 gates x 64
    gates = kept_bytes("LSTM", seq.config[i])
    assert gates == 4.0 * 16 * 4 * 2 * 4 * 64
    assert price(seq, h100, step_model).memory_parts["activations"] >= gates / 1e9


def test_an_fp32_recurrent_layers_gemms_run_in_tf32_where_the_gpu_has_it(step_model):
    """cuDNN runs an fp32 LSTM's GEMMs in TF32 by PyTorch's default: priced at fp32 on CUDA
    cores, an H100's measured LSTMs were 2.9x slower than priced (docs/studies/whole-layers.md)."""
    import dataclasses

    seq = _lstm(64, 16)
    cuda_cores = dataclasses.replace(step_model, info={  # no tensor-core GEMMs to price them
        k: v for k, v in step_model.info.items() if k != "tensor_core_gemms"})

    def lstm_ms(precision, model=step_model):
        p = price(seq, gpus.find("h100-sxm"), model, precision=precision)
        return sum(o["ms"] for o in p.operators if o["type"] == "LSTM")

    assert lstm_ms("fp32") == pytest.approx(lstm_ms("tf32"))
    assert lstm_ms("fp32", cuda_cores) > 1.5 * lstm_ms("fp32")


def test_predict_plots_throughput_and_memory_over_the_sizes_asked(capsys, tmp_path,
                                                                   monkeypatch):
    """`--plot` draws samples/s (tokens/s for a token model) and memory a GPU against the
    batch sizes or GPU counts asked, the GPU's memory and the steps past it; a single
    prediction, where its time and memory go; a format matplotlib does not write, an existing
    file: one line, said before any pricing, nothing written."""
    from mdot_jax.serving import figures

    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    args = ["predict", model, "--device", "t4", "--batch-sizes", "8,4194304"]
    drawn = []
    real = figures.save
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig) or real(fig, path))
    code, out, _ = run(capsys, *args, "--plot", tmp_path / "b.png", "--json")
    rows = json.loads(out)
    speed, memory = drawn[0].axes
    assert code == 0 and (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert list(speed.lines[0].get_xdata()) == [8, 4194304]
    assert list(speed.lines[0].get_ydata()) == pytest.approx([r["samples_per_s"] for r in rows])
    assert list(memory.lines[0].get_ydata()) == pytest.approx([r["memory_gb"] for r in rows])
    assert memory.lines[1].get_ydata()[0] == 16  # the T4's memory, and the step past it marked
    assert [r["memory_gb"] > 16 for r in rows] == [False, True] and memory.collections
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "m.onnx"]
    for extra, needle in ((["--plot", tmp_path / "b.png"], "exists; --force"),
                          (["--plot", tmp_path / "c.txt"], "matplotlib writes no .txt")):
        code, out, err = run(capsys, *args, *extra)
        assert code == 2 and needle in err and err.count("\n") == 1 and not out, err
    code, out, _ = run(capsys, "predict", model, "--device", "h100-sxm", "--batch-size", "8",
                       "--gpus", "1,2,4", "--plot", tmp_path / "b.png", "--force")
    assert code == 0 and f"wrote {tmp_path / 'b.png'}" in out
    assert list(drawn[1].axes[0].lines[0].get_xdata()) == [1, 2, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "m.onnx"]
    # one prediction: where its iteration and its memory go, its costliest operators with --top
    code, out, _ = run(capsys, "predict", model, "--device", "t4", "--batch-size", "4194304",
                       "--top", "3", "--plot", tmp_path / "b.png", "--force", "--json")
    p = json.loads(out)
    time, memory, ops = drawn[2].axes
    assert [b.get_width() for b in time.patches] == pytest.approx(list(p["phases"].values()))
    assert sum(b.get_width() for b in memory.patches) == pytest.approx(p["memory_gb"])
    assert memory.lines[0].get_xdata()[0] == 16 and "does not fit" in memory.get_title()
    assert len(ops.patches) == 3 and ops.patches[0].get_width() == max(
        b.get_width() for b in ops.patches)


def test_one_prediction_without_phases_is_drawn_as_its_iteration_and_band(tmp_path, monkeypatch):
    """A checkpoint's prediction has no phases: one bar, its 80% band, memory by part."""
    from mdot_jax.serving import figures
    from mdot_jax.serving.prediction import Prediction

    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    p = Prediction(iteration_ms=165.0, device="rtx3090", num_ops=1, interval_ms=(138.0, 188.0),
                   memory_gb=6.2, memory_limit_gb=24.0, batch_size=128,
                   memory_parts={"model_states": 0.3, "activations": 5.5, "working": 0.4})
    figures.step(p, tmp_path / "s.png", "resnet50", top=10)  # no operators: no third panel
    time, memory = drawn[0].axes
    assert [b.get_width() for b in time.patches] == [165.0] and time.containers[-1].has_xerr
    assert [b.get_width() for b in memory.patches] == pytest.approx([0.3, 5.5, 0.4])
    assert "does not fit" not in memory.get_title()
    figures.pyplot().close(drawn[0])


def test_one_prediction_draws_at_most_the_operators_a_figure_names_legibly(tmp_path,
                                                                            monkeypatch):
    """`--top 70` listed 70 operators and drew 70 names over each other in 3.8 inches."""
    from mdot_jax.serving import figures
    from mdot_jax.serving.prediction import Prediction

    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    ops = [dict(type="Add", name=f"/add_{i}", ms=100.0 - i, index=i) for i in range(40)]
    p = Prediction(iteration_ms=sum(o["ms"] for o in ops), device="nvidia-h100-sxm", num_ops=40,
                   operators=ops, phases={"forward": 3000.0, "backward": 1000.0 - 780.0})
    figures.step(p, tmp_path / "s.png", top=35)
    bars = drawn[0].axes[2]
    assert len(bars.patches) == figures.DRAWN < 35 and "(of 35 listed)" in bars.get_title()
    assert bars.patches[0].get_width() == 100.0 and drawn[0].get_figheight() > 3.8
    figures.pyplot().close(drawn[0])


@pytest.mark.parametrize("lo,hi,ticks", [
    (15_600, 207_000, [20_000, 50_000, 100_000, 200_000]),  # 1, 2, 5 a decade
    (8.9, 23.0, [10, 15, 20]),  # less than a decade: finer
    (67.1, 71.1, [67, 68, 70, 71])])  # narrower still: four steps across, two figures
def test_a_log_axis_is_ticked_in_plain_numbers_within_its_range(lo, hi, ticks):
    """A log axis spanning under a decade read "10^5" alone, or "7.1 x 10^1" on each tick."""
    from mdot_jax.serving import figures

    fig, ax = figures.pyplot().subplots()
    ax.plot([1, 2], [lo, hi])
    figures.plain_log(ax.yaxis, [lo, hi])
    assert ax.get_yscale() == "log" and list(ax.get_yticks()) == pytest.approx(ticks)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{t:,}" for t in ticks]
    figures.pyplot().close(fig)
