"""Checkpoints (`mdot_jax.storage.checkpoint`): save, load, companions, damage."""

import json

import numpy as np
import pytest

from mdot_jax.errors import CheckpointError
from mdot_jax.serving.predict import Predictor
from mdot_jax.storage import checkpoint


@pytest.mark.slow
def test_save_load_predict_round_trip(trained, tiny_real_dataset, tmp_path):
    path = checkpoint.save(trained, tmp_path / "ckpt", dataset={"fingerprint": "x"})
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["format_version"] == checkpoint.FORMAT_VERSION and meta["vocab_version"] >= 1
    assert meta["model_config"]["d_model"] == 16 and meta["stats"]["devices"] == ["rtx3090"]
    card = (path / "README.md").read_text()
    assert "rtx3090" in card and "d_model 16" in card and "fingerprint `x`" in card
    before = Predictor(trained)
    after = Predictor.load(path)
    items = [(s.seq, s.workload) for s in tiny_real_dataset.samples[:5]]
    a = [p.iteration_ms for p in before.predict_many(items)]
    b = [p.iteration_ms for p in after.predict_many(items)]
    assert a == b and all(x > 0 for x in a)
    seq, w = items[0]
    p = after.predict(seq, batch_size=w.batch_size, layout=w.layout)
    assert p.iteration_ms == pytest.approx(a[0]) and p.device == "rtx3090"
    job = after.predict_job(seq, batch_size=w.batch_size, epochs=2, dataset_size=1000)
    iterations = -(-1000 // w.batch_size)  # ceil: a last partial batch is an iteration too
    assert job == pytest.approx(p.iteration_ms * iterations * 2 / 1000)


@pytest.mark.slow
def test_bad_checkpoints_are_clear(tmp_path, trained):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        checkpoint.load(tmp_path / "missing")
    path = checkpoint.save(trained, tmp_path / "c")
    (path / "metadata.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        checkpoint.load(path)
    path = checkpoint.save(trained, tmp_path / "d")
    meta = json.loads((path / "metadata.json").read_text())
    (path / "metadata.json").write_text(json.dumps(dict(meta, format_version=99)))
    with pytest.raises(CheckpointError, match="format 99"):
        checkpoint.load(path)
    path = checkpoint.save(trained, tmp_path / "e")
    for f in (path / "params").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        checkpoint.load(path)
    meta = json.loads((path / "metadata.json").read_text())
    del meta["files"]  # a checkpoint from before checksums: orbax's own error, in one line
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="cannot restore"):
        checkpoint.load(path)


@pytest.mark.slow
def test_companion_round_trip_and_geometric_mean(trained, tiny_real_dataset, tmp_path):
    """A checkpoint with a LightGBM companion predicts the geometric mean of MDOT's and the
    trees' predictions, identically after save and load; without it, MDOT's alone. The
    companion averages SEEDS boosters; one saved alone (as before bagging) or ungzipped (as
    the oldest checkpoints stored it) still loads."""
    from mdot_jax.models.trees import _SEPARATOR, SEEDS, TreeModel

    samples = tiny_real_dataset.samples
    trees = TreeModel.fit(samples, seed=0)
    texts = trees.text.split(_SEPARATOR)
    assert len(texts) == SEEDS and len(set(texts)) == SEEDS
    assert all("objective=regression_l1" in t for t in texts)  # median regression of log time
    first = TreeModel.from_text(texts[0], trees.devices, trees.vocab_size, trees.version)
    assert not np.allclose(first.predict(samples), trees.predict(samples))
    path = checkpoint.save(trained, tmp_path / "ckpt", companion=trees)
    assert "LightGBM companion" in (path / "README.md").read_text()
    items = [(s.seq, s.workload) for s in samples[:5]]
    before = Predictor(trained, companion=trees).predict_many(items)
    after = Predictor.load(path).predict_many(items)
    alone = Predictor.load(path, companion=False).predict_many(items)
    assert [p.iteration_ms for p in before] == [p.iteration_ms for p in after]
    mdot, lgb = [p.parts["mdot"] for p in after], [p.parts["lightgbm"] for p in after]
    np.testing.assert_allclose([p.iteration_ms for p in after], np.sqrt(np.multiply(mdot, lgb)))
    np.testing.assert_allclose(lgb, trees.predict(samples[:5]))
    assert [p.iteration_ms for p in alone] == pytest.approx(mdot) and not alone[0].parts
    assert not np.allclose(mdot, lgb)  # the two parts are different models
    meta = json.loads((path / "metadata.json").read_text())
    (path / "companion.txt").write_text(trees.text)  # the older, ungzipped file
    meta["companion"]["file"] = "companion.txt"
    (path / "metadata.json").write_text(json.dumps(meta))
    old = Predictor.load(path).predict_many(items)
    assert [p.iteration_ms for p in old] == [p.iteration_ms for p in after]
    (path / "companion.txt").write_text("not a model")
    with pytest.raises(checkpoint.CheckpointError, match="corrupt companion"):
        Predictor.load(path)
    checkpoint.attach_companion(path, trees)  # replaced: gzipped, the old file removed
    assert not (path / "companion.txt").exists() and Predictor.load(path).companion is not None
    (path / checkpoint.COMPANION).write_bytes(b"not gzip")
    with pytest.raises(checkpoint.CheckpointError, match="does not match its checksum"):
        Predictor.load(path)


@pytest.mark.slow
def test_refit_companion_replaces_it_and_drops_stale_bands(trained, tiny_real_dataset,
                                                           tmp_path, monkeypatch):
    """A checkpoint whose companion was fitted with an older recipe (squared loss) gets one of
    today's (absolute loss) on MDOT's own training samples; its bands, which described the
    old pair, are gone until calibrated again; another dataset version is refused."""
    from mdot_jax.models import trees
    from mdot_jax.storage.calibration import Band, Calibration
    from mdot_jax.training.workflow import refit_companion

    ds = tiny_real_dataset
    monkeypatch.setattr(trees, "OBJECTIVE", "regression")
    old = trees.TreeModel.fit(ds.samples, seed=0)
    monkeypatch.undo()
    path = checkpoint.save(trained, tmp_path / "ckpt", companion=old,
                           dataset=dict(fingerprint=ds.fingerprint(), split="none"))
    checkpoint.attach_calibration(path, Calibration(
        {"nchw": (Band(None, -0.1, 0.1, 5.0, 10),)}, ("mdot-pe-none", "lightgbm")))
    assert old.objective == "regression" and "calibration" in checkpoint.read_metadata(path)
    info = refit_companion(path, ds)
    meta = checkpoint.read_metadata(path)
    assert meta["companion"]["objective"] == "regression_l1" and "calibration" not in meta
    assert checkpoint.load_companion(path).objective == "regression_l1"
    assert "objective regression_l1" in (path / "README.md").read_text()
    assert info["val_mape"] > 0
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="dataset version"):
        refit_companion(path, type(ds)(tmp_path / "other", ds.samples[:3]))


def test_a_step_models_copy_has_its_meta_changed_and_replaces_only_a_step_model(tmp_path):
    """A study's candidate (`step_model_copy`) and a ship (`amend_step_model`): the copy has
    the metadata asked, the base is untouched, a folder that is no step model is refused."""
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, load_step_model

    base = json.loads((STEP_MODEL_DIR / checkpoint.STEP_MODEL).read_text())
    copy = checkpoint.step_model_copy(STEP_MODEL_DIR, tmp_path / "c", split_gemms=7)
    assert load_step_model(copy).info["split_gemms"] == 7
    assert not (copy / "README.md").exists() and not list(tmp_path.glob(".*tmp*"))
    assert json.loads((STEP_MODEL_DIR / checkpoint.STEP_MODEL).read_text()) == base
    again = checkpoint.step_model_copy(copy, copy.with_name("d"), host_source="x")
    assert load_step_model(again).info["split_gemms"] == 7  # copied from the copy
    checkpoint.step_model_copy(STEP_MODEL_DIR, copy)  # a step model is replaced
    assert load_step_model(copy).info.get("split_gemms") == base.get("split_gemms")
    checkpoint.amend_step_model(copy, lambda m: m.update(host_source="y"))
    assert load_step_model(copy).info["host_source"] == "y"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="no GPU step model; refusing to replace it"):
        checkpoint.step_model_copy(STEP_MODEL_DIR, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
