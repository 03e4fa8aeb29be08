"""MDOT model, training and checkpoints on a tiny real dataset."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from mdot_jax.data.features import FeatureCache
from mdot_jax.errors import CheckpointError
from mdot_jax.models import tiny_config
from mdot_jax.serving import checkpoint
from mdot_jax.serving.predict import Predictor
from mdot_jax.training.train import TrainConfig, train

FAST = TrainConfig(epochs=2, tokens_per_batch=2048, val_fraction=0.2)


@pytest.fixture(scope="module")
def trained(tiny_real_dataset):
    return train(tiny_real_dataset.samples, tiny_config(0), FAST, progress=False)


def _first_batch(trained, samples):
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    return next(cache.batches(samples, 2048))[0]


def test_jit_equals_eager(trained, tiny_real_dataset):
    model = trained.model()
    batch = _first_batch(trained, tiny_real_dataset.samples)
    eager = model(batch)[0]
    graphdef, params = nnx.split(model)
    jitted = jax.jit(lambda p, b: nnx.merge(graphdef, p)(b)[0])(params, batch)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-5, atol=1e-5)


def test_train_step_compiles_once_per_bucket(trained, tiny_real_dataset):
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    buckets = {b.op_type.shape[1] for b, _ in cache.batches(
        trained_samples(trained, tiny_real_dataset), 2048)}
    assert trained.info["compiled_train_shapes"] == len(buckets) >= 1
    assert trained.info["steps"] > len(buckets)  # several steps per shape, no recompiles


def trained_samples(trained, ds):
    return ds.samples[: trained.info["train_samples"]]


def test_padding_does_not_change_predictions(trained, tiny_real_dataset):
    """A sample predicts the same alone (batch padded with empty rows) or with others."""
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    model = trained.model()
    batch, idx = next(cache.batches(tiny_real_dataset.samples, 2048))
    assert (idx[:, 0] >= 0).sum() >= 2
    together = np.asarray(model(batch)[0])  # [B, K]
    alone_batch, _ = next(cache.batches([tiny_real_dataset.samples[idx[1, 0]]], 2048))
    assert alone_batch.op_type.shape == batch.op_type.shape and alone_batch.weight.sum() == 1
    alone = np.asarray(model(alone_batch)[0])
    np.testing.assert_allclose(alone[0, 0], together[1, 0], rtol=1e-5, atol=1e-6)


def test_samples_sharing_a_sequence_share_a_row(trained, tiny_real_dataset):
    """Two workloads of one sequence are read out from one encoding, with the predictions
    of two separate rows."""
    import copy
    import dataclasses

    from mdot_jax.data.dataset import Sample

    s = tiny_real_dataset.samples[0]
    other = dataclasses.replace(s.workload, layout="nhwc")
    shared = [Sample.in_memory(s.seq, s.workload), Sample.in_memory(s.seq, other)]
    separate = [shared[0], Sample.in_memory(copy.copy(s.seq), other)]
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    (batch, idx), = cache.batches(shared, 2048)
    assert idx[0].tolist() == [0, 1] and batch.weight.sum() == 2
    (batch2, idx2), = cache.batches(separate, 2048)
    assert idx2[:2, 0].tolist() == [0, 1] and idx2[0, 1] == -1
    model = trained.model()
    a, b = np.asarray(model(batch)[0]), np.asarray(model(batch2)[0])
    np.testing.assert_allclose(a[0, :2], b[:2, 0], rtol=1e-5, atol=1e-6)
    assert a[0, 0] != a[0, 1]  # the layout matters


def test_block_attention():
    """Block-local attention ignores padded keys and equals full attention when one block
    holds the whole sequence."""
    from mdot_jax.models.layers import Attention

    attn = Attention(16, 4, block=8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 32, 16))  # [B, T, D], 4 blocks of 8
    mask = np.arange(32)[None] < np.array([[20], [32]])
    y = attn(x, mask)
    np.testing.assert_allclose(attn(x.at[0, 20:].set(5.0), mask)[0, :20], y[0, :20], atol=1e-6)
    changed = attn(x.at[1, 0].set(5.0), mask)  # other blocks see block 0 via its summary
    assert np.abs(changed[1, 8:] - y[1, 8:]).max() > 1e-4
    full = Attention(16, 4, block=0, rngs=nnx.Rngs(0))
    attn.block = 32
    np.testing.assert_allclose(attn(x, mask), full(x, mask), atol=1e-6)


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
def test_calibrated_checkpoint_gives_bands_and_flags_disagreement(trained, tiny_real_dataset,
                                                                  tmp_path):
    """`evaluate.calibrate` turns an evaluation's rows into the checkpoint's error bands: the
    Predictor's 80% band is the one of its disagreement bin, the most disagreeing bin adds a
    warning naming both members, the network alone has no band from a two-member
    calibration, and results of another dataset or of a non-family split are refused by
    name. By default the rows are those of the checkpoint's own network (here the paper's
    MDOT: method `mdot`, part `mdot`)."""
    from mdot_jax.evaluation.evaluate import calibrate
    from mdot_jax.models.ensemble import spread
    from mdot_jax.models.trees import TreeModel

    ds, samples = tiny_real_dataset, tiny_real_dataset.samples
    trees = TreeModel.fit(samples, seed=0)
    path = checkpoint.save(trained, tmp_path / "ckpt", companion=trees,
                           dataset=dict(fingerprint=ds.fingerprint()))
    parts = [p.parts for p in Predictor.load(path).predict_many(
        [(s.seq, s.workload) for s in samples])]
    keys = [s.key for s in samples]
    rows = [dict(method=m, fold=0, seed=0, split="family", dataset=ds.fingerprint(),
                 test_keys=keys, pred_ms=[p[part] for p in parts])
            for m, part in (("mdot", "mdot"), ("lightgbm", "lightgbm"))]
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cal = calibrate(path, results, ds)
    assert trained.model_cfg.method == "mdot" and cal.methods == ("mdot", "lightgbm")
    assert sorted(cal.bands) == ["nchw", "nhwc"] and len(cal.bands["nhwc"]) == 3
    assert "error on held-out model families" in (path / "README.md").read_text()
    preds = Predictor.load(path).predict_many([(s.seq, s.workload) for s in samples])
    for p, s in zip(preds, samples):
        # the members' spread as calibration computes it (a bin edge is an observed value)
        d, layout = spread(p.parts["mdot"], p.parts["lightgbm"]), s.workload.layout
        assert p.interval_ms == pytest.approx(cal.interval(p.iteration_ms, layout, d))
        # 3 epochs of 10 samples at batch 4: 3 x ceil(10 / 4) = 9 iterations
        assert p.job_interval_seconds(3, 10, 4) == pytest.approx(
            tuple(9 * ms / 1e3 for ms in p.interval_ms))
        flagged = any("MDOT and LightGBM disagree" in w for w in p.warnings)
        assert flagged == (cal.band(layout, d) is cal.bands[layout][-1])
    assert any(any("disagree" in w for w in p.warnings) for p in preds)
    alone = Predictor.load(path, companion=False).predict_many([(samples[0].seq,
                                                                 samples[0].workload)])
    assert alone[0].interval_ms is None
    for field, value, needle in (("dataset", "0" * 16, "not of one dataset"),
                                 ("split", "random", "random split")):
        (results / "results.jsonl").write_text(
            "\n".join(json.dumps(dict(r, **{field: value})) for r in rows))
        with pytest.raises(ValueError, match=needle):
            calibrate(path, results, ds)


def test_refit_companion_replaces_it_and_drops_stale_bands(trained, tiny_real_dataset,
                                                           tmp_path, monkeypatch):
    """A checkpoint whose companion was fitted with an older recipe (squared loss) gets one of
    today's (absolute loss) on MDOT's own training samples; its bands, which described the
    old pair, are gone until calibrated again; another dataset version is refused."""
    from mdot_jax.models import trees
    from mdot_jax.serving.calibration import Band, Calibration
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


def test_companion_features_keep_their_width_when_the_vocabulary_grows(tiny_real_dataset):
    """A companion fitted on an older, shorter vocabulary reads newer op types as <unk>
    (a longer feature vector made LightGBM refuse to predict)."""
    import dataclasses

    from converters.vocab import UNK_ID, VOCAB
    from mdot_jax.data.aggregates import aggregates
    from mdot_jax.data.dataset import Sample

    s = tiny_real_dataset.samples[0]

    def with_first_op(t):
        op_type = np.array(s.seq.op_type)
        op_type[0] = t
        return Sample.in_memory(dataclasses.replace(s.seq, op_type=op_type), s.workload)

    old = len(VOCAB) - 1
    newer, unk = (aggregates(with_first_op(t), ["rtx3090"], old) for t in (old, UNK_ID))
    np.testing.assert_array_equal(newer, unk)
    assert len(aggregates(s, ["rtx3090"])) == len(newer) + 1


def test_companion_conv_breakdown_puts_each_convolution_in_its_classes():
    """A dense 3x3 convolution, then a depthwise 7x7 one with stride 2: the 3x3 class holds
    the first, the larger / strided / depthwise classes the second, the 1x1 class nothing.
    Version 1 of the aggregates is version 2 without the breakdown."""
    from onnx import helper

    from converters import convert
    from mdot_jax.data.aggregates import aggregates, conv_breakdown
    from mdot_jax.data.dataset import Sample, Workload
    from tests.onnx_builders import model, value

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["c", "w2"], ["y"], kernel_shape=[7, 7], pads=[3] * 4,
                              strides=[2, 2], group=4)]
    m = model(nodes, [value("x", [2, 4, 8, 8]), value("w1", [4, 4, 3, 3]),
                      value("w2", [4, 1, 7, 7])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, batch_size=2)
    load = seq.load.astype(np.float64)
    dense, depthwise = (np.log1p([load[i, 0:2].sum(), load[i, 2:4].sum(), 1]) for i in (0, 1))
    want = np.concatenate([np.zeros(3), dense, depthwise, depthwise, depthwise])
    np.testing.assert_allclose(conv_breakdown(seq), want, rtol=1e-6)
    s = Sample.in_memory(seq, Workload(batch_size=2, input_size=8, device="rtx3090"))
    v1, v2 = (aggregates(s, ["rtx3090"], version=v) for v in (1, 2))
    np.testing.assert_allclose(v2, np.concatenate([v1, conv_breakdown(seq)]), rtol=1e-6)


def test_companion_group_breakdown_buckets_grouped_depthwise_and_unaligned_convolutions():
    """A grouped 1x1 convolution (64 channels in 4 groups: 16 per group), a depthwise 5x5
    one over 256 channels and a dense 3x3 one to 12 channels each land in their own bucket
    and nowhere else. Version 2 of the aggregates is version 3 without the breakdown."""
    from onnx import helper

    from converters import convert
    from mdot_jax.data.aggregates import aggregates, group_breakdown
    from mdot_jax.data.dataset import Sample, Workload
    from tests.onnx_builders import model, value

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1], group=4),
             helper.make_node("Conv", ["a", "w2"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["b", "w3"], ["c"], kernel_shape=[5, 5], pads=[2] * 4,
                              group=256),
             helper.make_node("Conv", ["c", "w4"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    m = model(nodes, [value("x", [2, 64, 8, 8]), value("w1", [64, 16, 1, 1]),
                      value("w2", [256, 64, 1, 1]), value("w3", [256, 1, 5, 5]),
                      value("w4", [12, 256, 3, 3])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, batch_size=2)
    flops = seq.load[:, 0:2].astype(np.float64).sum(axis=1)
    want = np.zeros(14)
    want[2:4] = flops[0], 1  # grouped, 8-31 channels per group
    want[11] = flops[2]  # depthwise, >= 256 channels, kernel larger than 3
    want[12:14] = flops[3], 1  # 12 output channels: not a multiple of 8
    np.testing.assert_allclose(group_breakdown(seq), np.log1p(want), rtol=1e-6)
    s = Sample.in_memory(seq, Workload(batch_size=2, input_size=8, device="rtx3090"))
    v2, v3 = aggregates(s, ["rtx3090"], version=2), aggregates(s, ["rtx3090"])
    np.testing.assert_allclose(v3, np.concatenate([v2, group_breakdown(seq)]), rtol=1e-6)


def test_fit_boosters_ignores_rows_of_zero_weight():
    """Half the rows carry a target 3 too high; weighted 0 they leave the fit alone, weighted
    equally they pull it up."""
    from mdot_jax.models.trees import fit_boosters

    rng = np.random.default_rng(0)
    x = rng.uniform(size=(400, 1))
    y = x[:, 0] + np.where(np.arange(400) % 2, 3.0, 0.0)
    kw = dict(grid=((4, 0.1),), seeds=1)
    (weighted,) = fit_boosters(x, y, x[::2], y[::2], weight=1.0 - np.arange(400) % 2, **kw)
    (plain,) = fit_boosters(x, y, x[::2], y[::2], **kw)
    assert np.abs(weighted.predict(x[::2]) - y[::2]).mean() < 0.1
    assert plain.predict(x[::2]).mean() - y[::2].mean() > 1.0


def test_predictions_warn_about_extrapolation(trained, tiny_real_dataset):
    import dataclasses

    predictor = Predictor(trained)
    s = tiny_real_dataset.samples[0]
    inside = predictor.predict_many([(s.seq, s.workload)])[0]
    assert inside.warnings == []
    far = dataclasses.replace(s.workload, batch_size=4 * max(trained.info["batch_sizes"]),
                              input_size=1)
    (warned,) = predictor.predict_many([(s.seq, far)])
    assert len(warned.warnings) == 2 and "extrapolation" in warned.warnings[0]
    assert "batch size" in warned.warnings[0] and "input size 1 " in warned.warnings[1]
    assert trained.info["precisions"] == ["amp-fp16"]  # the timm tables' only precision
    (bf16,) = predictor.predict_many([(s.seq, dataclasses.replace(s.workload,
                                                                  precision="bf16"))])
    assert bf16.warnings == ["precision bf16 was never trained on (only amp-fp16): "
                             "extrapolation"]


@pytest.mark.slow
def test_killed_training_resumes_where_it_stopped(tiny_real_dataset, tmp_path):
    """A run killed after epoch 0 continues from its saved state and ends with exactly the
    parameters of an uninterrupted run; a different run does not pick the state up."""
    cfg, samples = FAST.replace(epochs=3, patience=9), tiny_real_dataset.samples

    class Killed(Exception):
        pass

    def kill_in_epoch_1(line):
        if line.startswith("epoch=1"):
            raise Killed

    whole = train(samples, tiny_config(0), cfg, progress=False)
    with pytest.raises(Killed):
        train(samples, tiny_config(0), cfg, progress=False, log=kill_in_epoch_1,
              resume_dir=tmp_path)
    lines = []
    resumed = train(samples, tiny_config(0), cfg, progress=False, log=lines.append,
                    resume_dir=tmp_path)
    assert lines[0].startswith(f"resumed from {tmp_path} after epoch 0")
    assert resumed.info["steps"] == whole.info["steps"]
    assert [r["epoch"] for r in resumed.history] == [0, 1, 2]
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    lines = []
    train(samples, tiny_config(0), cfg.replace(seed=1), progress=False, log=lines.append,
          resume_dir=tmp_path)
    assert not any(line.startswith("resumed") for line in lines)


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


DATA_PARALLEL = r"""
import json, sys
import jax
from mdot_jax.data.dataset import load_dataset
from mdot_jax.models import tiny_config
from mdot_jax.training.train import TrainConfig, train
ds = load_dataset(sys.argv[1])
t = train(ds.samples, tiny_config(0), TrainConfig(epochs=1, tokens_per_batch=1536), progress=False)
print(json.dumps(dict(devices=jax.device_count(), info_devices=t.info["devices"],
                      batch_sizes=t.info["batch_size_by_length"], mape=t.info["best_val_mape"])))
"""


@pytest.mark.slow
def test_data_parallel_on_several_host_devices(tiny_real_dataset):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", DATA_PARALLEL, str(tiny_real_dataset.root)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == result["info_devices"] == 4
    sizes = list(result["batch_sizes"].values())
    assert sizes and all(b % 4 == 0 for b in sizes)  # batches split evenly over the devices
    assert np.isfinite(result["mape"])


def test_diverged_predictions_stay_finite(trained, tiny_real_dataset):
    """A diverged model (log-time 1e4 standard deviations off) predicts a large finite time,
    never inf; sound predictions are untouched."""
    from mdot_jax.models.trained import MAX_Z, predict_samples

    cache = FeatureCache(trained.stats, trained.feature_cfg)
    samples = tiny_real_dataset.samples[:3]
    huge = predict_samples(lambda p, b: np.full(b.target.shape, 1e4), None, cache, samples)
    st = trained.stats
    assert np.allclose(huge, np.exp(MAX_Z * st.target_std + st.target_mean))
    zero = predict_samples(lambda p, b: np.zeros(b.target.shape), None, cache, samples)
    assert np.allclose(zero, np.exp(st.target_mean))


def test_fused_and_unfused_sequences_are_never_mixed(trained, tiny_real_dataset, tmp_path):
    """A checkpoint converts the way its training sequences were converted (fuse or not);
    a sequence of the other kind, or a training set mixing both, is a clear error."""
    import dataclasses

    import onnx
    from onnx_builders import conv_bn_relu

    from converters import convert
    from converters.fusion import FUSION_VERSION as V
    from mdot_jax.data.dataset import Sample

    s = tiny_real_dataset.samples[0]
    onnx_path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(training=True), onnx_path)
    fused_seq = convert(onnx_path, batch_size=s.workload.batch_size, fuse=True)
    assert "fused" in fused_seq.meta and "fused" not in s.seq.meta
    with pytest.raises(ValueError, match=f"fusion version {V}, this checkpoint expects 0"):
        Predictor(trained).predict_many([(fused_seq, s.workload)])
    fused = dataclasses.replace(trained, feature_cfg=dataclasses.replace(
        trained.feature_cfg, fused=V))
    seq = Predictor(fused).sequence(onnx_path, batch_size=s.workload.batch_size)
    assert seq.meta["fused"] == fused_seq.meta["fused"]
    mixed = [s, Sample.in_memory(fused_seq, s.workload, s.label_ms, key="fused")]
    with pytest.raises(ValueError, match=rf"mix fusion versions \[0, {V}\]"):
        train(mixed, tiny_config(0), FAST, progress=False)


def test_losses_weigh_log_errors_as_named():
    """One sample predicted e^0.5 too slow, one e^0.1 too fast, a padded row (weight 0) far
    off: squared, absolute and relative error of the log time, padding ignored."""
    from types import SimpleNamespace

    from mdot_jax.training.train import _loss

    batch = SimpleNamespace(target=jax.numpy.zeros((1, 3)),
                            weight=jax.numpy.array([[1.0, 1.0, 0.0]]))
    pred = jax.numpy.array([[0.25, -0.05, 9.0]])  # normalised: x target_std 2 = 0.5, -0.1
    assert float(_loss(pred, batch, 2.0, "mse")) == pytest.approx((0.25 + 0.01) / 2)
    assert float(_loss(pred, batch, 2.0, "l1")) == pytest.approx(0.3)
    assert float(_loss(pred, batch, 2.0, "relative")) == pytest.approx(
        (np.expm1(0.5) - np.expm1(-0.1)) / 2, rel=1e-5)
    with pytest.raises(ValueError, match="loss 'huber'"):
        TrainConfig(loss="huber")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mdot", "gnn"])  # the paper's model, the shipped network
def test_mdot_train_then_predict_from_the_command_line(tiny_real_dataset, tmp_path, capsys,
                                                       arch):
    """`mdot train` on a dataset directory holds out one family fold, prints its test metrics,
    writes them with the split into a checkpoint that `mdot predict --checkpoint DIR` uses;
    the checkpoint, its card and the prediction's parts name the network it trained."""
    import onnx
    from onnx_builders import conv_bn_relu

    from mdot_jax.cli import main
    from mdot_jax.data.dataset import make_splits

    ds, out = tiny_real_dataset, tmp_path / "ckpt"
    assert main(["train", "--dataset", str(ds.root), "--split", "family", "--fold", "1",
                 "--model-config", json.dumps(dict(d_model=16, n_heads=2, n_layers=1,
                                                   arch=arch)),
                 "--train-config", '{"epochs": 2, "tokens_per_batch": 2048}',
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    meta = checkpoint.read_metadata(out)
    test_idx = make_splits(ds, "family", 5, seed=0)[1][1]
    assert meta["dataset"]["split"] == "family" and meta["dataset"]["fold"] == 1
    assert meta["dataset"]["num_test"] + meta["dataset"]["test_excluded_too_long"] == len(
        test_idx) and meta["dataset"]["num_train"] == len(ds) - len(test_idx)
    m = meta["metrics"]
    assert f"MAPE {m['mape']:.2f}% on {m['n']} samples" in printed and m["model_only"]
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    assert main(["predict", str(model), "--batch-size", "4", "--checkpoint", str(out),
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["iteration_ms"] == pytest.approx(
        Predictor.load(out).predict(model, batch_size=4).iteration_ms)
    assert set(row["parts"]) == {arch, "lightgbm"}
    label = {"mdot": "MDOT", "gnn": "GNN"}[arch]
    assert f"of which {label} alone" in printed
    assert (out / "README.md").read_text().startswith(f"# {label} trained on")
