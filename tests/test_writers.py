"""Writers of checkpoints and converted sequences: one at a time, replaced in one step, nothing
lost or left behind by kill -9, shipped checkpoints never written (`mdot_jax.writers`)."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import onnx
import pytest
from onnx_builders import conv_bn_relu

from mdot_jax import writers
from mdot_jax.cli import main
from mdot_jax.errors import CheckpointError
from mdot_jax.serving.predict import CHECKPOINT_DIR
from mdot_jax.storage import checkpoint


def _checkpoint(path, version):
    path.mkdir()
    (path / "metadata.json").write_text(json.dumps({"format_version": 2, "v": version}))
    return path


def _hidden(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_swap_killed_between_its_renames_is_restored_at_the_next_run(tmp_path, capsys):
    """The old way of replacing: the previous checkpoint renamed aside, then the new one
    renamed in; a kill between the two left `out` missing and hidden folders behind."""
    out = tmp_path / "mine"
    old = _checkpoint(tmp_path / ".mine.old-0123abcd", "previous")
    _checkpoint(tmp_path / ".mine.tmp-89abcdef", "half-written")
    assert not out.exists() and old.exists()
    checkpoint.prepare_out(out, force=True)
    assert json.loads((out / "metadata.json").read_text())["v"] == "previous"
    assert "restored the previous version" in capsys.readouterr().err
    assert _hidden(tmp_path) == [".mine.lock"]  # held until this writer ends
    writers.release(out)
    assert _hidden(tmp_path) == []


def test_replacing_a_folder_swaps_it_in_one_step_and_leaves_nothing(tmp_path):
    out, new = _checkpoint(tmp_path / "mine", "old"), _checkpoint(tmp_path / ".new", "new")
    if sys.platform.startswith("linux"):
        assert writers._exchange(new, out) and writers._exchange(new, out)  # there and back
    writers.replace_dir(new, out)
    assert json.loads((out / "metadata.json").read_text())["v"] == "new"
    assert _hidden(tmp_path) == []


_REPLACER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from mdot_jax import writers
    writers._exchange = lambda a, b: False  # the two-rename way, which a kill can split
    out = Path(sys.argv[1])
    for i in range(100000):
        tmp = writers.temporary(out)
        tmp.mkdir()
        (tmp / "metadata.json").write_text(json.dumps({"format_version": 2, "v": i}))
        writers.replace_dir(tmp, out)
""")


@pytest.mark.slow
def test_kill_9_at_any_moment_of_replacing_never_loses_the_folder(tmp_path):
    out = _checkpoint(tmp_path / "mine", -1)
    rng = random.Random(0)
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", _REPLACER, str(out)])
        time.sleep(rng.uniform(1.5, 2.5))  # the interpreter's start, then ~1,000 swaps/s
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        writers.claim(out)
        writers.release(out)
        assert json.loads((out / "metadata.json").read_text())["format_version"] == 2
        assert _hidden(tmp_path) == [], _hidden(tmp_path)


def test_shipped_checkpoints_are_never_written(tmp_path):
    shipped = CHECKPOINT_DIR / "timm-rtx3090"
    before = {p: p.stat().st_mtime_ns for p in shipped.rglob("*")}
    with pytest.raises(CheckpointError, match="inside the shipped checkpoints"):
        checkpoint.prepare_out(shipped, force=True)
    with pytest.raises(CheckpointError, match=r"the name of a shipped checkpoint.*\./"):
        checkpoint.prepare_out("timm-rtx3090", force=True)
    assert {p: p.stat().st_mtime_ns for p in shipped.rglob("*")} == before
    assert not list(CHECKPOINT_DIR.glob(".*"))


_HOLDER = textwrap.dedent("""
    import sys, time
    from mdot_jax import writers
    writers.claim(sys.argv[1])
    print("held", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def held(tmp_path):
    """A second process holding the writer's lock of `tmp_path / "out"`."""
    target = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(target)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield target, proc.pid
    proc.kill()
    proc.wait()


def test_a_second_checkpoint_writer_is_refused_with_the_holders_pid(held):
    target, pid = held
    with pytest.raises(CheckpointError, match=f"another process \\(pid {pid}\\)"):
        checkpoint.prepare_out(target)
    assert not target.exists()


def test_a_second_convert_to_the_same_file_is_refused(held, capsys):
    target, pid = held
    model = target.parent / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    code = main(["convert", str(model), "--batch-size", "2", "-o", str(target)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"pid {pid}" in err[0], err
    assert not target.exists()


def test_convert_leaves_no_lock_or_temporary_behind(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    (tmp_path / ".m.npz.tmp-0123abcd.npz").write_bytes(b"a killed writer's")
    assert main(["convert", str(model), "--batch-size", "2", "-o", str(tmp_path / "m.npz")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz", "m.onnx"]


def test_changing_a_checkpoint_in_place_is_never_done_to_a_shipped_one_or_by_two(held):
    """`mdot calibrate` and the companion refit write into an existing checkpoint."""
    with pytest.raises(CheckpointError, match="inside the shipped checkpoints"):
        checkpoint.attach_calibration(CHECKPOINT_DIR / "timm-rtx3090", None)
    target, pid = held
    _checkpoint(target, "theirs")
    with pytest.raises(CheckpointError, match=f"pid {pid}"):
        checkpoint.attach_calibration(target, None)
    assert json.loads((target / "metadata.json").read_text())["v"] == "theirs"
