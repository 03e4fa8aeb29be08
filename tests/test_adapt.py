"""`mdot adapt --from-measurements`: a checkpoint of one CPU adapted to another CPU's measured
step times (both committed datasets are our own measurements)."""

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_builders import conv_bn_relu

from mdot_jax.cli import main
from mdot_jax.data.dataset import load_dataset
from mdot_jax.errors import UsageError
from mdot_jax.serving.adaptation import adapt_from_measurements, fit
from mdot_jax.serving.predict import Predictor
from mdot_jax.storage import checkpoint
from mdot_jax.storage.shipped import resolve_checkpoint

REPO = Path(__file__).resolve().parents[1]
OTHER_CPU = REPO / "data" / "derived" / "cpu-amd-epyc-f26m2-2t-fused"  # Zen 5
BASE = "cpu-amd-epyc-f25m17-2t"  # trained on a slower CPU (Zen 4)


def _image_samples():
    """Image samples of the other CPU, one per family in a fixed order, split into the 10 a
    user measured and the held-out rest (other families)."""
    by_family = {}
    for s in sorted(load_dataset(OTHER_CPU).samples, key=lambda s: s.key):
        if "/i" in s.key and 20 <= s.label_ms <= 1500:
            by_family.setdefault(s.family, s)
    picked = list(by_family.values())
    return picked[:10], picked[10:60]


def _write_csv(path: Path, samples):
    """A user's CSV of `samples`, each sequence saved beside it (the dataset's are packed)."""
    (path.parent / "seqs").mkdir(exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch_size", "image_size", "precision", "ms"])
        for s in samples:
            seq = path.parent / s.seq_path
            s.seq.save(seq)
            w.writerow([seq, s.workload.batch_size, s.workload.input_size, "fp32", s.label_ms])


def _mape(predictor, samples):
    pred = [predictor.predict(s.seq, batch_size=s.workload.batch_size,
                              image_size=s.workload.input_size).iteration_ms for s in samples]
    return float(np.mean([abs(p / s.label_ms - 1) for p, s in zip(pred, samples)]) * 100)


@pytest.mark.slow
def test_ten_measured_rows_adapt_a_checkpoint_to_another_cpu(tmp_path, capsys):
    rows, held_out = _image_samples()
    _write_csv(tmp_path / "mine.csv", rows)
    adapted = adapt_from_measurements(tmp_path / "mine.csv", BASE, tmp_path / "zen5")
    assert adapted.n_rows == 10 and adapted.fit in ("scale", "affine")
    base, mine = Predictor.load(BASE), Predictor.load(tmp_path / "zen5")
    before, after = _mape(base, held_out), _mape(mine, held_out)
    # the other CPU runs these models faster; 10 rows of other families fix most of it
    assert after < before / 1.5, (before, after)
    p = mine.predict(held_out[0].seq, batch_size=held_out[0].workload.batch_size,
                     image_size=held_out[0].workload.input_size)
    assert p.device == adapted.device and p.interval_ms[0] < p.interval_ms[1]
    assert "adapted to" in (tmp_path / "zen5" / "README.md").read_text()
    # the same rows through the command line give the same checkpoint
    code = main(["adapt", "--from-measurements", str(tmp_path / "mine.csv"), "--base", BASE,
                 "--out", str(tmp_path / "cli"), "--device-name", adapted.device])
    out = capsys.readouterr().out
    assert code == 0 and f"expected error: {adapted.loo_mape:.1f}% MAPE" in out
    assert checkpoint.read_metadata(tmp_path / "cli")["adaptation"] == adapted.to_json()


def test_the_fit_is_the_better_of_one_factor_and_a_line_by_leave_one_out():
    pred = np.array([10, 20, 40, 80, 160, 320, 640.0])
    assert fit(pred, 2 * pred, "d").fit == "scale"  # one factor explains it
    assert fit(pred, 2 * pred, "d").a == pytest.approx(math.log(2))
    steeper = fit(pred, 3 * pred ** 1.2, "d")  # a device that favours small workloads
    assert steeper.fit == "affine" and steeper.b == pytest.approx(1.2)
    assert fit(pred[:3], 3 * pred[:3] ** 1.2, "d").fit == "scale"  # too few rows for a line
    with pytest.raises(ValueError, match="at least 2"):
        fit(pred[:1], pred[:1], "d")


def test_the_rows_must_span_two_workloads_and_the_band_covers_the_error_to_expect():
    pred = np.array([10, 20, 40, 80.0])
    with pytest.raises(ValueError, match="at least 2 different workloads"):
        fit([pred[0]] * 10, [2 * pred[0]] * 10, "d")  # ten identical rows
    a = fit(pred, pred * [2.0, 2.2, 1.8, 2.4], "d")
    width = math.log1p(a.loo_mape / 100)
    assert a.loo_mape > 0 and a.lo <= -width and a.hi >= width


def test_a_job_measured_twice_is_left_out_whole():
    """A repeat left in the fit vouched for its twin: every row measured twice, the expected
    error was 32.0% where the rows measured once expect 36.9%."""
    pred = np.array([10, 20, 40, 80, 160, 320, 640.0])
    ms = 2 * pred * np.array([1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.25]) ** 2
    once, twice = fit(pred, ms, "d"), fit(np.repeat(pred, 2), np.repeat(ms, 2), "d",
                                          workloads=np.repeat(np.arange(7), 2))
    assert twice.fit == once.fit and twice.loo_mape == pytest.approx(once.loo_mape)
    assert fit(np.repeat(pred, 2), np.repeat(ms, 2), "d").loo_mape == \
        pytest.approx(once.loo_mape)  # by the price where no job is named


@pytest.mark.slow
def test_a_one_row_file_is_one_line(tmp_path, capsys):
    rows, _ = _image_samples()
    _write_csv(tmp_path / "one.csv", rows[:1])
    code = main(["adapt", "--from-measurements", str(tmp_path / "one.csv"), "--base", BASE,
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "at least 2 measured rows" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_adapting_an_adapted_checkpoint_composes_the_fits(tmp_path):
    rows, held_out = _image_samples()
    _write_csv(tmp_path / "mine.csv", rows)
    adapt_from_measurements(tmp_path / "mine.csv", BASE, tmp_path / "once")
    again = adapt_from_measurements(tmp_path / "mine.csv", tmp_path / "once", tmp_path / "twice")
    assert again.a == pytest.approx(0, abs=0.05)  # the once-adapted predictions already fit
    once, twice = Predictor.load(tmp_path / "once"), Predictor.load(tmp_path / "twice")
    for s in held_out[:5]:
        kw = dict(batch_size=s.workload.batch_size, image_size=s.workload.input_size)
        assert twice.predict(s.seq, **kw).iteration_ms == pytest.approx(
            once.predict(s.seq, **kw).iteration_ms, rel=0.1)


@pytest.mark.parametrize("header,row,needle", [
    (["model", "batch_size"], ["m.npz", "8"], "missing column(s) ['ms']"),
    (["model", "batch_size", "ms"], ["nope.onnx", "8", "10"],
     "line 2: model 'nope.onnx': no such file beside bad.csv, nor a name of `mdot models`"),
    (["model", "batch_size", "ms"], ["m.npz", "8", "-3"], "line 2: column 'ms' is '-3'"),
    (["model", "batch_size", "ms"], ["m.npz", "0", "3"], "column 'batch_size' is '0'"),
    (["model", "batch_size", "ms"], None, "a header and no rows"),
    (["model", "batch_size", "ms", "precision"], ["m.npz", "8", "3", "fp64"],
     "column 'precision' has ['fp64']"),
    (["model", "batch_size", "ms", "device"], ["m.npz", "8", "3", "h100-sxm"],
     "column(s) ['device'] are not read"),  # a job's field, ignored, would mislead
    (["model", "batch_size", "ms"], ["m.npz", "8", "20", "1"],
     "line 2: 4 cells, the header has 3 (a decimal comma?"),  # 20,1 read as 20 ms
    (["model", "batch_size", "ms"], ["m.npz", "8"], "line 2: column 'ms' is empty"),
])
def test_a_bad_measurements_file_is_one_line(tmp_path, capsys, header, row, needle):
    (tmp_path / "m.npz").write_bytes(b"")
    with open(tmp_path / "bad.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, row] if row else [header])
    code = main(["adapt", "--from-measurements", str(tmp_path / "bad.csv"), "--base", BASE,
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "out").exists()


def test_one_job_measured_far_apart_is_one_line(tmp_path, capsys):
    """Repeats of one job agree to their noise; 3x apart, one is of another GPU or setting
    (it was fitted as if both were right)."""
    from mdot_jax.serving.measurements import read_measurements

    (tmp_path / "m.npz").write_bytes(b"")
    for times, refused in (("10", False), ("12", False), ("30", True)):
        with open(tmp_path / "mine.csv", "w", newline="") as f:
            csv.writer(f).writerows([["model", "batch_size", "ms"], ["m.npz", "8", "10"],
                                     ["m.npz", "16", "19"], ["m.npz", "8", times]])
        if not refused:
            assert len(read_measurements(tmp_path / "mine.csv")) == 3
            continue
        code = main(["adapt", "--from-measurements", str(tmp_path / "mine.csv"), "--base",
                     BASE, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "lines 2 and 4: the same job" in err, err


def test_a_row_its_model_cannot_take_names_its_line(tmp_path, capsys):
    onnx.save(conv_bn_relu(), tmp_path / "c.onnx")  # an image model: no token ids
    with open(tmp_path / "mine.csv", "w", newline="") as f:
        csv.writer(f).writerows([["model", "batch_size", "image_size", "seq_len", "ms"],
                                 ["c.onnx", "8", "32", "", "3"], ["c.onnx", "8", "", "128", "4"]])
    for base in (BASE, "gpu-spec-sheet"):
        code = main(["adapt", "--from-measurements", str(tmp_path / "mine.csv"), "--base", base,
                     "--device-name", "h100-sxm", "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "mine.csv line 3: " in err, err
        assert "c.onnx: --seq-len 128 does not apply" in err
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("base", [BASE, "gpu-spec-sheet"])
def test_times_in_seconds_or_microseconds_are_one_line(tmp_path, capsys, base):
    """Rows 1000x off the base's prices are not milliseconds (they were fitted as a device
    1000x faster); 3x off is a device."""
    from mdot_jax import TrainingJob, predict

    onnx.save(conv_bn_relu(size=64), tmp_path / "c.onnx")
    device = "h100-sxm" if base == "gpu-spec-sheet" else None
    priced = {b: predict(TrainingJob(model=str(tmp_path / "c.onnx"), batch_size=b,
                                     device=device, checkpoint=base)).iteration_ms
              for b in (8, 16, 32)}
    for factor, refused in ((1e-3, True), (1e3, True), (3.0, False)):
        with open(tmp_path / "mine.csv", "w", newline="") as f:
            csv.writer(f).writerows([["model", "batch_size", "ms"]] + [
                ["c.onnx", b, ms * factor] for b, ms in priced.items()])
        out = tmp_path / f"out-{factor:g}"
        code = main(["adapt", "--from-measurements", str(tmp_path / "mine.csv"), "--base", base,
                     "--out", str(out)] + (["--device-name", device] if device else []))
        err = capsys.readouterr().err
        if refused:
            assert code == 2 and err.count("\n") == 1, err
            assert "column 'ms' measures" in err and "milliseconds expected" in err
            assert not out.exists() or not any(out.iterdir())
        else:
            assert code == 0, err
    # one row in microseconds among milliseconds: its line named (it was fitted, the band
    # stretched to x1e6)
    with open(tmp_path / "mine.csv", "w", newline="") as f:
        csv.writer(f).writerows([["model", "batch_size", "ms"]] + [
            ["c.onnx", b, ms * (1e3 if b == 16 else 1)] for b, ms in priced.items()])
    out = tmp_path / "out-one"
    code = main(["adapt", "--from-measurements", str(tmp_path / "mine.csv"), "--base", base,
                 "--out", str(out)] + (["--device-name", device] if device else []))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "mine.csv line 3: column 'ms' is" in err, err
    assert "1e+03x what the other rows measure" in err and not out.exists()


@pytest.mark.parametrize("base", [BASE, "gpu-spec-sheet"])
def test_a_rows_model_is_a_file_beside_the_csv_or_a_named_model(tmp_path, base):
    """A config.json beside the CSV, or a name of `mdot models` (as `mdot predict` takes
    them): each row priced as predict prices it."""
    pytest.importorskip("transformers")
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving import named_models
    from mdot_jax.serving.measurements import read_measurements

    (tmp_path / "tiny.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=256)))
    device = "h100-sxm" if base == "gpu-spec-sheet" else None
    jobs = [("tiny.json", 2, 64), ("tiny.json", 4, 64), ("gpt2", 2, 32)]
    priced = [predict(TrainingJob(model=named_models.resolve(str(tmp_path / m)) if m != "gpt2"
                                  else "gpt2", batch_size=b, seq_len=s, device=device,
                                  checkpoint=base)).iteration_ms for m, b, s in jobs]
    with open(tmp_path / "mine.csv", "w", newline="") as f:
        csv.writer(f).writerows([["model", "batch_size", "seq_len", "ms"]] + [
            [m, b, s, 2 * ms] for (m, b, s), ms in zip(jobs, priced)])
    rows = read_measurements(tmp_path / "mine.csv")
    assert [r.model for r in rows] == [tmp_path / "tiny.json"] * 2 + [
        named_models.find("gpt2").config]
    fit = adapt_from_measurements(tmp_path / "mine.csv", base, tmp_path / "out",
                                  device=device)
    assert fit.n_rows == 3 and fit.loo_mape < 1.0  # every row twice its price: a fit holds


def test_a_spreadsheets_csv_reads_as_a_plain_one(tmp_path):
    """A byte-order mark and semicolons (a European spreadsheet's export) or tabs read as commas
    do; mixed precisions are refused."""
    from mdot_jax.serving.measurements import read_measurements

    rows, _ = _image_samples()
    _write_csv(tmp_path / "plain.csv", rows[:3])
    plain = (tmp_path / "plain.csv").read_text()
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbf" + plain.replace(",", ";").encode())
    assert read_measurements(tmp_path / "excel.csv") == read_measurements(tmp_path / "plain.csv")
    (tmp_path / "tabs.tsv").write_text(plain.replace(",", "\t"))  # a tab-separated export
    assert read_measurements(tmp_path / "tabs.tsv") == read_measurements(tmp_path / "plain.csv")
    header, rest = plain.split("\n", 1)  # as typed by hand: " MS", "FP32"
    (tmp_path / "typed.csv").write_text(header.upper().replace(",", ", ") + "\n"
                                        + rest.replace("fp32", "FP32"))
    assert read_measurements(tmp_path / "typed.csv") == read_measurements(tmp_path / "plain.csv")
    (tmp_path / "mixed.csv").write_text(plain.replace("fp32", "amp-fp16", 1))
    with pytest.raises(UsageError, match="adapt each precision apart"):
        read_measurements(tmp_path / "mixed.csv")


@pytest.mark.slow
def test_an_adapted_checkpoint_records_its_fit_in_json(tmp_path):
    rows, _ = _image_samples()
    _write_csv(tmp_path / "mine.csv", rows[:4])
    adapted = adapt_from_measurements(tmp_path / "mine.csv", BASE, tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "metadata.json").read_text())
    assert meta["adaptation"]["n_rows"] == 4 and meta["adaptation"]["fit"] == "scale"
    assert adapted.source == f"mine.csv, base {BASE}"


def test_predict_says_when_this_machine_is_another_cpu(monkeypatch):
    from mdot_jax.measure import device
    from mdot_jax.serving.by_checkpoint import machine_note

    zen5 = dict(device_model="AMD EPYC", cpu_family=26, cpu_model_id=2)
    monkeypatch.setattr(device, "cpu_info", lambda: dict(zen5, cpu_model_id=17, cpu_family=25))
    note = machine_note(["cpu-amd-epyc-f26m2-2t"])
    assert "this machine is cpu-amd-epyc-f25m17" in note and "mdot adapt" in note
    assert "cpu-amd-epyc-2t" in machine_note(["cpu-amd-epyc-2t"])  # generation unknown
    assert machine_note(["rtx3090"]) is None  # predicting for a GPU from here: as intended
    monkeypatch.setattr(device, "cpu_info", lambda: zen5)
    assert machine_note(["cpu-amd-epyc-f26m2-2t"]) is None
    monkeypatch.setattr(device, "cpu_info", lambda: dict(device_model="unknown"))
    assert machine_note(["cpu-amd-epyc-f26m2-2t"]) is None  # nothing to compare


def test_the_nearest_checkpoint_is_the_one_whose_device_ran_the_probe_alike():
    from mdot_jax.serving.adaptation import nearest_checkpoint

    theirs = checkpoint.read_metadata(resolve_checkpoint("cpu-amd-epyc-f26m2-2t"))
    probe = theirs["dataset"]["probe"]
    assert len(probe) == 12  # the shipped CPU checkpoints carry their device's probe
    assert nearest_checkpoint(probe) == ("cpu-amd-epyc-f26m2-2t", 0.0)
    slower = {k: 2.0 * v for k, v in probe.items()}  # Zen 4 runs it about 2x slower
    assert nearest_checkpoint(slower)[0] == "cpu-amd-epyc-f25m17-2t"
    # a GPU is adapted from the GPU checkpoint, which carries no probe: never from a CPU's
    assert nearest_checkpoint(probe, cpu=False) == ("timm-rtx3090", float("inf"))
    with pytest.raises(UsageError, match="no shipped checkpoint of a GPU"):
        nearest_checkpoint(probe, exclude=("timm-rtx3090",), cpu=False)


@pytest.mark.slow
def test_adapt_from_this_machines_probe(tmp_path, quiet_protocol):
    from mdot_jax.serving.adaptation import adapt_from_probe

    keys = [f"mobilenet_v3_small/i32/b{b}" for b in (2, 4, 8)]
    a, base = adapt_from_probe(tmp_path / "data", "cpu-amd-epyc-f26m2-2t", tmp_path / "ck",
                               threads=1, protocol=quiet_protocol, keys=keys, progress=False)
    assert base == "cpu-amd-epyc-f26m2-2t" and a.n_rows == 3 and a.fit == "scale"
    adapted = Predictor.load(tmp_path / "ck")
    assert adapted.adaptation.device == a.device
    base_ms = Predictor.load("cpu-amd-epyc-f26m2-2t").predict(
        _mobilenet(), batch_size=4, image_size=32).iteration_ms
    ms = adapted.predict(_mobilenet(), batch_size=4, image_size=32).iteration_ms
    assert ms == pytest.approx(base_ms * math.exp(a.a), rel=1e-6)  # the fitted factor


@pytest.mark.slow
def test_a_budget_measures_more_samples_and_a_file_of_them_adapts_alike(tmp_path,
                                                                       quiet_protocol):
    from mdot_jax.serving.adaptation import adapt_from_probe

    keys = [f"mobilenet_v3_small/i32/b{b}" for b in (2, 4, 8)]
    extra = [f"mobilenet_v3_small/i32/b{b}" for b in (16, 32)]
    kw = dict(threads=1, protocol=quiet_protocol, keys=keys, extra=extra, progress=False)
    a, _ = adapt_from_probe(tmp_path / "data", BASE, tmp_path / "probe", budget_s=0, **kw)
    assert a.n_rows == 3  # no time left after the probe: nothing more measured
    a, _ = adapt_from_probe(tmp_path / "data", BASE, tmp_path / "more", budget_s=600, **kw)
    assert a.n_rows == 5 and "+ 2 more core-set samples" in a.source
    a0, _ = adapt_from_probe(tmp_path / "data", BASE, tmp_path / "held", budget_s=0, **kw)
    assert a0.n_rows == 5  # what the folder holds costs nothing
    # the same five samples as a user's file: their model's ONNX file and measured times
    import onnx

    from mdot_jax.measure.zoo import sample_exporter

    samples = load_dataset(tmp_path / "data").samples
    onnx.save(sample_exporter()(samples[0]), tmp_path / "model.onnx")
    with open(tmp_path / "mine.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch_size", "image_size", "precision", "ms"])
        for s in samples:
            w.writerow(["model.onnx", s.workload.batch_size, s.workload.input_size, "fp32",
                        s.label_ms])
    b = adapt_from_measurements(tmp_path / "mine.csv", BASE, tmp_path / "file")
    assert (b.fit, b.n_rows) == (a.fit, a.n_rows)
    assert (b.a, b.b, b.loo_mape) == pytest.approx((a.a, a.b, a.loo_mape), rel=1e-6)


def _mobilenet():
    import torch
    import torchvision

    from converters import from_torch

    return from_torch(torchvision.models.mobilenet_v3_small(), torch.randn(2, 3, 32, 32),
                      input_names=["x"])


def test_adapt_needs_one_source(tmp_path, capsys):
    assert main(["adapt", "--out", str(tmp_path / "ck")]) == 2
    assert main(["adapt", "--probe", "--from-measurements", "x.csv",
                 "--out", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mdot: error: adapt: give --from-measurements CSV or --probe (one of them)"] * 2


@pytest.mark.parametrize("base,needle", [
    ("timm-rtx3090", "--base timm-rtx3090 predicts for rtx3090, but the probe runs on this "
                     "machine's CPU"),
    ("nonexistent", "no checkpoint 'nonexistent'"),
])
def test_a_base_that_cannot_serve_is_refused_before_measuring(tmp_path, capsys, monkeypatch,
                                                              base, needle):
    from mdot_jax.measure import core_set

    def measured(*args, **kwargs):
        raise AssertionError("measured before the base was checked")

    monkeypatch.setattr(core_set, "run_probe", measured)
    monkeypatch.setattr("mdot_jax.measure.device.cuda_available", lambda: False)
    assert main(["adapt", "--probe", "--base", base, "--out", str(tmp_path / "ck"),
                 "--data", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_probe_refuses_half_precision_on_a_cpu_and_says_a_read_only_folder(tmp_path, capsys,
                                                                           monkeypatch):
    from mdot_jax.measure import profiler

    monkeypatch.setattr("mdot_jax.measure.device.cuda_available", lambda: False)
    assert main(["probe", "--precision", "amp-fp16", "--out", str(tmp_path / "p")]) == 2
    assert "amp-fp16 on a CPU" in capsys.readouterr().err

    def read_only(*args, root=None, **kwargs):
        raise OSError(30, "Read-only file system", str(tmp_path / "p" / "samples.jsonl"))

    monkeypatch.setattr(profiler, "profile", read_only)
    assert main(["probe", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err == f"mdot: error: {tmp_path / 'p' / 'samples.jsonl'}: Read-only file system\n"


def test_the_machine_form_finds_a_gpus_kernel_speed_and_host():
    """Steps measured on a machine whose kernels take 1.5x their price behind a host of 30
    us a kernel (the base's: 40): small steps wait on the host, large ones on the GPU, and no
    map of the totals fits both; the machine form recovers both numbers and every row."""
    from mdot_jax.gpu.host import launch_bound
    from mdot_jax.serving.adaptation import at_the_edge, fit
    from mdot_jax.serving.prediction import Adaptation

    rng = np.random.default_rng(0)
    kernels = [list(rng.uniform(0.001, 0.05, 200) * scale) for scale in
               (0.2, 0.5, 1, 2, 5, 10, 20, 50)]  # from launch-bound to GPU-bound
    base = [launch_bound(k, 0.04) for k in kernels]
    measured = [launch_bound([1.5 * t for t in k], 0.03) for k in kernels]
    without = fit(base, measured, "gpu")
    a = fit(base, measured, "gpu", kernels=kernels)
    assert a.fit == "machine" and a.loo_mape < 2 < without.loo_mape
    assert math.exp(a.a) == pytest.approx(1.5, rel=0.02)
    assert a.host_ms == pytest.approx(0.03, abs=0.002)
    with pytest.raises(ValueError, match="prices a step's kernels again"):
        a.apply(np.asarray(base))
    said = np.mean(np.abs(np.asarray(base) / np.asarray(measured) - 1)) * 100
    assert a.base_mape == without.base_mape == pytest.approx(said)  # what adapting must beat
    assert Adaptation.from_json(dict(a.to_json(), a_later_field=1)) == a  # a later version's
    assert at_the_edge(a) is None and at_the_edge(without) is None
    clipped = dataclasses.replace(a, a=math.log(4.0))  # the most its grid tries
    assert "--device-name" in at_the_edge(clipped)
