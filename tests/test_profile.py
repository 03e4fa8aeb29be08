"""Profiler: a tiny model measured end to end on the CPU, failures recorded, device guard."""

import json
import time

import pytest

pytest.importorskip("torchvision")
from mdot_jax.data.dataset import load_dataset  # noqa: E402
from mdot_jax.measure.device import device_slug, fingerprint
from mdot_jax.measure.profiler import Protocol, profile, stats_of
from mdot_jax.measure.zoo import zoo_models  # noqa: E402

# timing noise of tiny models must not send the test's samples to noisy.jsonl
FAST = Protocol(warmup=1, repeats=3, max_iter_s=30.0, budget_s=10.0, max_cv=float("inf"),
                max_others=float("inf"))


@pytest.mark.slow
def test_profile_tiny_model_end_to_end(tmp_path):
    out = tmp_path / "cpu"
    report = profile(["torchvision"], [1, 2], [32], out, threads=1, progress=False,
                     models=["mobilenet_v3_small"], protocol=FAST, speed_check=False)
    # batch 1 cannot train (BatchNorm over a 1x1 map of one sample): recorded, not raised
    assert report["skipped_by_reason"] == {"batchnorm_batch1": 1}
    [s] = load_dataset(out).samples
    assert s.key == "mobilenet_v3_small/i32/b2" and s.label_ms > 0
    assert s.stats["repeats"] == 3 and len(s.stats["times_ms"]) == 3
    assert s.stats["iqr_ms"] >= 0 and s.stats["cv"] >= 0
    fp = s.meta["fingerprint"]
    assert fp["threads"] == 1 and fp["device_model"] and fp["torch"] and fp["optimizer"] == "sgd"
    assert s.workload.device == device_slug(fp)
    assert s.seq.meta["inputs"] == {"x": [2, 3, 32, 32]}
    # a re-run measures nothing again
    again = profile(["torchvision"], [1, 2], [32], out, threads=1, progress=False,
                    models=["mobilenet_v3_small"], protocol=FAST, speed_check=False)
    assert again["samples"] == 1 and len(load_dataset(out)) == 1
    # converted again from the zoo (with fusion), nothing measured: same sample and label
    from mdot_jax.measure.zoo import resequence

    [c] = resequence(out, tmp_path / "fused", progress=False).samples
    assert (c.key, c.label_ms, c.workload) == (s.key, s.label_ms, s.workload)
    # no pattern to fuse here, only the classifier's Flatten to count as a view
    assert c.seq.meta["fused"] == {"views": 1} and c.seq.num_ops == s.seq.num_ops
    # samples brought back without their sequences (the GPU kit's) are exported again
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(out, bare, ignore=shutil.ignore_patterns("seqs"))
    [b] = resequence(bare, tmp_path / "fused-bare", progress=False).samples
    assert (b.key, b.label_ms) == (s.key, s.label_ms) and b.seq.num_ops == c.seq.num_ops
    # a skip on record is kept, unless retried: then a success clears it
    report = json.loads((out / "report.json").read_text())
    report["skipped"]["mobilenet_v3_small/i32/b4"] = dict(reason="cannot_train", detail="")
    (out / "report.json").write_text(json.dumps(report))
    kept = profile(["torchvision"], [4], [32], out, threads=1, progress=False,
                   models=["mobilenet_v3_small"], protocol=FAST, speed_check=False)
    assert kept["samples"] == 1 and kept["skipped_by_reason"]["cannot_train"] == 1
    retried = profile(["torchvision"], [4], [32], out, threads=1, progress=False,
                      models=["mobilenet_v3_small"], protocol=FAST, retry_skipped=True,
                      speed_check=False)
    assert retried["samples"] == 2 and "cannot_train" not in retried["skipped_by_reason"]


def test_zoo_names_are_unique():
    """A sample's key is the model name: timm's resnet18 (also in torchvision) once made the
    profiler stop with "sample ... is already in" at every new image size."""
    pytest.importorskip("timm")
    names = [m.name for m in zoo_models(["torchvision", "timm"])]
    assert len(names) == len(set(names)) and "resnet18" in names
    assert [m.name for m in zoo_models(["timm"])][0] == "resnet18"


def test_profile_refuses_to_mix_devices(tmp_path):
    out = tmp_path / "cpu"
    out.mkdir()
    fp = dict(fingerprint(1), device_model="Some Other CPU")
    sample = dict(key="k", arch="a", seq="seqs/x.npz", label_ms=1.0,
                  workload=dict(batch_size=1, input_size=1), meta=dict(fingerprint=fp))
    (out / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    with pytest.raises(ValueError, match="new dataset folder"):
        profile(["torchvision"], [2], [32], out, threads=1, progress=False,
                models=["mobilenet_v3_small"], protocol=FAST, speed_check=False)


@pytest.mark.parametrize("theirs", [
    dict(cpu_family=None, cpu_model_id=None),  # measured before the family was recorded
    dict(cpu_family=23, cpu_model_id=49),  # the same model name, another generation
], ids=["unrecorded", "other-family"])
def test_profile_refuses_a_generic_cpu_name_of_another_generation(tmp_path, theirs):
    """Cloud VMs call several CPU generations "AMD EPYC": the family and model number tell
    them apart, and a folder that does not record them cannot be appended to."""
    fp = fingerprint(1)
    if "cpu_family" not in fp:
        pytest.skip("no /proc/cpuinfo family on this machine")
    other = {k: v for k, v in dict(fp, **theirs).items() if v is not None}
    assert device_slug(other) != device_slug(fp)
    out = tmp_path / "cpu"
    out.mkdir()
    sample = dict(key="k", arch="a", seq="seqs/x.npz", label_ms=1.0,
                  workload=dict(batch_size=1, input_size=1), meta=dict(fingerprint=other))
    (out / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    with pytest.raises(ValueError, match=r"cpu_family .*new dataset folder \(default: .* in the"):
        profile(["torchvision"], [2], [32], out, threads=1, progress=False,
                models=["mobilenet_v3_small"], protocol=FAST, speed_check=False)


def test_a_traced_protocol_profiles_one_more_step():
    """`mdot profile --trace`: after the timed repeats, one step under PyTorch's profiler
    (on a CPU: the ATen operators it dispatched, busiest first, and who called them); untraced,
    nothing."""
    torch = pytest.importorskip("torch")
    from mdot_jax.measure.profiler import BUSIEST, CALLERS, measure_step

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x, target = torch.randn(4, 8), torch.randint(0, 4, (4,))
    traced: dict = {}
    times = measure_step(model, x, target, Protocol(warmup=1, repeats=3, trace=True), "cpu",
                         trace=traced)
    assert len(times) == 3 and traced["launches"] is None and traced["gpu_ms"] is None
    names = [name for name, _, _ in traced["busiest"]]
    assert "aten::addmm" in names and len(names) <= BUSIEST and traced["aten_ops"] > len(names)
    ms = [t for *_, t in traced["busiest"]]
    assert ms == sorted(ms, reverse=True)
    # who ran it: the backward functions and ATen operators by what they ran, nested included
    callers = {name: t for name, _, t in traced["callers"]}
    assert len(callers) <= CALLERS and "AddmmBackward0" in callers
    assert callers["aten::linear"] >= callers["aten::addmm"] > 0  # a linear runs its addmm
    untraced: dict = {}
    measure_step(model, x, target, Protocol(warmup=1, repeats=3), "cpu", trace=untraced)
    assert untraced == {}


def test_a_profiler_that_fails_loses_no_measured_step(monkeypatch):
    """No CUPTI in a lease's container, say: the trace says why; the timed repeats stand
    (the sample was skipped as `cannot_train`, the LLM row lost, before)."""
    torch = pytest.importorskip("torch")
    from mdot_jax.measure.profiler import measure_step

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")

    monkeypatch.setattr("torch.profiler.profile", broken)
    model = torch.nn.Linear(8, 4)
    traced: dict = {}
    times = measure_step(model, torch.randn(4, 8), torch.randint(0, 4, (4,)),
                         Protocol(warmup=1, repeats=3, trace=True), "cpu", trace=traced)
    assert len(times) == 3 and traced == {"trace_error": "RuntimeError: "
                                                   "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"}


def test_stats_golden():
    st = stats_of([10.0, 12.0, 14.0])
    assert st["median_ms"] == 12.0 and st["iqr_ms"] == 2.0
    assert st["cv"] == pytest.approx(100 * (8 / 3) ** 0.5 / 12)


def test_a_last_line_without_newline_survives_a_profile_run(tmp_path):
    kw = dict(threads=1, progress=False, models=["mobilenet_v3_small"], protocol=FAST,
              speed_check=False)
    profile(["torchvision"], [2], [32], tmp_path, **kw)
    path = tmp_path / "samples.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # an editor saved it without one
    report = profile(["torchvision"], [2, 4], [32], tmp_path, **kw)
    assert report["samples"] == 2
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert keys == ["mobilenet_v3_small/i32/b2", "mobilenet_v3_small/i32/b4"]


def test_too_slow_is_decided_on_a_steady_state_iteration():
    """The first warm-up pays for allocation and kernel set-up: up to `first_iter_slack`
    times the limit it does not decide; a slow steady-state iteration does."""
    import torch

    from mdot_jax.measure.profiler import TooSlow, measure_step

    class SlowAtFirst(torch.nn.Module):
        def __init__(self, first_s, then_s):
            super().__init__()
            self.lin, self.delays = torch.nn.Linear(4, 3), [first_s]
            self.then_s = then_s

        def forward(self, x):
            time.sleep(self.delays.pop() if self.delays else self.then_s)
            return self.lin(x)

    x, target = torch.randn(2, 4), torch.tensor([0, 1])
    proto = Protocol(warmup=2, repeats=3, max_iter_s=0.1, budget_s=10.0)
    times = measure_step(SlowAtFirst(0.25, 0.0), x, target, proto, "cpu")  # 2.5x: measured
    assert len(times) == 3 and max(times) < 100
    with pytest.raises(TooSlow):  # 5x the limit on the first iteration
        measure_step(SlowAtFirst(0.5, 0.0), x, target, proto, "cpu")
    with pytest.raises(TooSlow):  # slow once warm
        measure_step(SlowAtFirst(0.0, 0.15), x, target, proto, "cpu")


def test_appending_is_refused_when_the_machine_no_longer_matches_the_labels(tmp_path):
    kw = dict(threads=1, progress=False, models=["mobilenet_v3_small"], protocol=FAST)
    profile(["torchvision"], [2], [32], tmp_path, **kw)
    path = tmp_path / "samples.jsonl"
    row = json.loads(path.read_text())
    row["label_ms"] = 500.0  # as if measured on a much slower machine
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"more than 15% off"):
        profile(["torchvision"], [4], [32], tmp_path, **kw)
    assert len(load_dataset(tmp_path)) == 1


@pytest.mark.parametrize("field,value,bad", [("optimizer", "adamw", "lamb"),
                                             ("precision", "amp-bf16", "fp8")])
def test_another_optimizer_or_precision_is_recorded_and_kept_apart(tmp_path, field, value,
                                                                    bad):
    import dataclasses

    kw = dict(threads=1, progress=False, models=["mobilenet_v3_small"], speed_check=False)
    profile(["torchvision"], [2], [32], tmp_path, protocol=dataclasses.replace(
        FAST, **{field: value}), **kw)
    [s] = load_dataset(tmp_path).samples
    assert getattr(s.workload, field) == value and s.meta["fingerprint"][field] == value
    with pytest.raises(ValueError, match=f"one {field} per folder"):
        profile(["torchvision"], [4], [32], tmp_path, protocol=FAST, **kw)
    with pytest.raises(ValueError, match=f"{field} '{bad}'"):
        Protocol(**{field: bad})


def test_a_size_given_twice_is_measured_once_and_tf32_on_a_cpu_is_refused(tmp_path):
    kw = dict(threads=1, progress=False, models=["mobilenet_v3_small"], speed_check=False)
    report = profile(["torchvision"], [2, 2], [32, 32], tmp_path / "cpu", protocol=FAST, **kw)
    assert report["samples"] == 1 and len(load_dataset(tmp_path / "cpu")) == 1
    import dataclasses

    with pytest.raises(ValueError, match="precision tf32: a GPU's tensor-core format"):
        profile(["torchvision"], [2], [32], tmp_path / "tf32",
                protocol=dataclasses.replace(FAST, precision="tf32"), **kw)
    assert not (tmp_path / "tf32").exists()


def test_each_precision_sets_tf32_explicitly():
    import torch

    from mdot_jax.measure.profiler import precision_context

    for precision, matmul in (("tf32", True), ("fp32", False), ("amp-fp16", False)):
        precision_context(precision, "cpu", torch)
        assert torch.backends.cuda.matmul.allow_tf32 is matmul  # set, whatever it was
        assert torch.backends.cudnn.allow_tf32


def test_a_gpu_is_filed_under_its_name():
    fp = dict(device_kind="cuda", device_model="NVIDIA H100 80GB HBM3", threads=8)
    assert device_slug(fp) == "gpu-nvidia-h100-80gb-hbm3"


@pytest.mark.parametrize("precision,scaled", [("amp-fp16", True), ("amp-bf16", False),
                                              ("fp32", False)])
def test_a_training_step_scales_fp16_and_runs_channels_last(monkeypatch, precision, scaled):
    import torch

    from mdot_jax.measure.profiler import training_step

    made = []
    real = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda *a, **k: made.append(1) or real(*a, **k))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 10))
    before = [p.detach().clone() for p in model.parameters()]
    x, target = torch.randn(2, 3, 8, 8), torch.tensor([1, 2])
    step = training_step(model, x, target, "sgd", precision, "cpu", torch, layout="nhwc")
    for _ in range(20):  # the scaler skips steps whose scaled gradients overflow fp16
        step()
    assert bool(made) is scaled
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_gpu_fingerprint_has_what_tells_gpus_apart(monkeypatch):
    """Without a GPU here: PyTorch's device properties stubbed as an H100 reports them."""
    import subprocess
    import types

    import torch

    from mdot_jax.measure import device

    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132,
                                  total_memory=85_000_000_000, L2_cache_size=50 * 2 ** 20,
                                  major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: types.SimpleNamespace(
        stdout="580.159.04, 1980, 2619\n"))
    fp = device.fingerprint(8, precision="amp-bf16")
    assert fp["device_kind"] == "cuda" and fp["sms"] == 132 and fp["l2_mb"] == 50.0
    assert fp["compute_capability"] == "9.0" and fp["memory_gb"] == 85.0
    assert fp["driver"] == "580.159.04" and fp["max_sm_mhz"] == 1980.0
    assert fp["precision"] == "amp-bf16" and fp["cudnn"] == 91000 and "cuda" in fp
    assert device.device_slug(fp) == "gpu-nvidia-h100-80gb-hbm3"


def test_a_graph_whose_sequences_exist_is_not_exported_again(tmp_path, monkeypatch):
    """The GPU kit measures the same graphs at two precisions: the second exports nothing."""
    import shutil

    from mdot_jax.measure import profiler

    kw = dict(threads=1, progress=False, models=["mobilenet_v3_small"], protocol=FAST,
              speed_check=False)
    profile(["torchvision"], [2], [32], tmp_path / "a", **kw)
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "seqs", tmp_path / "b" / "seqs")

    def no_export(*a, **k):
        raise AssertionError("exported again")

    monkeypatch.setattr(profiler, "_export", no_export)
    report = profile(["torchvision"], [2], [32], tmp_path / "b", **kw)
    assert report["samples"] == 1 and not report["skipped"]
