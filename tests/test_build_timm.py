"""timm benchmark builder: real rows end to end, bad rows reported, resume after a crash."""

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("timm")
from timm_rows import TIMM_HEADER, timm_csvs  # noqa: E402

from mdot_jax.data import build_timm as bt  # noqa: E402
from mdot_jax.data.dataset import load_dataset  # noqa: E402

HEADER = TIMM_HEADER + "\n"


def _real_rows(names, tmp_path):
    csv, = timm_csvs(tmp_path / "published", names, layouts=("nchw",))
    lines = csv.read_text().splitlines()[1:]
    assert len(lines) == len(names)
    return lines


@pytest.fixture
def csv_path(tmp_path):
    rows = _real_rows(["tinynet_e", "lcnet_035"], tmp_path) + [
        "no_such_net_v9,100.0,10.0,64,224,1.0",  # unknown architecture
        "mobilenetv3_small_050,1.0,nan,512,224,1.59",  # NaN time
        "resnet18,1.0,10.0,512,224,99.0",  # parameter count does not match
    ]
    path = tmp_path / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_builder_end_to_end_with_bad_rows(csv_path, tmp_path):
    report = bt.build_timm([csv_path], tmp_path / "ds", progress=False)
    assert report["built"] == 2 and report["rows"] == 5
    assert report["skipped_by_reason"] == {"unknown_model": 1, "bad_row": 1,
                                           "param_mismatch": 1}
    ds = load_dataset(tmp_path / "ds")
    by_arch = {s.arch: s for s in ds.samples}
    assert set(by_arch) == {"tinynet_e", "lcnet_035"}
    s = by_arch["tinynet_e"]
    assert s.label_ms == pytest.approx(50.423)
    assert (s.workload.batch_size, s.workload.input_size, s.workload.device,
            s.workload.precision, s.workload.layout) == (512, 106, "rtx3090", "amp-fp16", "nchw")
    assert s.seq.meta["inputs"] == {"x": [512, 3, 106, 106]}
    assert abs(s.seq.params - 2.04e6) / 2.04e6 < 0.05
    on_disk = json.loads((tmp_path / "ds" / "report.json").read_text())
    assert on_disk["skipped"]["nchw/no_such_net_v9"]["reason"] == "unknown_model"


def test_building_some_models_reports_on_every_row(csv_path, tmp_path):
    report = bt.build_timm([csv_path], tmp_path / "ds", models=["tinynet_e"], progress=False)
    assert report["built"] == 1 and report["rows"] == 5  # the others are simply not done


def test_the_build_takes_the_writer_lock_and_no_folder_of_other_files(csv_path, tmp_path):
    from mdot_jax.data.store import writer_lock
    from mdot_jax.errors import DatasetError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.json").write_text("{}")
    with pytest.raises(DatasetError, match="a folder of other files"):
        bt.build_timm([csv_path], mine, models=["tinynet_e"], progress=False)
    assert (mine / "report.json").read_text() == "{}"
    with writer_lock(tmp_path / "ds"), pytest.raises(DatasetError, match="another process"):
        bt.build_timm([csv_path], tmp_path / "ds", models=["tinynet_e"], progress=False)


def test_resume_after_crash_keeps_each_sample_once(csv_path, tmp_path, monkeypatch):
    real_convert, calls = bt.convert, []

    def crash_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies while building the second sample
        return real_convert(*args, **kwargs)

    monkeypatch.setattr(bt, "convert", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        bt.build_timm([csv_path], tmp_path / "ds", progress=False)
    assert len(load_dataset(tmp_path / "ds")) == 1
    monkeypatch.setattr(bt, "convert", real_convert)
    report = bt.build_timm([csv_path], tmp_path / "ds", progress=False)
    keys = [s.key for s in load_dataset(tmp_path / "ds").samples]
    assert sorted(keys) == ["nchw/lcnet_035", "nchw/tinynet_e"] and report["built"] == 2


def test_an_architecture_that_kills_the_build_is_passed_over_on_resume(
        csv_path, tmp_path, monkeypatch):
    root, at_death = tmp_path / "ds", tmp_path / "report-at-death.json"

    def killed(*args):  # what the out-of-memory killer leaves: report.json as it is now
        shutil.copy(root / "report.json", at_death)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(bt, "_build_arch", killed)
        with pytest.raises(KeyboardInterrupt):
            bt.build_timm([csv_path], root, models=["tinynet_e"], progress=False)
    shutil.copy(at_death, root / "report.json")  # a SIGKILL runs no clean-up
    report = bt.build_timm([csv_path], root, models=["tinynet_e"], progress=False)
    assert report["built"] == 0
    assert report["skipped"]["nchw/tinynet_e"]["reason"] == "killed_while_building"
    report = bt.build_timm([csv_path], root, models=["tinynet_e"], retry_skipped=True,
                           progress=False)
    assert report["built"] == 1 and "nchw/tinynet_e" not in report["skipped"]


def _killed_once_on_tinynet(csv_paths, out, **kwargs):
    """`build_timm` in a process that the kernel kills the first time it builds tinynet_e."""
    build_arch, marker = bt._build_arch, Path(out) / "killed-once"

    def dies_once(arch, *args):
        if arch == "tinynet_e" and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # like the out-of-memory killer: no clean-up
        return build_arch(arch, *args)

    bt._build_arch = dies_once  # this process only (a spawned child)
    return bt.build_timm(csv_paths, out, **kwargs)


@pytest.mark.slow
def test_the_supervised_build_survives_a_killed_process(csv_path, tmp_path, capfd):
    report = bt.build_timm_supervised([csv_path], tmp_path / "ds", progress=False,
                                      target=_killed_once_on_tinynet)
    err = capfd.readouterr().err
    assert "killed (signal 9); resuming" in err and "retrying tinynet_e alone" in err
    assert report["built"] == 2 and "nchw/tinynet_e" not in report["skipped"]
    assert sorted(s.arch for s in load_dataset(tmp_path / "ds").samples) == \
        ["lcnet_035", "tinynet_e"]


KILLER = """
import os, signal, sys
from pathlib import Path
from mdot_jax.data.resequence import resequence
src, out, victim = sys.argv[1:]
def export_of(s):
    if s.arch == victim:  # as the kernel's OOM killer ends an export that outgrew the machine
        os.kill(os.getpid(), signal.SIGKILL)
    return Path(src) / "onnx" / (Path(s.seq_path).stem.rsplit("-b", 1)[0] + ".onnx")
resequence(src, out, export_of, partial=True, progress=False)
"""


@pytest.mark.slow
def test_a_partial_copy_leaves_out_a_graph_it_died_in_twice(tiny_timm_build, tmp_path):
    """A copy killed while converting one graph resumes (nothing finished is lost) and, the
    second time it dies there, leaves that graph out and ends instead of dying forever."""
    import subprocess
    import sys

    from mdot_jax.data.resequence import RESEQUENCE_FAILED

    victim = "mobilenetv3_small_050"
    run = [sys.executable, "-c", KILLER, str(tiny_timm_build.root), str(tmp_path / "c"), victim]
    for _ in range(2):
        assert subprocess.run(run, capture_output=True).returncode == -signal.SIGKILL
    assert subprocess.run(run, capture_output=True).returncode == 0
    copied = {s.key for s in load_dataset(tmp_path / "c").samples}
    theirs = {s.key for s in tiny_timm_build.samples if s.arch == victim}
    assert copied == {s.key for s in tiny_timm_build.samples} - theirs and theirs
    failed = [json.loads(line) for line in (tmp_path / "c" / RESEQUENCE_FAILED).open()]
    assert {f["key"] for f in failed} == theirs
    assert all("died 2 times" in f["reason"] for f in failed)


@pytest.mark.slow
def test_a_copy_stopped_by_the_user_does_not_count_as_dying(tiny_timm_build, tmp_path):
    from mdot_jax.data.resequence import KILLED_TRIES, RESEQUENCE_TRIES, _killed_tries, resequence

    first = tiny_timm_build.samples[0]

    def stopped(sample):
        raise KeyboardInterrupt  # Ctrl-C, or `timeout -s INT`, in the first conversion

    for _ in range(KILLED_TRIES):
        with pytest.raises(KeyboardInterrupt):
            resequence(tiny_timm_build.root, tmp_path / "c", stopped, partial=True,
                               progress=False)
    tries = _killed_tries(tmp_path / "c" / RESEQUENCE_TRIES)
    assert tries[f"{first.arch}/{first.workload.input_size}"] == 0


@pytest.mark.slow
def test_resequence_copies_the_samples_with_fused_sequences(tiny_timm_build, tmp_path):
    """Same samples, labels and fingerprint (so the same folds); every sequence converted
    again from the stored exports with fusion; a second run adds nothing."""
    from mdot_jax.data.build_timm import resequence

    out = resequence(tiny_timm_build.root, tmp_path / "fused", progress=False)
    assert out.fingerprint() == tiny_timm_build.fingerprint()
    by_key = {s.key: s for s in tiny_timm_build.samples}
    for s in out.samples:
        assert "fused" in s.seq.meta and "fused" not in by_key[s.key].seq.meta
        assert s.workload == by_key[s.key].workload and s.label_ms == by_key[s.key].label_ms
        assert s.seq.num_ops <= by_key[s.key].seq.num_ops
    assert any(s.seq.num_ops < by_key[s.key].seq.num_ops for s in out.samples)
    lines = (tmp_path / "fused" / "samples.jsonl").read_text()
    resequence(tiny_timm_build.root, tmp_path / "fused", progress=False)
    assert (tmp_path / "fused" / "samples.jsonl").read_text() == lines
    # a copy without the exports (committed datasets hold none) rebuilds them from timm
    bare = tmp_path / "bare"
    shutil.copytree(tiny_timm_build.root, bare, ignore=shutil.ignore_patterns("onnx"))
    rebuilt = {s.key: s.seq for s in resequence(bare, tmp_path / "r", progress=False).samples}
    for s in out.samples:
        np.testing.assert_array_equal(rebuilt[s.key].op_type, s.seq.op_type)
        np.testing.assert_array_equal(rebuilt[s.key].config, s.seq.config)


@pytest.mark.slow
def test_a_newer_fusion_version_reuses_every_sequence_it_would_not_change(tiny_timm_build,
                                                                          tmp_path):
    """Upgrading a fused copy to a newer fusion version converts again only what the new
    rules touch (of the tiny set, EdgeNeXt: its Slices of one tensor, version 3's); the rest
    are the same arrays, now of the new version, neither exported nor converted."""
    import json

    from converters import converts_the_same
    from converters.fusion import FUSION_VERSION
    from mdot_jax.data.build_timm import resequence
    from mdot_jax.data.resequence import RESEQUENCE_TRIES

    old = resequence(tiny_timm_build.root, tmp_path / "v1", fuse=1, progress=False)
    new = resequence(tmp_path / "v1", tmp_path / "v2", progress=False)
    tries = (tmp_path / "v2" / RESEQUENCE_TRIES).read_text().splitlines()
    by_key = {s.key: s.seq for s in old.samples}
    again = {k for k, q in by_key.items() if not converts_the_same(q, FUSION_VERSION)}
    assert {k.split("/")[1] for k in again} == {"edgenext_xx_small"}  # each layout's
    assert {json.loads(line)["graph"].split("/")[0] for line in tries} == {"edgenext_xx_small"}
    assert old.fingerprint() == new.fingerprint()
    for s in new.samples:
        assert (by_key[s.key].fusion, s.seq.fusion) == (1, FUSION_VERSION)
        if s.key not in again:
            np.testing.assert_array_equal(s.seq.config, by_key[s.key].config)
            np.testing.assert_array_equal(s.seq.edges, by_key[s.key].edges)
