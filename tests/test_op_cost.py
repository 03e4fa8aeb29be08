"""Kernel cost model and op-grounded prediction: fitted on operators measured here, it prices
every operator of a graph; predictors trained with those times carry the cost model, and
`mdot predict --top` says where the time goes."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
from converters.sequence import LOAD_FIELDS  # noqa: E402
from mdot_jax.cli import main  # noqa: E402
from mdot_jax.data.dataset import OP_MS, load_dataset  # noqa: E402
from mdot_jax.data.features import (  # noqa: E402
    FeatureConfig,
    fit_stats,
    op_load,
    seq_features,
    sequences_op_costs,
)
from mdot_jax.errors import CheckpointError  # noqa: E402
from mdot_jax.kernels.cost_model import COST_MODEL, CostModel, attach  # noqa: E402
from mdot_jax.kernels.op_profile import OpProtocol, profile_ops, read_op_samples  # noqa: E402
from mdot_jax.kernels.specs import OpSpec  # noqa: E402

FAST_OPS = OpProtocol(warmup=1, repeats=3, side_repeats=1, min_repeat_ms=0.5,
                      max_spread=float("inf"), max_others=float("inf"))


@pytest.fixture(scope="module")
def ops(small_models, tmp_path_factory):
    """Operators of small graphs, measured on this machine, and a cost model fitted on them
    (applied below to the graphs of the tiny timm dataset: any rows can be priced)."""
    out = tmp_path_factory.mktemp("ops")
    profile_ops(out, n=150, sources=[small_models], threads=1, progress=False,
                protocol=FAST_OPS)
    records = read_op_samples(out)
    return out, records, CostModel.fit(records, seed=0)


def _fresh(ds_root):
    """A copy of the dataset in a folder of its own, loaded: its sequences are its own (attach
    writes into them), never the ones other tests load from `ds_root`."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fresh-")) / "ds"
    shutil.copytree(ds_root, root)
    return load_dataset(root)


@pytest.mark.slow
def test_the_cost_model_learns_the_measured_operators_and_round_trips(ops, tmp_path):
    _, records, model = ops
    assert len(records) >= 50
    specs = [OpSpec.from_json(d["spec"]) for d in records]
    pred = model.predict(specs)
    y = np.asarray([d["label_ms"] for d in records])
    assert np.all(np.isfinite(pred)) and np.all(pred > 0)
    # in-sample: it fits its own measurements far better than their spread
    ape = np.abs(pred / y - 1)
    assert np.median(ape) < 0.5 and np.median(np.abs(np.median(y) / y - 1)) > np.median(ape)
    model.save(tmp_path / "c.json")
    again = CostModel.load(tmp_path / "c.json")
    assert np.allclose(again.predict(specs), pred)
    model.save(tmp_path / "c.json.xz")  # compressed, as checkpoints carry it
    assert np.allclose(CostModel.load(tmp_path / "c.json.xz").predict(specs), pred)
    bad = json.loads((tmp_path / "c.json").read_text()) | {"version": 99}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="features version 99"):
        CostModel.load(tmp_path / "bad.json")


def test_operator_times_are_a_fourth_dimension_and_a_graph_total(ops, tiny_real_dataset):
    model = ops[2]
    ds = _fresh(tiny_real_dataset.root)
    seqs = [s.seq for s in ds.samples]
    assert not sequences_op_costs(seqs)
    attach(seqs[:1], model)
    with pytest.raises(ValueError, match="attach them to all or none"):
        sequences_op_costs(seqs)
    attach(seqs, model)
    q = seqs[0]
    assert len(q.meta[OP_MS]) == q.num_ops and op_load(q).shape == (q.num_ops,
                                                                     len(LOAD_FIELDS) + 1)
    stats = fit_stats(ds.samples)
    assert len(stats.load_mean) == len(LOAD_FIELDS) + 1
    assert seq_features(q, stats, FeatureConfig(op_costs=True)).load.shape[1] == 7
    with pytest.raises(ValueError, match="op_costs=False"):
        seq_features(q, stats, FeatureConfig(op_costs=False))


@pytest.mark.slow
def test_an_op_grounded_checkpoint_carries_its_cost_model(ops, tiny_real_dataset, tmp_path,
                                                          capsys):
    ops_dir = ops[0]
    cost = tmp_path / "cost.json.xz"
    assert main(["kernels", str(ops_dir), "--out", str(cost)]) == 0
    assert main(["kernels", str(ops_dir), "--out", str(cost)]) == 2  # exists: not replaced
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--dataset", str(_fresh(tiny_real_dataset.root).root), "--out", str(ckpt),
                 "--recipe", "tiny", "--split", "none", "--op-costs", str(cost)]) == 0
    meta = json.loads((ckpt / "metadata.json").read_text())
    assert meta["feature_config"]["op_costs"] and COST_MODEL in meta["files"]
    assert meta["model_config"]["load_dim"] == len(LOAD_FIELDS) + 1
    from mdot_jax.serving.predict import Predictor

    sample = _fresh(tiny_real_dataset.root).samples[0]
    p = Predictor.load(ckpt).predict(sample.seq, batch_size=sample.workload.batch_size,
                                     layout=sample.workload.layout)
    assert np.isfinite(p.iteration_ms) and p.iteration_ms > 0
    capsys.readouterr()
    # where the time goes: every operator, shares adding up to the prediction less the loss
    import onnx
    from onnx_builders import conv_bn_relu

    onnx_path = str(tmp_path / "m.onnx")
    onnx.save(conv_bn_relu(training=True), onnx_path)
    assert main(["predict", onnx_path, "--checkpoint", str(ckpt), "--batch-size",
                 str(sample.workload.batch_size), "--layout", sample.workload.layout,
                 "--top", "3", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert len(row["operators"]) == row["num_ops"]
    assert 0.5 * row["iteration_ms"] < sum(o["ms"] for o in row["operators"]) <= \
        row["iteration_ms"] + 1e-6
    assert "this checkpoint's kernel cost model" in row["operators_from"]
    assert main(["predict", onnx_path, "--checkpoint", str(ckpt), "--batch-size",
                 str(sample.workload.batch_size), "--layout", sample.workload.layout,
                 "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "the 3 most expensive operators" in text
    # a checkpoint whose cost model changed, or that lost it, is refused
    data = (ckpt / COST_MODEL).read_bytes()
    (ckpt / COST_MODEL).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="cost_model"):
        Predictor.load(ckpt)
    (ckpt / COST_MODEL).unlink()
    with pytest.raises(CheckpointError, match="cost_model"):
        Predictor.load(ckpt)


def test_top_operators_of_a_shipped_checkpoint(tmp_path, capsys):
    """Whole-model checkpoints say where the time goes with the shipped kernel model, scaled
    to their prediction, and say which device's kernels those are."""
    import onnx
    from onnx_builders import conv_bn_relu

    path = str(tmp_path / "m.onnx")
    onnx.save(conv_bn_relu(training=True), path)
    assert main(["predict", path, "--batch-size", "8", "--checkpoint",
                 "cpu-amd-epyc-f26m2-2t", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "the 2 most expensive operators" in out
    assert ("priced by the kernel cost model of cpu-amd-epyc-f25m17-2t; none of "
            "cpu-amd-epyc-f26m2-2t is shipped") in out
    assert "Conv" in out.split("most expensive")[1]
    # a GPU's prediction is not split by a CPU's kernels: it says none of a GPU is shipped
    assert main(["predict", path, "--batch-size", "8", "--top", "2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["operators"] == [] and "no kernel cost model of a GPU" in row["operators_from"]
    # and names the way that does split it
    assert row["operators_from"].endswith("checkpoint gpu-spec-sheet prices each operator from "
                                          "the nvidia-rtx-3090's spec sheet")
    assert main(["predict", path, "--batch-size", "8", "--top", "2", "--device", "rtx3090",
                 "--checkpoint", "gpu-spec-sheet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["operators"]


def test_op_sum_is_composition_alone(ops, tiny_real_dataset):
    from mdot_jax.evaluation.methods import make_method
    from mdot_jax.training.train import TrainConfig

    ds = _fresh(tiny_real_dataset.root)
    method = make_method("op-sum", 0, TrainConfig())
    with pytest.raises(ValueError, match="--op-costs"):
        method.fit(ds.samples)
    attach([s.seq for s in ds.samples], ops[2])
    method.fit(ds.samples)
    pred = method.predict(ds.samples)
    assert np.all(pred > 0) and method.line.a > 0


def test_op_sum_params_adds_a_term_per_parameter(ops, tiny_real_dataset):
    """`op-sum-params`: the line plus e * millions of parameters, fitted by the same relative
    least squares (it fits its training samples no worse than the line without the term);
    saved and read back with `e`; a line without the term saves as before."""
    from mdot_jax.evaluation.methods import make_method
    from mdot_jax.kernels.cost_model import OpSumLine
    from mdot_jax.training.train import TrainConfig

    ds = _fresh(tiny_real_dataset.root)
    attach([s.seq for s in ds.samples], ops[2])
    plain, method = OpSumLine.fit(ds.samples), make_method("op-sum-params", 0, TrainConfig())
    method.fit(ds.samples)
    line, y = method.line, np.array([s.label_ms for s in ds.samples])
    params = OpSumLine.params(ds.samples)
    assert params.min() > 0 and line.e != 0.0 and plain.e == 0.0 and "e" not in plain.to_json()
    np.testing.assert_allclose(line.predict(ds.samples),
                               line.a * OpSumLine.sums(ds.samples) + line.c + line.e * params)

    def sq(p):
        return float(np.sum((p / y - 1) ** 2))

    assert sq(line.predict(ds.samples)) <= sq(plain.predict(ds.samples)) + 1e-9
    assert OpSumLine.from_json(line.to_json()) == line


@pytest.mark.slow
def test_an_op_grounded_checkpoint_predicts_with_the_operator_sum_as_third_member(
        ops, tiny_real_dataset, tmp_path):
    """With a companion, an op-grounded checkpoint carries the operator-sum line with its
    parameter term fitted on its training samples, and predicts the geometric mean of
    network, trees and line; bands are of the three (`mdot calibrate` defaults to them,
    binned by their spread, `op-sum-params` naming the line's rows); the network alone
    (`companion=False`) stays the network alone."""
    from mdot_jax.evaluation.evaluate import calibrate
    from mdot_jax.kernels.cost_model import OpSumLine
    from mdot_jax.models.ensemble import spread
    from mdot_jax.recipes import get
    from mdot_jax.serving.predict import Predictor
    from mdot_jax.storage import checkpoint
    from mdot_jax.training.workflow import train_and_save

    ds = _fresh(tiny_real_dataset.root)
    recipe = get("tiny")
    ckpt = tmp_path / "ckpt"
    train_and_save(ds, ckpt, split="none", model_cfg=recipe.model, train_cfg=recipe.train,
                   cost_model=ops[2], progress=False)
    meta = checkpoint.read_metadata(ckpt)
    line = OpSumLine.fit(ds.samples, params=True)  # split none: every sample trained
    assert meta["op_sum"] == pytest.approx(line.to_json()) and line.e != 0
    card = (ckpt / "README.md").read_text()
    assert line.a > 0 and "third member: the operator sum" in card
    assert "ms per million parameters" in card and "operator sum alone" in card

    samples = _fresh(tiny_real_dataset.root).samples  # without operator times
    items = [(s.seq, s.workload) for s in samples]
    predictor = Predictor.load(ckpt)
    assert predictor.members == ["mdot", "lightgbm", "op-sum"]
    preds = predictor.predict_many(items)
    parts = np.array([[p.parts[m] for m in predictor.members] for p in preds])  # [N, 3]
    attach([s.seq for s in samples], ops[2])
    np.testing.assert_allclose(parts[:, 2], line.predict(samples), rtol=1e-6)
    np.testing.assert_allclose([p.iteration_ms for p in preds],
                               np.exp(np.log(parts).mean(axis=1)), rtol=1e-6)
    alone = Predictor.load(ckpt, companion=False)
    assert alone.members == ["mdot"] and alone.op_sum is None
    assert alone.predict_many(items[:1])[0].iteration_ms == pytest.approx(parts[0, 0], rel=1e-5)

    rows = [dict(method=m, fold=0, seed=0, split="family", dataset=ds.fingerprint(),
                 test_keys=[s.key for s in samples], pred_ms=list(parts[:, i]))
            for i, m in enumerate(("mdot", "lightgbm", "op-sum-params"))]
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match="mdot x lightgbm x op-sum-params: give as many"):
        calibrate(ckpt, results, ds, ("mdot", "lightgbm"))
    cal = calibrate(ckpt, results, ds)
    assert cal.methods == ("mdot", "lightgbm", "op-sum-params")
    preds = Predictor.load(ckpt).predict_many(items)
    d = spread(*parts.T)
    for p, s, di in zip(preds, samples, d):
        band = cal.band(s.workload.layout, di)
        lo, hi = band.interval(p.iteration_ms)  # widened to hold every member's prediction
        members = list(p.parts.values())
        assert p.interval_ms == pytest.approx((min(lo, *members), max(hi, *members)))
        flagged = any("MDOT, LightGBM and the operator sum disagree" in w for w in p.warnings)
        assert flagged == (band is cal.bands[s.workload.layout][-1])


def test_top_sums_each_operator_over_the_layers_of_its_stack(tmp_path, capsys):
    """A language model's 32 identical layers would fill `--top` with one operator 32 times:
    operators of one type whose names differ only in the layer's index are one row, counted."""
    pytest.importorskip("transformers")
    from mdot_jax.serving.prediction import by_layer

    ops = [dict(type="MatMul", name=f"/model/layers.{i}/mlp/up_proj/MatMul", ms=1.0)
           for i in range(3)] + [dict(type="MatMul", name="/lm_head/MatMul", ms=2.5),
                                 dict(type="Add", name="/model/layers.0/mlp/up_proj/MatMul",
                                      ms=0.5)]
    assert by_layer(ops) == [
        dict(type="MatMul", name="/model/layers.*/mlp/up_proj/MatMul", ms=3.0, count=3),
        dict(type="MatMul", name="/lm_head/MatMul", ms=2.5, count=1),
        dict(type="Add", name="/model/layers.*/mlp/up_proj/MatMul", ms=0.5, count=1)]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100,
                                      max_position_embeddings=64)))
    assert main(["predict", str(config), "--seq-len", "32", "--batch-size", "2", "--device",
                 "h100-sxm", "--top", "3"]) == 0
    out = capsys.readouterr().out.split("most expensive operators")[1]
    assert "summed over the layers of its stack" in out
    assert re.search(r"\n +[\d.]+ +[\d.]+% +3  MatMul +/model/layers\.\*/self_attn/", out), out
