"""Predictions (`mdot_jax.serving.predict`): bands from calibration, extrapolation warnings."""

import json

import pytest

from mdot_jax.serving.predict import Predictor
from mdot_jax.storage import checkpoint


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
        lo, hi = cal.interval(p.iteration_ms, layout, d)  # widened to hold both members
        members = list(p.parts.values())
        assert p.interval_ms == pytest.approx((min(lo, *members), max(hi, *members)))
        # 3 epochs of 10 samples at batch 4: 3 x ceil(10 / 4) = 9 iterations
        assert p.job_interval_seconds(3, 10, 4) == pytest.approx(
            tuple(9 * ms / 1e3 for ms in p.interval_ms))
        flagged = [w for w in p.warnings if "MDOT and LightGBM disagree" in w]
        assert bool(flagged) == (cal.band(layout, d) is cal.bands[layout][-1])
        # what the held-out predictions of that bin were: members apart by more than its edge
        last = cal.labels(layout)[-1]
        assert all(f"members disagreed by {last} erred by" in w for w in flagged)
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


@pytest.mark.slow
def test_predictions_warn_about_extrapolation(trained, tiny_real_dataset):
    import dataclasses

    predictor = Predictor(trained)
    s = tiny_real_dataset.samples[0]
    inside = predictor.predict_many([(s.seq, s.workload)])[0]
    assert inside.warnings == []
    far = dataclasses.replace(s.workload, batch_size=4 * max(trained.info["batch_sizes"]),
                              input_size=1)
    (warned,) = predictor.predict_many([(s.seq, far)])
    said = [w for w in warned.warnings if "outside the trained range" in w]  # (and the step's
    assert len(said) == 2 and "extrapolation" in said[0]  # time, where outside the labels')
    assert "batch size" in said[0] and "input size 1 " in said[1]
    assert trained.info["precisions"] == ["amp-fp16"]  # the timm tables' only precision
    (bf16,) = predictor.predict_many([(s.seq, dataclasses.replace(s.workload,
                                                                  precision="bf16"))])
    assert bf16.warnings == ["precision bf16 was never trained on (only amp-fp16): "
                             "extrapolation"]


def _conv_block(extra=()):
    """`conv_bn_relu` (training) on 224 px images, then the unary operators `extra`."""
    from onnx import helper
    from onnx_builders import conv_bn_relu

    m = conv_bn_relu(training=True, size=224)
    for i, op in enumerate(extra):
        m.graph.node.append(helper.make_node(op, [m.graph.output[0].name], [f"e{i}"]))
        m.graph.output[0].name = f"e{i}"
    return m


def test_an_operator_type_never_trained_on_is_named_and_leaves_no_band(tmp_path, monkeypatch):
    """The default checkpoint never saw Tanh: a model with one is predicted with a warning
    naming it and without a band; the same model without it keeps its band."""
    import onnx

    predictor = Predictor.load("timm-rtx3090")
    # (one conv block is faster than any step it trained on: that rule apart, another test's)
    monkeypatch.setitem(predictor.trained.info, "label_ms", [1.0, 1e4])
    assert "Tanh" not in predictor.trained.info["op_types"]
    for extra, known in (((), True), (("Tanh",), False)):
        onnx.save(_conv_block(extra), tmp_path / "m.onnx")
        p = predictor.predict(tmp_path / "m.onnx", batch_size=8)
        named = [w for w in p.warnings if "never trained on: Tanh" in w]
        assert bool(named) != known and (p.interval_ms is not None) == known, p.warnings


def test_a_band_holds_every_members_prediction_however_far_apart(tmp_path, monkeypatch):
    """Members 10x apart (beyond every calibrated disagreement bin): the band still holds
    both members' predictions, so it widens with the disagreement without limit."""
    import math

    import onnx

    predictor = Predictor.load("timm-rtx3090")
    onnx.save(_conv_block(), tmp_path / "m.onnx")
    trees = predictor.companion.predict
    monkeypatch.setattr(predictor.companion, "predict", lambda samples: 10 * trees(samples))
    far = predictor.predict(tmp_path / "m.onnx", batch_size=8)
    lo, hi = far.interval_ms
    parts = sorted(far.parts.values())
    assert lo <= parts[0] and parts[-1] <= hi and parts[-1] / parts[0] > 10
    calibrated = predictor.calibration.band("nchw", math.log(parts[-1] / parts[0]))
    a, b = calibrated.interval(far.iteration_ms)
    assert not a <= parts[0] <= parts[-1] <= b  # the calibrated band alone would not


def test_a_sequence_converted_at_another_batch_is_refused(tmp_path):
    """A pre-converted sequence carries its batch in its shapes: predicting it at another
    batch size gave the small batch's time (401 ms for 4,168) without a word."""
    import onnx

    from converters import convert
    from mdot_jax.errors import RequestError

    predictor = Predictor.load("timm-rtx3090")
    onnx.save(_conv_block(), tmp_path / "m.onnx")
    fuse = int(predictor.trained.feature_cfg.fused)
    seq = convert(tmp_path / "m.onnx", batch_size=8, fuse=fuse)
    at_8 = predictor.predict(seq, batch_size=8).iteration_ms
    assert at_8 == predictor.predict(tmp_path / "m.onnx", batch_size=8).iteration_ms
    with pytest.raises(RequestError, match=r"batch_size 512.*converted at batch 8"):
        predictor.predict(seq, batch_size=512)


def test_a_batch_past_the_trained_ones_grows_as_its_last_doubling(tmp_path):
    """Past the largest trained batch E, a step is priced at E and grown by (b / E) ** e, e the
    growth of its doubling from E / 2 to E in [0, 1] (not flat trees); the members alike, the
    memory the asked batch's; a sequence converted at the batch, which cannot be converted at
    E, is extrapolated and said so."""
    import math

    import onnx

    from mdot_jax.serving.batch_edge import edge, growth

    path = tmp_path / "m.onnx"
    onnx.save(_conv_block(), path)
    predictor = Predictor.load("cpu-amd-epyc-f26m2-2t")
    assert predictor.trained.info["batch_sizes"][-1] == 64
    half, top = (predictor.predict(path, batch_size=b, image_size=64) for b in (32, 64))
    p = predictor.predict(path, batch_size=256, image_size=64)
    e = min(1.0, max(0.0, math.log2(top.iteration_ms / half.iteration_ms)))
    assert p.iteration_ms == pytest.approx(top.iteration_ms * 4 ** e, rel=1e-6)
    assert 0 < e < 1 and p.iteration_ms > top.iteration_ms
    assert p.parts == pytest.approx({m: v * 4 ** e for m, v in top.parts.items()}, rel=1e-6)
    assert p.warnings[0] == (f"batch size 256 is past the trained range 2-64: priced at batch "
                             f"64 and grown {4 ** e:.3g}x, as the step grew from batch 32 to 64: "
                             "extrapolation")
    fixed = predictor.predict(predictor.sequence(path, batch_size=256, image_size=64),
                              batch_size=256, image_size=64)
    assert "batch size 256 is outside the trained range 2-64: extrapolation" in fixed.warnings
    assert p.memory_gb == fixed.memory_gb > 2 * top.memory_gb  # the batch asked for's
    assert edge([2, 64], 64) is None and edge([2, 64], 65) == 64 and edge([1], 8) is None
    assert growth(10.0, 5.0, 4.0) == 1.0 and growth(1.0, 4.0, 4.0) == 4.0  # e clamped to [0, 1]
