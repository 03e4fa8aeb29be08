"""Bad input: one line on stderr naming the problem, exit code 2, never a traceback."""

import json
import re
from pathlib import Path

import onnx
import pytest
from onnx import helper
from onnx_builders import conv_bn_relu, model, value

from mdot_jax.cli import main
from mdot_jax.readable import gigabytes, hours, number, percent, span
from mdot_jax.serving.predict import CHECKPOINT_DIR as CHECKPOINTS


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _cycle():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second")]
    return model(nodes, [value("x", [2])], [value("b", None)])


def _empty():
    return model([], [value("x", [2])], [value("x", None)])


def _bad_metadata(key, value):
    m = conv_bn_relu()
    m.metadata_props.add(key=key, value=value)  # a file edited by hand
    return m


@pytest.fixture
def files(tmp_path):
    good = conv_bn_relu().SerializeToString()
    paths = {
        "text": b"this is not an onnx model\n",
        "truncated": good[: len(good) // 2],
        "empty_file": b"",
        "symbolic": good,
        "cycle": _cycle().SerializeToString(),
        "empty_graph": _empty().SerializeToString(),
        "metadata_not_json": _bad_metadata("mdot.unread", "{not json").SerializeToString(),
        "metadata_not_numbers": _bad_metadata("mdot.sdpa_softmax", "x,1").SerializeToString(),
    }
    for name, data in paths.items():
        (tmp_path / f"{name}.onnx").write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("name,args,needle", [
    ("text", [], "not an ONNX model"),
    ("truncated", [], "not an ONNX model or truncated"),
    ("empty_file", [], "empty file"),
    ("symbolic", [], "input 'x' dim 0 ('N') is symbolic; pass --input-shape x=1,3,8,8"),
    ("symbolic", ["--input-shape", "x=1,3"], "input 'x' has rank 4"),
    ("symbolic", ["--input-shape", "nope=1"], "unknown input(s) ['nope']"),
    ("symbolic", ["--input-shape", "x"], "expected NAME=D1,D2"),
    ("cycle", [], "cycle through node"),
    ("empty_graph", [], "the graph is empty"),
    ("metadata_not_json", [], "a damaged ONNX file (metadata 'mdot.unread' is not JSON"),
    ("metadata_not_numbers", [], "metadata 'mdot.sdpa_softmax' is not a list of numbers"),
    ("missing", [], "no such file"),
    ("/dev/zero", [], "not a regular file"),
])
def test_bad_input_is_one_line(capsys, files, name, args, needle):
    path = name if name.startswith("/") else str(files / f"{name}.onnx")
    code, out, err = run(capsys, "convert", path, *args)
    assert code == 2, err
    assert err.startswith("mdot: error: ") and err.count("\n") == 1, err
    assert needle in err
    assert path in err or "input" in err or "graph" in err


@pytest.mark.parametrize("flags,needle", [
    (["--ops-more", "10"], "--ops-more and --ops-kinds go together"),
    (["--ops-kinds", "Add"], "--ops-more and --ops-kinds go together"),
])
def test_ops_flags_that_do_not_go_together(capsys, tmp_path, flags, needle):
    code, _, err = run(capsys, "profile", "--ops", "--out", str(tmp_path / "ops"), *flags)
    assert code == 2 and err.count("\n") == 1
    assert needle in err
    assert not (tmp_path / "ops").exists()  # refused before anything was written


def test_a_directory_is_named_with_the_models_it_holds(capsys, files):
    code, _, err = run(capsys, "predict", str(files), "--batch-size", "2")
    assert code == 2 and err.count("\n") == 1
    assert f"{files}: is a directory; give an .onnx file (it holds cycle.onnx" in err


def test_convert_json_and_table(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    code, out, _ = run(capsys, "convert", str(path), "--batch-size", "2", "--json",
                       "-o", str(tmp_path / "m.npz"))
    summary = json.loads(out)
    assert code == 0 and summary["num_ops"] == 3
    assert summary["flops"] == 2 * 512 * 27 + 8 * 512 + 512  # BN read in training mode
    assert summary["params"] == 116 and summary["unknown_ops"] == {}
    assert summary["op_types"] == {"BatchNormalization": 1, "Conv": 1, "Relu": 1}
    assert (tmp_path / "m.npz").exists()
    code, out, _ = run(capsys, "convert", str(path), "--batch-size", "2")
    assert code == 0 and "3 operators" in out and "Conv" in out and ", 116 parameters" in out


def test_predict_json_with_job_time_and_warnings(capsys, tmp_path):
    """`mdot predict --json` on the shipped CPU checkpoint: iteration and job time; an 8 px
    input (the checkpoint saw larger ones) is flagged as extrapolation on stderr and in JSON."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(training=True), path)
    code, out, err = run(capsys, "predict", str(path), "--batch-size", "4", "--checkpoint",
                         "cpu-amd-epyc-f26m2-2t", "--epochs", "2", "--dataset-size", "10", "--json")
    result = json.loads(out)
    assert code == 0 and result["device"] == "cpu-amd-epyc-f26m2-2t" and result["num_ops"] == 3
    assert result["iteration_ms"] > 0
    assert result["job_s"] == pytest.approx(result["iteration_ms"] * 3 * 2 / 1e3)  # ceil(10/4)
    assert any("input size 8 is outside" in w for w in result["warnings"])
    assert "mdot: warning: input size 8" in err
    assert result["interval_ms"] is None  # no band for an extrapolation
    # a dataset's size as a count is typed: 1.28e6 as --tokens takes 2e12; a fraction is none
    args = ["predict", str(path), "--batch-size", "4", "--checkpoint", "cpu-amd-epyc-f26m2-2t",
            "--epochs", "2", "--json", "--dataset-size"]
    assert json.loads(run(capsys, *args, "1.28e6")[1])["job_s"] == pytest.approx(
        json.loads(run(capsys, *args, "1280000")[1])["job_s"])
    code, _, err = run(capsys, *args, "1.5e0")
    assert code == 2 and "--dataset-size: expected a positive whole number, got '1.5e0'" in err


@pytest.mark.parametrize("share, shown", [(0.706, "71%"), (0.1, "10%"), (0.0934, "9.3%"),
                                          (0.0034, "0.34%"), (0.01, "1.0%"),
                                          (0.0, "0%")])
def test_a_small_share_is_shown_to_two_figures_not_as_none(share, shown):
    assert percent(share) == shown


@pytest.mark.parametrize("x, figures, shown", [(22260.4, 4, "22,260"), (1575.2, 4, "1,575"),
                                               (22.754, 4, "22.75"), (0.04166, 3, "0.0417"),
                                               (1040.0, 3, "1,040"), (99.94, 3, "99.9")])
def test_numbers_are_never_in_scientific_notation(x, figures, shown):
    assert number(x, figures) == shown
    assert "e+" not in hours(x) and hours(2e7) == ">10,000,000" and hours(1e-4) == "<0.001"
    # activations freed by the update: a few kilobytes read "2.05e-06 GB"
    assert gigabytes(2.05e-6) == "<0.001" and gigabytes(0.0) == "0" and gigabytes(x) == number(x)


def test_a_band_whose_ends_read_alike_is_written_once():
    assert span(2e7, 3e7, hours) == ">10,000,000" and span(1e-4, 2e-3, hours) == "<0.001-0.002"
    assert span(544.2, 708.4) == "544-708"


def test_predict_several_batch_sizes(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(training=True), path)
    args = ["predict", str(path), "--batch-sizes", "2,8,32", "--checkpoint",
            "cpu-amd-epyc-f26m2-2t", "--image-size", "64"]
    code, out, _ = run(capsys, *args, "--json")
    rows = json.loads(out)
    assert code == 0 and [r["batch_size"] for r in rows] == [2, 8, 32]
    assert all(r["samples_per_s"] == pytest.approx(1e3 * r["batch_size"] / r["iteration_ms"])
               for r in rows)
    code, out, err = run(capsys, *args)
    assert code == 0 and len(out.splitlines()) == 6 and "samples/s" in out
    assert out.splitlines()[-1].startswith("at batch 32, memory at its peak (in the backward): "
                                           "weights, gradients")
    # one conv block: faster than any step the checkpoint trained on, each batch said, unbanded
    said = [line for line in err.splitlines() if "faster than every step" in line]
    assert [line.split(":")[2] for line in said] == [f" batch size {b} x 1 GPUs" for b in
                                                     (2, 8, 32)], err
    assert "80% band:" not in out and all(r["interval_ms"] is None for r in rows)
    # the parts and the header name the shipped pair's members
    assert all(set(r["parts"]) == {"gnn", "lightgbm"} for r in rows)
    assert "geometric mean of GNN x LightGBM)" in out.splitlines()[0]
    code, _, err = run(capsys, "predict", str(path), "--checkpoint", "cpu-amd-epyc-f26m2-2t")
    assert code == 2 and "--batch-size (or --batch-sizes) is required" in err


def test_calibrate_refuses_what_it_cannot_use(capsys, tmp_path):
    """`mdot calibrate` names the problem in one line and leaves the checkpoint as it was."""
    data = CHECKPOINTS.parent / "data" / "cpu-amd-epyc-f26m2-2t"
    code, _, err = run(capsys, "calibrate", "cpu-amd-epyc-f26m2-2t", "--results", str(tmp_path),
                       "--dataset", str(data))
    assert code == 2 and err == f"mdot: error: {tmp_path}: no evaluation results\n"
    before = (CHECKPOINTS / "cpu-amd-epyc-f26m2-2t" / "metadata.json").read_text()
    (tmp_path / "results.jsonl").write_text(json.dumps(dict(
        method="mdot-pe-none", seed=0, fold=0, split="family", dataset="0" * 16,
        test_keys=[], pred_ms=[])))
    code, _, err = run(capsys, "calibrate", "cpu-amd-epyc-f26m2-2t", "--results", str(tmp_path),
                       "--dataset", str(data))
    assert code == 2 and "not of one dataset" in err and err.count("\n") == 1
    assert (CHECKPOINTS / "cpu-amd-epyc-f26m2-2t" / "metadata.json").read_text() == before


def test_dataset_timm_checks_its_csvs_before_building(capsys, tmp_path):
    (tmp_path / "other.csv").write_text("model,infer_step_time\nresnet18,1.0\n")
    for csv, needle in [("missing.csv", "missing.csv: no such CSV file"),
                        ("other.csv", "other.csv: not a timm training benchmark")]:
        code, _, err = run(capsys, "dataset", "timm", "--csv", str(tmp_path / csv),
                           "--out", str(tmp_path / "ds"))
        assert code == 2 and err.startswith("mdot: error: ") and err.count("\n") == 1, err
        assert needle in err
    assert not (tmp_path / "ds").exists()  # nothing started


def _image_plus_side_input():
    """x [N,3,H,W] convolved and pooled, concatenated with a side input a_meta [N,16] (named
    to sort first, as alphabetical order once picked it for the input size)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Concat", ["f", "a_meta"], ["y"], name="cat", axis=1)]
    m = model(nodes, [value("x", ["N", 3, "H", "W"]), value("w", [4, 3, 3, 3]),
                      value("a_meta", ["N", 16])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x,a_meta")
    return m


def test_the_input_size_comes_from_the_image_not_a_side_input(capsys, tmp_path):
    path = tmp_path / "two.onnx"
    onnx.save(_image_plus_side_input(), path)
    code, _, err = run(capsys, "convert", str(path), "--batch-size", "2")
    assert code == 2 and "input 'x' dim 2 ('H') is symbolic; pass --image-size N" in err
    code, out, err = run(capsys, "predict", str(path), "--batch-size", "2", "--image-size", "64",
                         "--checkpoint", "cpu-amd-epyc-f26m2-2t", "--json")
    assert code == 0, err
    assert not any("input size" in w for w in json.loads(out)["warnings"])  # 64 px, not 16


def test_input_shape_and_batch_size_that_disagree_are_an_error(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    code, _, err = run(capsys, "predict", str(path), "--input-shape", "x=8,3,8,8",
                       "--batch-size", "64", "--checkpoint", "cpu-amd-epyc-f26m2-2t")
    assert code == 2 and err.count("\n") == 1
    assert "--input-shape gives batch 8 but --batch-size is 64" in err


@pytest.mark.parametrize("size,error", [("16", "--input-shape gives 8x8 but --image-size is 16"),
                                        ("8", None)])
def test_input_shape_and_image_size_that_disagree_are_an_error(capsys, tmp_path, size, error):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    code, _, err = run(capsys, "convert", str(path), "--input-shape", "x=2,3,8,8",
                       "--image-size", size)
    if error:
        assert code == 2 and error in err and err.count("\n") == 1
    else:
        assert code == 0, err


def test_a_graph_of_operators_the_converter_does_not_know_is_named(capsys, tmp_path):
    """Every operator unknown and unshaped (a custom domain's): the step priced at 0 ms, and
    its MFU divided by it (a ZeroDivisionError's traceback)."""
    graph = model([helper.make_node("FancyOp", ["x"], ["y"], domain="com.me")],
                  [value("x", ["N", 8])], [value("y", ["N", 8])])
    graph.opset_import.append(helper.make_opsetid("com.me", 1))
    onnx.save(graph, tmp_path / "m.onnx")
    code, _, err = run(capsys, "predict", str(tmp_path / "m.onnx"), "--batch-size", "4",
                       "--device", "h100-sxm")
    assert code == 2 and err.count("\n") == 1
    assert "no operator the converter knows depends on the inputs (only FancyOp)" in err


def test_a_graph_holding_its_backward_already_is_named_so(capsys, tmp_path):
    """onnxruntime-training's training_model.onnx (gradient operators, accumulators) priced as a
    forward would count its backward twice; it is refused saying what to give instead."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["y"], name="relu"),
             helper.make_node("ReluGrad", ["y", "y"], ["dh"], name="relu_Grad/ReluGrad_0",
                              domain="com.microsoft"),
             helper.make_node("Transpose", ["x"], ["xt"], name="fc_Grad/Transpose_0"),
             helper.make_node("MatMul", ["xt", "dh"], ["w_grad"], name="fc_Grad/MatMul_1")]
    graph = model(nodes, [value("x", ["N", 16]), value("w", [16, 8])],
                  [value("y", ["N", 8]), value("w_grad", [16, 8])])
    graph.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(graph, tmp_path / "training_model.onnx")
    code, _, err = run(capsys, "predict", str(tmp_path / "training_model.onnx"),
                       "--batch-size", "4", "--device", "h100-sxm")
    assert code == 2 and err.count("\n") == 1
    assert "the graph holds its backward already (onnxruntime-training's gradient operators: " \
           "ReluGrad); give the forward graph it was built from" in err


def test_an_input_shape_whose_channels_the_graph_cannot_take_is_named(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    code, _, err = run(capsys, "convert", str(path), "--input-shape", "x=2,5,8,8")
    assert code == 2 and err.count("\n") == 1
    assert "node 'conv' (Conv): its input has 5 channels, its weight [4, 3, 3, 3]" in err


def test_gpu_fit_refuses_host_steps_without_their_gpu(capsys, tmp_path):
    code, _, err = run(capsys, "gpu-fit", str(tmp_path), "--out", str(tmp_path / "m"),
                       "--host-steps", str(tmp_path))
    assert code == 2 and "--host-device" in err and err.count("\n") == 1
    code, _, err = run(capsys, "gpu-fit", str(tmp_path), "--out", str(tmp_path / "m"),
                       "--pricer", "forest")
    assert code == 2 and "--pricer" in err


def neusight_folder(root: Path) -> str:
    """A folder laid out as NeuSight's, with no rows: what `gpu-fit` checks before its --out."""
    for sub in ("ops/train/collect", "ops/test"):
        (root / "neusight" / sub).mkdir(parents=True)
    return str(root / "neusight")


def test_gpu_fit_on_a_wrong_folder_leaves_nothing_behind(capsys, tmp_path, monkeypatch):
    """Its --out defaults to checkpoints/gpu-spec-sheet: a folder that is not NeuSight's was
    refused after that folder's parent had been made where the user stood."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "gpu-fit", str(tmp_path / "nowhere"))
    assert code == 2 and err.count("\n") == 1 and "not NeuSight's folder" in err
    assert not list(tmp_path.iterdir())


def test_gpu_fit_never_replaces_a_folder_that_is_not_a_step_model(capsys, tmp_path):
    """`--force` replaced "the step model in" any non-empty folder: it wrote its files among
    the folder's own, and a kill left half a step model."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    code, _, err = run(capsys, "gpu-fit", neusight_folder(tmp_path), "--out", str(mine),
                       "--force")
    assert code == 2 and err.count("\n") == 1 and "not empty and not a checkpoint" in err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("flag", ["--unaligned-gemms", "--fused-attention", "--fp8-gemms",
                                  "--streaming-kernels"])
def test_gpu_fit_says_a_sweep_that_cannot_fit_its_key_before_fitting(capsys, tmp_path, flag):
    """Each sweep-fitted key of the step model: no sweep, or one without its kernels."""
    other = tmp_path / "other.jsonl"  # a sweep of none of those kernels
    other.write_text(json.dumps(dict(kind="lstm-train", precision="bf16", dims=[1, 1, 1, 1],
                                     ms=1.0, flops=1.0, device="NVIDIA H100 80GB HBM3")) + "\n")
    neusight = neusight_folder(tmp_path)
    for sweep, needle in ((tmp_path / "none.jsonl", "none.jsonl: no kernel sweep"),
                          (other, "")):
        code, out, err = run(capsys, "gpu-fit", neusight, "--out",
                             str(tmp_path / "m"), flag, str(sweep))
        assert code == 2 and err.count("\n") == 1 and needle in err and not out
        assert not (tmp_path / "m").exists()


def test_a_refitted_step_model_replaces_the_old_one_whole(tmp_path):
    from mdot_jax.errors import MdotError
    from mdot_jax.gpu import spec_sheet
    from mdot_jax.storage import checkpoint

    model = spec_sheet.load_step_model(spec_sheet.step_model_dir("gpu-spec-sheet"))
    out = tmp_path / "sm"
    for force in (False, True):  # a new folder, then the step model there, with --force
        checkpoint.save_step_model(model, checkpoint.prepare_out(out, force=force, shipped=True))
    with pytest.raises(MdotError, match="holds a checkpoint; --force replaces it"):
        checkpoint.prepare_out(out, shipped=True)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no temporary left
    assert spec_sheet.load_step_model(out).info == model.info


@pytest.mark.parametrize("row,needle", [
    ("sm_90,1,2,2,2,f8xf8->f8,1", "matmul.csv:2: dtype 'f8xf8->f8'"),
    ("sm_90,1,x,2,2,bf16xbf16->bf16,1", "matmul.csv:2: b, m, n, k must be integers"),
    ("sm_90,1,2,2,2,bf16xbf16->bf16,0", "matmul.csv:2: b, m, n, k and flops_per_s must be")])
def test_gpu_fit_names_the_bad_row_of_a_gemm_table_before_fitting(capsys, tmp_path, row,
                                                                  needle):
    (tmp_path / "matmul.csv").write_text(f"gpu_key,b,m,n,k,dtype,flops_per_s\n{row}\n")
    code, out, err = run(capsys, "gpu-fit", neusight_folder(tmp_path), "--out",
                         str(tmp_path / "m"), "--tensor-core-gemms", str(tmp_path))
    assert code == 2 and needle in err and err.count("\n") == 1 and not out


@pytest.mark.parametrize("message,field,said", [
    ("train_tokens: the job is epochs x dataset_size or a number of tokens, not both",
     "train_tokens", "--tokens: the job is --epochs x --dataset-size or a number of tokens"),
    ("global_batch: searches the layouts; give no grad_accum of your own", "global_batch",
     "--global-batch: searches the layouts; give no --grad-accum of your own"),
    ("tp 3: tp x pp (3 x 1) does not divide the 8 GPUs", "tp",
     "--tp 3: --tp x --pp (3 x 1) does not divide the 8 GPUs"),
    # a value that reads like a field stays as given; words that are not fields stay words
    ("attention 'flash_x': choose from ['flash', 'eager']", "attention",
     "--attention 'flash_x': choose from ['flash', 'eager']"),
    ("model 'm.onnx': the model's 4 attention heads, one_line", "model",
     "MODEL 'm.onnx': the model's 4 attention heads, one_line"),
    # a config's field, dotted, is the config's (it read "vision_config.--image-size")
    ("m.json: gives no vision_config.image_size: set it", "", "m.json: gives no "
     "vision_config.image_size: set it"),
])
def test_a_library_error_names_flags_on_the_command_line(message, field, said):
    from mdot_jax.cli_args import as_flags

    assert as_flags(message, field).startswith(said)


def test_a_port_out_of_range_is_one_line_and_the_version_is_said(capsys):
    code, out, err = run(capsys, "serve", "--port", "99999")  # was bind()'s OverflowError
    assert code == 2 and err.count("\n") == 1 and "expected a port, 1-65535, got '99999'" in err
    from mdot_jax import __version__

    assert run(capsys, "--version")[:2] == (0, f"mdot {__version__}\n")


def test_a_cpu_named_as_the_device_is_a_cpu_checkpoints(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    code, _, err = run(capsys, "predict", str(path), "--batch-size", "2", "--device", "cpu")
    assert code == 2 and err.count("\n") == 1
    assert "a CPU is predicted by a checkpoint measured on one" in err and "cpu-amd-" in err
    code, out, err = run(capsys, "predict", str(path), "--batch-size", "2", "--device", "cpu",
                         "--checkpoint", "cpu-amd-epyc-f26m2-2t", "--json")
    assert code == 0, err
    assert json.loads(out)["device"] == "cpu-amd-epyc-f26m2-2t"


def test_an_error_in_a_configs_graph_names_the_config(capsys, tmp_path):
    pytest.importorskip("transformers")
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(dict(model_type="llama", hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      vocab_size=100)))
    code, _, err = run(capsys, "convert", str(config), "--seq-len", "8", "--batch-size", "2",
                       "--image-size", "8")
    assert code == 2 and err.startswith(f"mdot: error: {config}: --image-size 8 does not apply")
    code, _, err = run(capsys, "predict", str(config), "--seq-len", "8", "--batch-size", "2",
                       "--input-shape", "input_ids=2,4", "--device", "h100-sxm")
    assert code == 2 and f"{config}: input 'input_ids': --input-shape gives 4" in err


@pytest.mark.parametrize("flag,value,needle", [
    ("--attention", "sdpa", "transformers' sdpa is PyTorch's scaled_dot_product_attention: flash"),
    ("--strategy", "zero3", "ZeRO stage 3 shards the weights too: fsdp"),
    ("--activation-checkpointing", "none", "none: leave it out"),
])
def test_a_value_in_another_tools_words_is_told_ours(capsys, flag, value, needle):
    """The CLI and the library say alike what a value from transformers' or DeepSpeed's
    vocabulary is called here."""
    from mdot_jax.errors import RequestError
    from mdot_jax.serving.request import TrainingJob

    code, _, err = run(capsys, "predict", "model.onnx", "--batch-size", "2", flag, value)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    field = flag[2:].replace("-", "_")
    with pytest.raises(RequestError, match=re.escape(needle)):
        TrainingJob(model="model.onnx", batch_size=2, **{field: value})


@pytest.mark.parametrize("command", ["convert", "predict", "plan"])
@pytest.mark.parametrize("seq_len,batch,needle", [
    ("99999999", "2", "99,999,999 tokens: at most 4,194,304 (the conversion holds each position)"),
    ("64", "99999999", "--batch-size 99,999,999 x --seq-len 64: 6,399,999,936 tokens a "
     "micro-batch, more than 33,554,432 (the conversion holds each)")])
def test_a_sequence_too_long_to_convert_is_refused_before_it_runs_out_of_memory(
        capsys, command, seq_len, batch, needle):
    """100 million tokens a sequence, or a micro-batch, ran the conversion's shape inference
    out of memory (the process killed, nothing said): every command refuses it in one line."""
    code, _, err = run(capsys, command, "model.onnx", "--seq-len", seq_len, "--batch-size", batch)
    assert code == 2 and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize("argv, said", [
    (["predict", "m.onnx", "--batchsize", "4"],
     "unrecognized arguments: --batchsize 4; did you mean --batch-size? (see `mdot predict "
     "--help`)"),
    (["plan", "m.onnx", "--deadline-h=3"], "did you mean --deadline? (see `mdot plan --help`)"),
    (["predict", "m.onnx", "extra"], "unrecognized arguments: extra (see `mdot predict --help`)"),
    (["predict", "m.onnx", "--batch-size", "1,2"],
     "got '1,2'; several: --batch-sizes 1,2 (see `mdot predict --help`)"),
    (["predict", "m.onnx", "--seq-len", "1,2"], "got '1,2' (see `mdot predict --help`)"),
])
def test_a_misspelt_flag_is_said_by_its_command_with_the_nearest(capsys, argv, said):
    """An argument no flag takes was said by `mdot`'s own parser (`see mdot --help`, which
    lists commands, not flags), with no hint of the flag meant."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and said in err
