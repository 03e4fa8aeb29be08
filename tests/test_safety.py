"""Nothing lost, nothing silently wrong: each case a careless user hit, turned into a test of
the clean one-line message or of the data that survives it."""

import json
import lzma
import shutil
import time
from pathlib import Path

import onnx
import pytest
from onnx_builders import conv_bn_relu
from test_data import make_dataset

from mdot_jax.cli import main
from mdot_jax.data.dataset import NOISY, REJECTED, load_dataset
from mdot_jax.data.store import DatasetWriter, check_dataset, writer_lock
from mdot_jax.errors import CheckpointError, DatasetError, RequestError
from mdot_jax.serving.predict import CHECKPOINT_DIR
from mdot_jax.storage import checkpoint
from mdot_jax.storage.shipped import resolve_checkpoint

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2 and err.startswith("mdot: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


# ---------------------------------------------------------------------------- datasets
BAD_LINES = {  # what goes wrong in a samples.jsonl -> what `check` says
    "nan": ('{"key": "n/b2", "arch": "n", "seq": "seqs/a1.npz", "label_ms": NaN, '
            '"workload": {"batch_size": 2, "input_size": 32}}', "'label_ms' is nan"),
    "zero": ('{"key": "z/b2", "arch": "z", "seq": "seqs/a1.npz", "label_ms": 0, '
             '"workload": {"batch_size": 2, "input_size": 32}}', "'label_ms' is 0"),
    "negative": ('{"key": "m/b2", "arch": "m", "seq": "seqs/a1.npz", "label_ms": -5, '
                 '"workload": {"batch_size": 2, "input_size": 32}}', "'label_ms' is -5"),
    "inf": ('{"key": "i/b2", "arch": "i", "seq": "seqs/a1.npz", "label_ms": Infinity, '
            '"workload": {"batch_size": 2, "input_size": 32}}', "'label_ms' is inf"),
    "missing_label": ('{"key": "l/b2", "arch": "l", "seq": "seqs/a1.npz", '
                      '"workload": {"batch_size": 2, "input_size": 32}}',
                      "'label_ms' is missing"),
    "unknown_workload_key": ('{"key": "u/b2", "arch": "u", "seq": "seqs/a1.npz", '
                             '"label_ms": 3, "workload": {"batch_size": 2, "input_size": 32, '
                             '"gpus": 8}}', "unknown workload field(s) ['gpus']"),
    "not_an_object": ('[1, 2, 3]', "not a JSON object but list"),
    "torn_middle": ('{"key": "t/b2", "arch": "t", "se', "not JSON"),
    "duplicate": ('{"key": "a1/b2", "arch": "a1", "seq": "seqs/a1.npz", "label_ms": 999, '
                  '"workload": {"batch_size": 2, "input_size": 32}}',
                  "duplicate key 'a1/b2' (first on line 1, label 2.0 there)"),
}


def _with_bad_line(root: Path, name: str) -> int:
    make_dataset(root, archs=("a1", "a2"), batches=(2, 4))
    path = root / "samples.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, BAD_LINES[name][0])
    path.write_text("\n".join(lines) + "\n")
    return 3  # its line number


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_dataset_check_names_every_bad_line_and_training_refuses_it(capsys, tmp_path, name):
    lineno = _with_bad_line(tmp_path, name)
    before = (tmp_path / "samples.jsonl").read_bytes()
    code, out, _ = run(capsys, "dataset", "check", tmp_path)
    assert code == 1 and f"line {lineno}: {BAD_LINES[name][1]}" in out
    with pytest.raises(DatasetError, match=f"line {lineno}: "):
        load_dataset(tmp_path)
    t0 = time.perf_counter()
    code, _, err = run(capsys, "train", "--dataset", tmp_path, "--out", tmp_path / "ckpt",
                       "--recipe", "tiny")
    one_line_error(code, err, f"line {lineno}", "mdot dataset check")
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "ckpt").exists()
    code, _, err = run(capsys, "dataset", "info", tmp_path)
    one_line_error(code, err, f"line {lineno}")
    assert (tmp_path / "samples.jsonl").read_bytes() == before  # reading changes nothing


def test_dataset_check_fix_moves_bad_lines_aside_and_deletes_nothing(capsys, tmp_path):
    _with_bad_line(tmp_path, "nan")
    with open(tmp_path / "samples.jsonl", "a") as f:
        f.write(BAD_LINES["duplicate"][0] + "\n")
    (tmp_path / "seqs" / "a2.npz").unlink()  # two samples lose their sequence
    code, out, _ = run(capsys, "dataset", "check", tmp_path, "--fix")
    assert code == 0 and "4 problems; moved to" in out
    rejected = [json.loads(x) for x in (tmp_path / REJECTED).read_text().splitlines()]
    assert [r["line"] for r in rejected] == [3, 4, 5, 6]
    assert "NaN" in rejected[0]["text"] and "sequence file seqs/a2.npz" in rejected[1]["reason"]
    assert '"a2/b2"' in rejected[1]["text"]
    ds = load_dataset(tmp_path)
    assert sorted(s.key for s in ds.samples) == ["a1/b2", "a1/b4"]
    assert check_dataset(tmp_path)["problems"] == []


def test_dataset_check_fix_keeps_the_first_of_exact_duplicate_lines(capsys, tmp_path):
    make_dataset(tmp_path, archs=("a1",), batches=(2, 4, 8))
    path = tmp_path / "samples.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[0]]) + "\n")  # line 4 repeats line 1 exactly
    code, out, _ = run(capsys, "dataset", "check", tmp_path, "--fix")
    assert code == 0 and "3 usable samples, 1 problem;" in out
    assert path.read_text().splitlines() == lines  # the original stays, the copy moves
    [moved] = [json.loads(x) for x in (tmp_path / REJECTED).read_text().splitlines()]
    assert moved["line"] == 4 and moved["text"] == lines[0]
    assert len(load_dataset(tmp_path)) == 3


def test_dataset_check_fix_is_idempotent_and_removes_lines_of_missing_sequences(capsys,
                                                                                tmp_path):
    make_dataset(tmp_path, archs=("a1", "a2"), batches=(2,))
    (tmp_path / "seqs" / "a2.npz").unlink()
    code, out, _ = run(capsys, "dataset", "check", tmp_path, "--fix")
    assert code == 0 and "1 usable samples, 1 problem;" in out
    rejected = (tmp_path / REJECTED).read_text()
    assert [json.loads(x)["line"] for x in rejected.splitlines()] == [2]
    assert [s.key for s in load_dataset(tmp_path).samples] == ["a1/b2"]
    code, out, _ = run(capsys, "dataset", "check", tmp_path, "--fix")
    assert code == 0 and "1 usable samples, 0 problems" in out
    assert (tmp_path / REJECTED).read_text() == rejected  # nothing appended twice


def test_dataset_check_fix_takes_the_writer_lock(capsys, tmp_path):
    _with_bad_line(tmp_path, "nan")
    before = (tmp_path / "samples.jsonl").read_bytes()
    with writer_lock(tmp_path):
        code, _, err = run(capsys, "dataset", "check", tmp_path, "--fix")
    one_line_error(code, err, "being written by another process")
    assert (tmp_path / "samples.jsonl").read_bytes() == before


def test_a_dataset_is_never_written_among_other_files(capsys, tmp_path):
    theirs = tmp_path / "project"
    theirs.mkdir()
    (theirs / "report.json").write_text("{}")  # a name the profiler writes
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match=r"project: a folder of other files \(notes.txt, "
                       r"report.json\), not a dataset"):
        with writer_lock(theirs):
            pass
    assert (theirs / "report.json").read_text() == "{}" and len(list(theirs.iterdir())) == 2
    device = tmp_path / "device"  # a device's folder holding only its operator dataset
    (device / "ops").mkdir(parents=True)
    (device / "ops" / "plan.jsonl").write_text("")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / ".DS_Store").write_text("")
    for root in (device, tmp_path / "hidden", tmp_path / "new"):
        with writer_lock(root):
            pass


def test_dataset_check_fix_on_a_read_only_dataset_is_one_line(capsys, tmp_path, monkeypatch):
    _with_bad_line(tmp_path, "nan")
    before = (tmp_path / "samples.jsonl").read_bytes()

    def read_only(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr("mdot_jax.data.store.writer_lock", read_only)
    code, _, err = run(capsys, "dataset", "check", tmp_path, "--fix")
    one_line_error(code, err, "Read-only file system")
    assert (tmp_path / "samples.jsonl").read_bytes() == before


def test_dataset_check_finds_bad_sequences_escapes_and_foreign_devices(capsys, tmp_path):
    make_dataset(tmp_path, archs=("a1", "a2", "a3"), batches=(2, 4))
    path = tmp_path / "samples.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    (tmp_path / "seqs" / "a2.npz").write_bytes(b"PK\x03\x04 truncated")  # garbage .npz
    lines[0]["seq"] = "../../../../etc/hostname"  # outside the dataset
    lines[1]["workload"]["device"] = "another-gpu"
    path.write_bytes("".join(json.dumps(d) + "\n" for d in lines).encode()
                     + b'{"key": "\xff"}\n')  # a line of binary bytes
    code, out, _ = run(capsys, "dataset", "check", tmp_path)
    assert code == 1
    assert "line 1: sample 'a1/b2': sequence file ../../../../etc/hostname is outside" in out
    assert "line 2: sample 'a1/b4': of device 'another-gpu', but the dataset's is 'cpu'" in out
    assert "line 3: sample 'a2/b2': sequence file seqs/a2.npz is not a readable" in out
    assert "line 7: not UTF-8 text" in out and "2 usable samples, 5 problems" in out


def test_a_copy_never_merges_into_another_folder(tmp_path):
    from mdot_jax.data.resequence import resequence

    make_dataset(tmp_path / "src", archs=("a1", "a2"), batches=(2,))

    def export(sample):
        return conv_bn_relu()

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not empty, and not a stopped copy"):
        resequence(tmp_path / "src", tmp_path / "busy", export, progress=False)
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]
    with pytest.raises(DatasetError, match="is the dataset being copied"):
        resequence(tmp_path / "src", tmp_path / "src", export, progress=False)
    make_dataset(tmp_path / "other", archs=("b1",), batches=(2,))
    with pytest.raises(DatasetError, match="b1/b2 is not one of its files or samples"):
        resequence(tmp_path / "src", tmp_path / "other", export, progress=False)
    first = resequence(tmp_path / "src", tmp_path / "copy", export, progress=False)
    again = resequence(tmp_path / "src", tmp_path / "copy", export, progress=False)  # resumes
    assert len(first) == len(again) == 2


def test_an_empty_dataset_is_said_so(capsys, tmp_path):
    (tmp_path / "samples.jsonl").write_text("")
    code, out, _ = run(capsys, "dataset", "info", tmp_path)
    assert code == 0 and "0 samples" in out
    code, _, err = run(capsys, "train", "--dataset", tmp_path, "--out", tmp_path / "ck")
    one_line_error(code, err, "the dataset has no samples")


def test_a_last_line_without_newline_is_read_and_kept(tmp_path):
    make_dataset(tmp_path, archs=("a1",), batches=(2, 4))
    path = tmp_path / "samples.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # complete, only the newline missing
    assert len(load_dataset(tmp_path)) == 2
    writer = DatasetWriter(tmp_path)  # what `mdot profile` opens before measuring
    assert writer.done == {"a1/b2", "a1/b4"} and path.read_bytes().endswith(b"}\n")
    assert len(load_dataset(tmp_path)) == 2 and not (tmp_path / REJECTED).exists()


def test_a_torn_last_line_is_moved_aside_not_deleted(tmp_path):
    make_dataset(tmp_path, archs=("a1",), batches=(2,))
    path = tmp_path / "samples.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b'{"key": "a1/b8", "arch": "a1", "se')
    assert len(load_dataset(tmp_path)) == 1  # the sample in flight is not there yet
    DatasetWriter(tmp_path)
    assert path.read_bytes() == good
    [moved] = [json.loads(x) for x in (tmp_path / REJECTED).read_text().splitlines()]
    assert moved["reason"] == "torn line" and moved["text"].startswith('{"key": "a1/b8"')


def test_a_second_writer_is_refused_with_the_holders_pid(capsys, tmp_path):
    import os

    with writer_lock(tmp_path):
        with pytest.raises(DatasetError, match=f"pid {os.getpid()}"):
            with writer_lock(tmp_path):
                pass
        code, _, err = run(capsys, "profile", "--zoo", "torchvision", "--models", "resnet18",
                           "--batch-sizes", "2", "--image-sizes", "32", "--out", tmp_path)
        one_line_error(code, err, "being written by another process", f"pid {os.getpid()}")
    with writer_lock(tmp_path):  # released when its holder is done
        pass


def test_noisy_samples_are_kept_apart_and_measured_again_on_request(tmp_path):
    pytest.importorskip("torchvision")
    from mdot_jax.measure.profiler import Protocol, profile

    fast = dict(warmup=1, repeats=3, max_iter_s=30.0, budget_s=10.0, max_others=float("inf"))
    args = (["torchvision"], [2], [32], tmp_path)
    kw = dict(threads=1, progress=False, models=["mobilenet_v3_small"], speed_check=False)
    report = profile(*args, protocol=Protocol(**fast, max_cv=-1.0), **kw)  # all noisy
    assert report["samples"] == 0 and report["noisy"] == 1
    assert not (tmp_path / "samples.jsonl").exists()
    [noisy] = [json.loads(x) for x in (tmp_path / NOISY).read_text().splitlines()]
    assert noisy["stats"]["noisy"] and "others_running" in noisy["stats"]
    quiet = Protocol(**fast, max_cv=float("inf"))
    assert profile(*args, protocol=quiet, **kw)["samples"] == 0  # not measured again ...
    report = profile(*args, protocol=quiet, retry_noisy=True, **kw)  # ... unless asked
    assert report["samples"] == 1 and report["noisy"] == 0
    assert [s.key for s in load_dataset(tmp_path).samples] == ["mobilenet_v3_small/i32/b2"]


def test_unknown_zoo_models_are_named_with_close_matches(capsys, tmp_path):
    pytest.importorskip("torchvision")
    code, _, err = run(capsys, "profile", "--zoo", "torchvision", "--models", "resnet999",
                       "--batch-sizes", "2", "--image-sizes", "32", "--out", tmp_path / "d")
    one_line_error(code, err, "unknown model(s)", "resnet999", "did you mean")
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------------------- --out
@pytest.fixture
def dataset(tmp_path):
    make_dataset(tmp_path / "ds")
    return tmp_path / "ds"


def test_train_out_never_replaces_what_is_not_a_checkpoint(capsys, tmp_path, dataset):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    snapshot = {p: p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    for out, needle in [(mine, "not empty and not a checkpoint"),
                        (dataset, "not empty and not a checkpoint"),
                        (mine / "notes.txt", "is a file"),
                        (mine / "notes.txt" / "ckpt", "cannot write there")]:
        code, _, err = run(capsys, "train", "--dataset", dataset, "--out", out,
                           "--recipe", "tiny")
        one_line_error(code, err, needle)
    assert (mine / "notes.txt").read_text() == "keep me" and list(mine.iterdir())
    assert {p: p.read_bytes() for p in dataset.rglob("*") if p.is_file()} == snapshot


@pytest.mark.slow
def test_train_out_replaces_a_checkpoint_only_with_force(capsys, tmp_path, dataset):
    out = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT_DIR / "cpu-amd-epyc-f26m2-2t", out)
    code, _, err = run(capsys, "train", "--dataset", dataset, "--out", out, "--recipe", "tiny")
    one_line_error(code, err, "holds a checkpoint; --force replaces it")
    assert checkpoint.read_metadata(out)["dataset"]["path"].endswith("cpu-amd-epyc-f26m2-2t-fused")
    code, _, _ = run(capsys, "train", "--dataset", dataset, "--out", out, "--recipe", "tiny",
                     "--split", "none", "--force")
    assert code == 0 and checkpoint.read_metadata(out)["dataset"]["path"] == str(dataset)


def test_convert_output_that_is_a_directory_is_refused(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    (tmp_path / "onnx").mkdir()
    code, _, err = run(capsys, "convert", model, "--batch-size", "2", "-o", tmp_path / "onnx")
    one_line_error(code, err, "is a directory; name a file")
    assert "(a file)" not in err  # said once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "onnx"]


def test_convert_never_writes_its_input(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    before = model.read_bytes()
    for extra in ([], ["--force"]):
        code, _, err = run(capsys, "convert", model, "--batch-size", "2", "-o", model, *extra)
        one_line_error(code, err, "is the model being converted")
        assert model.read_bytes() == before


def test_convert_refuses_an_existing_output_without_force(capsys, tmp_path):
    model, out = tmp_path / "m.onnx", tmp_path / "m.npz"
    onnx.save(conv_bn_relu(), model)
    out.write_bytes(b"precious")
    code, _, err = run(capsys, "convert", model, "--batch-size", "2", "-o", out)
    one_line_error(code, err, "exists", "--force")
    assert out.read_bytes() == b"precious"
    code, _, _ = run(capsys, "convert", model, "--batch-size", "2", "-o", out, "--force")
    assert code == 0 and out.read_bytes()[:2] == b"PK"  # an .npz (zip) now


def test_convert_into_a_read_only_folder_is_one_line(capsys, tmp_path, monkeypatch):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)

    def read_only(self, path):
        raise PermissionError(30, "Read-only file system", str(path))

    monkeypatch.setattr("converters.sequence.OperatorSequence.save", read_only)
    code, _, err = run(capsys, "convert", model, "--batch-size", "2", "-o", tmp_path / "m.npz")
    one_line_error(code, err, "Read-only file system")


@pytest.mark.parametrize("builder,flag", [("conv_bn_relu", "--seq-len"),
                                           ("token_embedding", "--image-size")])
def test_a_size_flag_the_model_has_no_input_for_is_an_error(capsys, tmp_path, builder, flag):
    import onnx_builders

    model = tmp_path / "m.onnx"
    onnx.save(getattr(onnx_builders, builder)(), model)
    rest = ["--seq-len", "16"] if builder == "token_embedding" else ["--image-size", "8"]
    for command in ("convert", "predict"):
        code, _, err = run(capsys, command, model, "--batch-size", "2", *rest, flag, "64")
        one_line_error(code, err, f"{flag} 64 does not apply", "data inputs are")
    code, out, _ = run(capsys, "convert", model, "--batch-size", "2", *rest, "--json")
    assert code == 0 and json.loads(out)["num_ops"] >= 1


def test_a_sequence_keeps_the_size_it_was_converted_at(tmp_path):
    from mdot_jax.serving.predict import Predictor

    p = Predictor.load()
    seq = p.sequence(conv_bn_relu(), batch_size=2, image_size=8)
    assert p.predict(seq, batch_size=2).input_size == 8
    assert p.predict(seq, batch_size=2, image_size=8).input_size == 8
    with pytest.raises(RequestError, match="image_size 64: .* converted at input size 8"):
        p.predict(seq, batch_size=2, image_size=64)


@pytest.mark.parametrize("device", [None, "h100-sxm"])  # a checkpoint; a spec sheet
def test_a_converted_sequence_is_not_priced_at_another_size(capsys, tmp_path, device):
    onnx.save(conv_bn_relu(), tmp_path / "m.onnx")
    npz = str(tmp_path / "m.npz")
    assert run(capsys, "convert", str(tmp_path / "m.onnx"), "--batch-size", "2",
               "--image-size", "8", "-o", npz)[0] == 0
    rest = ["--batch-size", "2"] + (["--device", device] if device else [])
    assert run(capsys, "predict", npz, *rest, "--image-size", "8")[0] == 0
    code, _, err = run(capsys, "predict", npz, *rest, "--image-size", "64")
    one_line_error(code, err, "--image-size 64", "converted at input size 8")


@pytest.mark.parametrize("config,needle", [('{"epochs": -1}', "'epochs' -1: must be > 0"),
                                           ('{"lr": "abc"}', "'lr' 'abc': expected a number"),
                                           ('{"epoch": 3}', "unknown field(s) ['epoch']"),
                                           ('{"val_fraction": 2}', "between 0 and 1")])
def test_a_bad_train_config_is_one_line(capsys, tmp_path, config, needle):
    make_dataset(tmp_path / "ds", archs=("a1", "a2"), batches=(2,))
    code, _, err = run(capsys, "train", "--dataset", tmp_path / "ds", "--out",
                       tmp_path / "ckpt", "--train-config", config)
    one_line_error(code, err, needle)
    assert not (tmp_path / "ckpt").exists()


def test_a_job_of_negative_epochs_is_refused():
    from mdot_jax.serving.predict import Predictor

    p = Predictor.load()
    seq = p.sequence(conv_bn_relu(), batch_size=2)
    assert p.predict_job(seq, batch_size=2, epochs=1, dataset_size=10) > 0
    for bad in (dict(epochs=-1, dataset_size=10), dict(epochs=1, dataset_size=0)):
        with pytest.raises(ValueError, match="a job needs a positive number"):
            p.predict_job(seq, batch_size=2, **bad)


def test_every_prediction_reports_its_memory_and_warns_when_it_cannot_fit(capsys, tmp_path):
    from mdot_jax.serving.memory import step_memory

    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    code, out, _ = run(capsys, "predict", model, "--batch-size", "2", "--json")
    small = json.loads(out)
    assert code == 0 and 0 < small["memory_gb"] < 1
    assert not any("will not fit" in w for w in small["warnings"])
    code, out, err = run(capsys, "predict", model, "--batch-size", "100000000", "--json")
    big = json.loads(out)
    assert code == 0 and big["memory_gb"] > 24 and big["interval_ms"] is None
    assert "it will not fit at this batch size" in err and "rtx3090" in err
    from mdot_jax.serving.predict import Predictor

    seq = Predictor.load().sequence(conv_bn_relu(), batch_size=2)
    sgd, adam = step_memory(seq, optimizer="sgd"), step_memory(seq, optimizer="adamw")
    assert adam.optimizer == 2 * sgd.optimizer == 2 * sgd.parameters > 0
    # half-width activations, and autocast's half copy of the convolution's weight (batch
    # norm runs in fp32: its 8 parameters are not cast)
    assert step_memory(seq, "amp-fp16").activations == sgd.activations / 2 + 2.0 * 4 * 3 * 3 * 3
    assert seq.params == 4 * 3 * 3 * 3 + 8


def test_the_optimizer_is_named_in_predict_and_profile(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    args = ["predict", model, "--batch-size", "2", "--json"]
    sgd = json.loads(run(capsys, *args)[1])
    code, out, _ = run(capsys, *args, "--optimizer", "adamw")
    adamw = json.loads(out)
    assert code == 0 and adamw["memory_gb"] > sgd["memory_gb"]
    assert any("optimizer" in w for w in adamw["warnings"])  # a checkpoint of SGD steps
    make_dataset(tmp_path / "sgd", archs=("a1",), batches=(2,))
    code, _, err = run(capsys, "profile", "--zoo", "torchvision", "--models", "resnet18",
                       "--batch-sizes", "2", "--image-sizes", "32", "--optimizer", "adamw",
                       "--out", tmp_path / "sgd")
    one_line_error(code, err, "one optimizer per folder")


@pytest.mark.parametrize("command", ["convert", "predict"])
def test_an_integer_too_large_names_its_flag(capsys, tmp_path, command):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    code, _, err = run(capsys, command, model, "--batch-size", "1" + "0" * 20)
    one_line_error(code, err, "argument --batch-size", "is too large")
    code, _, err = run(capsys, command, model, "--input-shape", "x=1" + "0" * 20 + ",3,8,8")
    one_line_error(code, err, "--input-shape", "at most 4,194,304")
    # 100M positions ran the conversion's shape inference out of memory, killed unsaid
    code, _, err = run(capsys, command, model, "--input-shape", "x=2,99999999")
    one_line_error(code, err, "--input-shape", "a dim of 99,999,999: at most 4,194,304 (the "
                   "conversion holds each position)")


# ---------------------------------------------------------------------------- checkpoints
@pytest.fixture
def ckpt(tmp_path):
    out = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT_DIR / "cpu-amd-epyc-f26m2-2t", out)
    return out


def test_a_flipped_byte_in_the_weights_is_an_error(capsys, tmp_path, ckpt):
    weights = max((p for p in (ckpt / "params").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        checkpoint.load(ckpt)
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    code, out, err = run(capsys, "predict", model, "--batch-size", "4", "--checkpoint", ckpt,
                         "--json")
    one_line_error(code, err, "does not match its checksum")
    assert out == ""


@pytest.mark.slow
def test_a_truncated_companion_is_one_line_and_never_reaches_stdout(capsys, tmp_path, ckpt):
    meta = json.loads((ckpt / "metadata.json").read_text())
    text = lzma.decompress((ckpt / "companion.txt.xz").read_bytes()).decode()
    (ckpt / "companion.txt.xz").write_bytes(lzma.compress(text[: len(text) // 3].encode()))
    del meta["files"]  # a checkpoint from before checksums: the parser's own guard
    (ckpt / "metadata.json").write_text(json.dumps(meta))
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    code, out, err = run(capsys, "predict", model, "--batch-size", "4", "--checkpoint", ckpt,
                         "--json")
    one_line_error(code, err, "corrupt companion", "truncated")
    assert out == ""


@pytest.mark.parametrize("text", ["[]", "{", "\"a string\""])
def test_metadata_of_the_wrong_shape_is_one_line(capsys, tmp_path, ckpt, text):
    (ckpt / "metadata.json").write_text(text)
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    code, _, err = run(capsys, "predict", model, "--batch-size", "4", "--checkpoint", ckpt)
    one_line_error(code, err, "metadata.json")


def test_shipped_names_are_found_by_package_location_not_the_working_dir(tmp_path,
                                                                         monkeypatch):
    (tmp_path / "timm-rtx3090").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("timm-rtx3090") == CHECKPOINT_DIR / "timm-rtx3090"
    assert resolve_checkpoint(None) == CHECKPOINT_DIR / "timm-rtx3090"


# ---------------------------------------------------------------------------- arguments
@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    return path


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got '0'"),
    (["--batch-size", "-4"], "argument --batch-size: expected a positive integer, got '-4'"),
    (["--batch-sizes", "8,0"], "argument --batch-sizes: expected comma-separated positive"),
    (["--batch-sizes", "2,,4"], "expected comma-separated positive integers, got '2,,4'"),
    (["--batch-size", "4", "--epochs", "-5", "--dataset-size", "10"],
     "argument --epochs: expected a positive number, got '-5'"),
    (["--batch-size", "4", "--epochs", "nan", "--dataset-size", "10"],
     "argument --epochs: expected a positive number"),
    (["--batch-size", "4", "--checkpoint", "nope"], "no checkpoint 'nope'"),
])
def test_predict_arguments_are_checked_up_front(capsys, model, args, needle):
    code, out, err = run(capsys, "predict", model, *args)
    one_line_error(code, err, needle)
    assert out == ""


@pytest.mark.parametrize("args,needle", [
    (["--fold", "99"], "--fold 99: the family split has folds 0-4"),
    (["--model-config", '{"arch": "xgboost"}'], "unknown arch 'xgboost'"),
    (["--model-config", '{"d_modle": 8}'], "unknown field(s) ['d_modle']; its fields: 'arch'"),
    (["--model-config", '{"d_model": -3}'], "'d_model' -3: must be >= 1"),  # was JAX's trace
    (["--model-config", '{"n_heads": 2.5}'], "'n_heads' 2.5: expected an integer"),
    (["--model-config", '{"dropout": 1}'], "'dropout' 1: must be in [0, 1)"),
    (["--recipe", "fastest"], "unknown recipe 'fastest'"),
])
def test_train_arguments_are_checked_before_training(capsys, tmp_path, dataset, args, needle):
    code, _, err = run(capsys, "train", "--dataset", dataset, "--out", tmp_path / "c",
                       "--recipe", "tiny", *args)
    one_line_error(code, err, needle)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args,needle", [
    (["--folds", "1"], "--folds 1: the family split tests on one fold"),
    (["--fold-seed", "-1"], "argument --fold-seed: expected a non-negative integer"),
    (["--ensembles", "mdot+lightgbn"], "ensemble 'mdot+lightgbn': unknown method lightgbn"),
    (["--only-folds", "-1"], "expected comma-separated non-negative integers"),
])
def test_evaluate_arguments_are_checked_before_evaluating(capsys, tmp_path, dataset, args,
                                                          needle):
    """A misspelt ensemble was found after every run had trained; one fold of a family split
    left nothing to train on ("no training samples")."""
    code, _, err = run(capsys, "evaluate", "--dataset", dataset, "--out", tmp_path / "e",
                       "--methods", "lightgbm", *args)
    one_line_error(code, err, needle)
    assert not (tmp_path / "e").exists()


def test_kernels_out_is_checked_before_fitting(capsys, tmp_path):
    """`mdot kernels --out` a folder was an OSError after the fit, and the file was written in
    place (a kill left half of it)."""
    ops = REPO / "data" / "cpu-amd-epyc-f25m17-2t" / "ops"
    for out, needle in ((tmp_path, "is a directory"), (tmp_path / "no" / "k.json",
                                                        "its folder does not exist")):
        code, _, err = run(capsys, "kernels", ops, "--out", out, "--force")
        one_line_error(code, err, f"--out {out}: {needle}")
    code, _, err = run(capsys, "kernels", ops, "--out", tmp_path / "k.json", "--seed", "-1")
    one_line_error(code, err, "argument --seed: expected a non-negative integer")


def test_the_first_fold_can_be_run_alone():
    """Folds count from 0 ("the split has folds 0-4"); `--only-folds 0` was refused."""
    from mdot_jax.cli import build_parser

    args = build_parser().parse_args(["evaluate", "--dataset", "d", "--out", "o",
                                      "--only-folds", "0,2"])
    assert args.only_folds == [0, 2]


def test_profile_threads_must_be_positive(capsys, tmp_path):
    code, _, err = run(capsys, "profile", "--zoo", "torchvision", "--threads", "0",
                       "--out", tmp_path)
    one_line_error(code, err, "argument --threads: expected a positive integer")


def test_a_batch_far_beyond_training_says_so(capsys, model):
    code, out, err = run(capsys, "predict", model, "--batch-size", "1000000000",
                         "--checkpoint", "cpu-amd-epyc-f26m2-2t", "--image-size", "64", "--json")
    assert code == 0
    warnings = json.loads(out)["warnings"]
    [warning] = [w for w in warnings if "trained range" in w]
    assert "far (over 10x) past the trained range 2-64: priced at batch 64" in warning
    assert "a guess" in warning
    assert any("it will not fit at this batch size" in w for w in warnings)  # nor in RAM


def test_the_step_model_is_named_for_what_it_is_when_loaded_as_a_checkpoint():
    from mdot_jax.errors import CheckpointError
    from mdot_jax.serving.predict import Predictor

    with pytest.raises(CheckpointError, match=r"'gpu-spec-sheet' prices GPUs from their spec "
                                              r"sheets.*TrainingJob\(\.\.\., device=GPU\)"):
        Predictor.load("gpu-spec-sheet")


@pytest.mark.parametrize("batch", ["32", 3.5, True, float("nan"), -4, 0])
def test_a_batch_that_is_no_positive_integer_is_named(tmp_path, batch):
    from converters import ConversionError
    from mdot_jax.serving.predict import Predictor

    onnx.save(conv_bn_relu(), tmp_path / "m.onnx")
    with pytest.raises(ConversionError, match=r"^batch_size .*: expected a positive integer$"):
        Predictor.load().predict(tmp_path / "m.onnx", batch_size=batch)
