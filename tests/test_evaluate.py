"""Evaluation harness: every baseline fits and predicts on a tiny real dataset, on identical
folds; results resume; summary files are written."""

import json

import numpy as np
import pytest

from converters.vocab import VOCAB
from mdot_jax.cli import main
from mdot_jax.data.dataset import load_dataset
from mdot_jax.evaluation.evaluate import _read, run
from mdot_jax.evaluation.report import summarize
from mdot_jax.training.train import TrainConfig

ALL = ["lightgbm", "mlp", "analytic", "roofline", "per_op", "gnn", "lstm", "mdot-pe-none",
       "mdot-pe-distance_bias"]
# the fast tier: one of each kind (trees, fitted formula, message passing, Transformer); the
# slow tier runs them all, ablations included
FAST = ["lightgbm", "analytic", "gnn", "mdot-pe-none"]


@pytest.mark.parametrize("methods", [FAST, pytest.param(ALL, marks=pytest.mark.slow)],
                         ids=["fast", "all"])
@pytest.mark.slow
def test_every_method_on_identical_folds(tiny_real_dataset, tmp_path, methods):
    budget = TrainConfig(epochs=1, tokens_per_batch=2048)
    rows = run(tiny_real_dataset, tmp_path, split="family", folds=2, methods=methods,
               budget=budget, progress=False)
    assert len(rows) == 2 * len(methods)
    for fold in (0, 1):
        keys = {tuple(r["test_keys"]) for r in rows if r["fold"] == fold}
        assert len(keys) == 1  # every method was tested on the same samples
    for r in rows:
        assert len(r["pred_ms"]) == len(r["test_keys"])
        assert np.all(np.isfinite(r["pred_ms"])) and min(r["pred_ms"]) > 0, r["method"]
        assert r["metrics"]["mape"] >= 0
    # resuming runs nothing again
    before = (tmp_path / "results.jsonl").read_text()
    run(tiny_real_dataset, tmp_path, split="family", folds=2, methods=methods, budget=budget,
        progress=False)
    assert (tmp_path / "results.jsonl").read_text() == before
    # results of another version of the dataset are never mixed in
    stale = before.replace(tiny_real_dataset.fingerprint(), "0123456789abcdef", 1)
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / "results.jsonl").write_text(stale)
    with pytest.raises(ValueError, match="0123456789abcdef"):
        run(tiny_real_dataset, tmp_path / "stale", split="family", folds=2, methods=methods,
            budget=budget, progress=False)
    # nor results of the same measurements converted differently (a resequenced copy)
    resequenced = before.replace(tiny_real_dataset.sequences_fingerprint(), "fedcba9876543210")
    (tmp_path / "stale" / "results.jsonl").write_text(resequenced)
    with pytest.raises(ValueError, match="fedcba9876543210"):
        run(tiny_real_dataset, tmp_path / "stale", split="family", folds=2, methods=methods,
            budget=budget, progress=False)
    # nor results tested on other folds (a changed split rule)
    moved = json.loads(before.splitlines()[0])
    moved["fold"] = 1 - moved["fold"]
    (tmp_path / "stale" / "results.jsonl").write_text(json.dumps(moved) + "\n")
    with pytest.raises(ValueError, match="split rule"):
        run(tiny_real_dataset, tmp_path / "stale", split="family", folds=2, methods=methods,
            budget=budget, progress=False)
    result = summarize(_read(tmp_path / "results.jsonl"), tiny_real_dataset, tmp_path, "cmd")
    assert set(result["methods"]) == set(methods)
    assert {"mae_ms", "rmse_ms", "mape"} <= set(result["methods"]["gnn"])
    assert json.loads((tmp_path / "results.json").read_text())["command"] == "cmd"
    assert (tmp_path / "pred_vs_measured.png").stat().st_size > 0
    assert (tmp_path / "error_by_family.png").stat().st_size > 0
    table = (tmp_path / "table.md").read_text()
    assert "| lightgbm |" in table and "| mdot-pe-none |" in table  # the library's default
    assert "| mdot-pe-distance_bias |" not in table  # ablations: only paired with mdot
    # the shipped method (here the library's default, no ensemble asked) fold by fold
    folds = result["per_fold"]["mdot-pe-none"]
    assert [f["fold"] for f in folds] == [0, 1] and "Per fold, `mdot-pe-none`" in table
    for f in folds:
        [r] = [r for r in rows if r["method"] == "mdot-pe-none" and r["fold"] == f["fold"]]
        assert f["mape"] == pytest.approx(r["metrics"]["mape"])
        assert f["samples"] == len(r["test_keys"]) and f["families"] >= 1


def test_error_analysis_by_family_and_op_type(tiny_real_dataset):
    """Predictions 10% off on one family and exact elsewhere: that family is the worst at
    10%, and an op type's with/without MAPEs are the means over the samples that hold it."""
    from mdot_jax.evaluation.report import error_analysis

    samples = tiny_real_dataset.samples
    bad = samples[0].family
    pred = [s.label_ms * (1.1 if s.family == bad else 1.0) for s in samples]
    rows = [dict(method="m", test_keys=[s.key for s in samples], pred_ms=pred)]
    a = error_analysis(rows, tiny_real_dataset, "m")
    assert a["samples"] == len(samples)
    assert a["worst_families"][0]["family"] == bad
    assert np.isclose(a["worst_families"][0]["mape"], 10.0)
    assert all(r["mape"] == 0 for r in a["worst_families"][1:])
    err = np.array([10.0 if s.family == bad else 0.0 for s in samples])
    layouts = np.array([s.workload.layout for s in samples])
    for layout, r in a["by_layout"].items():
        assert r["n"] == (layouts == layout).sum()
        assert np.isclose(r["mape"], err[layouts == layout].mean())
    for r in a["op_types"]:
        has = np.array([(s.seq.op_type == VOCAB.index(r["op"])).any() for s in samples])
        assert np.isclose(r["with"], err[has].mean()) and np.isclose(r["without"], err[~has].mean())


def test_ablations_are_compared_on_the_folds_they_share():
    """A variant run on fold 0 only is compared with mdot's fold 0, not its mean over all."""
    from mdot_jax.evaluation.report import paired_ablations

    def row(method, fold, mape):
        return dict(method=method, fold=fold, seed=0,
                    metrics=dict(mape=mape, mae_ms=mape / 10, rmse_ms=mape / 5))

    rows = [row("mdot", 0, 10.0), row("mdot", 1, 30.0), row("mdot-concat", 0, 12.0),
            row("mdot-pe-none", 0, 9.0), row("mdot-pe-none", 1, 33.0), row("lstm", 0, 5.0)]
    by = {a["method"]: a for a in paired_ablations(rows)}
    assert set(by) == {"mdot-concat", "mdot-pe-none"}
    assert by["mdot-concat"]["runs"] == 1 and by["mdot-concat"]["mdot_mape"] == 10.0
    assert by["mdot-pe-none"]["runs"] == 2 and by["mdot-pe-none"]["wins"] == 1
    assert by["mdot-pe-none"]["mape"] == 21.0 and by["mdot-pe-none"]["mdot_mape"] == 20.0
    assert by["mdot-concat"]["mdot_rmse_ms"] == 2.0


def test_only_folds_runs_a_subset_of_the_same_split(tiny_real_dataset, tmp_path):
    budget = TrainConfig(epochs=1)
    full = run(tiny_real_dataset, tmp_path / "all", folds=3, methods=["roofline"],
               budget=budget, progress=False)
    some = run(tiny_real_dataset, tmp_path / "some", folds=3, methods=["roofline"],
               budget=budget, only_folds=[2], progress=False)
    assert [r["fold"] for r in some] == [2]
    assert some[0]["test_keys"] == next(r for r in full if r["fold"] == 2)["test_keys"]
    with pytest.raises(ValueError, match="folds 0-2"):
        run(tiny_real_dataset, tmp_path / "bad", folds=3, methods=["roofline"],
            budget=budget, only_folds=[3], progress=False)


def test_every_method_name_builds_that_method():
    """Each neural method trains the architecture / variant its name says (a config passed
    to the wrong field once made every neural baseline a copy of MDOT)."""
    from mdot_jax.evaluation.methods import ALL_METHODS, NeuralMethod, make_method
    from mdot_jax.models import PAPER_PE, ModelConfig

    cfgs = {m: make_method(m, 0, TrainConfig()) for m in ALL_METHODS}
    neural = {m: c for m, c in cfgs.items() if isinstance(c, NeuralMethod)}
    assert {m: neural[m].model_cfg.arch for m in ("per_op", "gnn", "lstm", "mdot")} == \
        {"per_op": "per_op", "gnn": "gnn", "lstm": "lstm", "mdot": "mdot"}
    assert neural["mdot-concat"].model_cfg.fusion == "concat"
    assert neural["mdot-per_op"].model_cfg.readout == "per_op"
    assert neural["mdot-pe-none"].model_cfg.pe == () == ModelConfig().pe  # the default
    assert neural["mdot"].model_cfg.pe == PAPER_PE  # the tables' mdot row: the paper's model
    assert neural["mdot-pe-random_walk"].model_cfg.pe == ("random_walk",)
    assert neural["mdot-relative"].budget.loss == "relative"
    assert neural["mdot-pe-none-l1"].budget.loss == "l1"
    assert neural["mdot-pe-none-l1"].model_cfg == ModelConfig()
    # no two neural methods train the same thing
    keys = {(repr(c.model_cfg), c.budget.loss) for c in neural.values()}
    assert len(keys) == len(neural)
    # a checkpoint's network names the method whose results calibrate it (`mdot calibrate`)
    for m in ("gnn", "lstm", "per_op", "mdot", "mdot-pe-none", "mdot-pe-depth"):
        assert neural[m].model_cfg.method == m
    assert ModelConfig(arch="gnn").label == "GNN" and ModelConfig().label == "MDOT"


def test_ensembles_average_finished_runs_in_log_space():
    """Seed and method ensembles are the geometric mean of the members' predictions,
    matched by sample key (members list their test samples in different orders)."""
    from mdot_jax.evaluation.report import ensemble_rows

    labels = {"a": 100.0, "b": 10.0}

    def row(method, seed, preds):
        keys = sorted(preds, reverse=seed == 1)
        return dict(method=method, fold=0, seed=seed, split="family", fit_s=1.0,
                    predict_ms_per_sample=0.5, test_keys=keys, pred_ms=[preds[k] for k in keys])

    rows = [row("mdot", 0, {"a": 50.0, "b": 10.0}), row("mdot", 1, {"a": 200.0, "b": 40.0}),
            row("lightgbm", 0, {"a": 200.0, "b": 2.5})]
    by = {r["method"]: r for r in ensemble_rows(rows, labels, ["mdot+lightgbm"])}
    assert set(by) == {"ensemble(mdot x2)", "ensemble(mdot+lightgbm)"}
    seeds = by["ensemble(mdot x2)"]
    assert seeds["test_keys"] == ["a", "b"] and np.allclose(seeds["pred_ms"], [100.0, 20.0])
    assert seeds["metrics"]["mape"] == pytest.approx(50.0)  # (0% + 100%) / 2
    assert seeds["fit_s"] == 2.0 and seeds["members"] == [["mdot", 0], ["mdot", 1]]
    both = by["ensemble(mdot+lightgbm)"]
    assert np.allclose(both["pred_ms"], [100.0, 5.0])
    assert both["metrics"]["mae_ms"] == pytest.approx(2.5)
    # a member not run yet (the pipeline runs it later): no row, no error; a typo: an error
    assert not [r for r in ensemble_rows(rows, labels, ["mdot+gnn"]) if "gnn" in r["method"]]
    with pytest.raises(ValueError, match="unknown method gnm"):
        ensemble_rows(rows, labels, ["mdot+gnm"])
    rows[1]["test_keys"] = ["a", "c"]
    with pytest.raises(ValueError, match="different samples"):
        ensemble_rows(rows, labels)


@pytest.mark.slow
def test_views_are_predicted_by_the_models_of_the_training_graphs(tiny_timm_build, tmp_path,
                                                                   capsys):
    """The TorchScript eval() exports of the same samples (BatchNormalization folded into
    Conv, read back as training by the converter), predicted by each fold's fitted model."""
    from mdot_jax.data.build_timm import resequence
    from mdot_jax.data.resequence import RESEQUENCE_FAILED

    ds = resequence(tiny_timm_build.root, tmp_path / "fused", progress=False)  # as shipped
    assert main(["dataset", "resequence", str(ds.root), "--out", str(tmp_path / "eval"),
                 "--view", "torchscript"]) == 0
    view = load_dataset(tmp_path / "eval")
    failed = (tmp_path / "eval" / RESEQUENCE_FAILED).read_text().splitlines()  # says what failed
    said = capsys.readouterr().out
    assert f"{len(view)} samples, torchscript graphs" in said
    assert (f"{len(failed)} samples left out" in said) == bool(failed)
    assert {s.key for s in view.samples} <= {s.key for s in ds.samples}
    rows = run(ds, tmp_path / "out", split="family", folds=2,
               methods=["lightgbm", "roofline"], views={"eval": view}, progress=False)
    names = {(r["method"], r["fold"]) for r in rows}
    assert names == {(m, f) for m in ("lightgbm", "roofline", "lightgbm@eval", "roofline@eval")
                     for f in (0, 1)}
    again = run(ds, tmp_path / "out", split="family", folds=2,
                methods=["lightgbm", "roofline"], views={"eval": view}, progress=False)
    assert len(again) == len(rows)  # resumed: nothing run twice
    result = summarize(rows, ds, tmp_path / "out", ensembles=["lightgbm+roofline"])
    gaps = {(g["method"], g["view"]): g for g in result["views"]}
    assert set(gaps) == {("lightgbm", "eval"), ("roofline", "eval"),
                         ("ensemble(lightgbm+roofline)", "eval")}
    for g in gaps.values():  # nearly the same graphs once BatchNormalization is put back
        assert abs(g["gap"]) < 1.0, g
    assert "from the view" in (tmp_path / "out" / "table.md").read_text()
    # a resumed run naming no ensembles keeps the ones asked for before
    again = summarize(rows, ds, tmp_path / "out")
    assert again["ensembles"] == ["lightgbm+roofline"]
    assert "ensemble(lightgbm+roofline)" in again["methods"]
    assert "| ensemble(lightgbm+roofline) |" in (tmp_path / "out" / "table.md").read_text()


def test_another_fold_seed_draws_other_folds_and_never_mixes(tiny_real_dataset, tmp_path):
    budget = TrainConfig(epochs=1)
    first = run(tiny_real_dataset, tmp_path / "a", folds=3, methods=["roofline"],
                budget=budget, progress=False)
    other = run(tiny_real_dataset, tmp_path / "b", folds=3, methods=["roofline"],
                budget=budget, fold_seed=1, progress=False)
    assert {r["fold_seed"] for r in other} == {1}
    assert [set(r["test_keys"]) for r in first] != [set(r["test_keys"]) for r in other]
    with pytest.raises(ValueError, match="fold seed"):
        run(tiny_real_dataset, tmp_path / "b", folds=3, methods=["roofline"], budget=budget,
            fold_seed=0, progress=False)


def test_results_go_only_into_a_new_or_own_folder_one_run_at_a_time(tiny_real_dataset,
                                                                    tmp_path):
    from mdot_jax.errors import MdotError
    from mdot_jax.writers import Busy, acquire

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "table.md").write_text("my notes\n")  # a name the summary writes
    with pytest.raises(MdotError, match="a folder of other files .table.md., not an eval"):
        run(tiny_real_dataset, theirs, folds=3, methods=["roofline"], progress=False)
    assert [p.name for p in theirs.iterdir()] == ["table.md"]
    ours = tmp_path / "ours"
    run(tiny_real_dataset, ours, folds=3, methods=["roofline"], only_folds=[0],
        progress=False)
    with acquire(ours / ".lock", str(ours)), pytest.raises(Busy):
        run(tiny_real_dataset, ours, folds=3, methods=["roofline"], progress=False)
    assert len(run(tiny_real_dataset, ours, folds=3, methods=["roofline"],
                   progress=False)) == 3  # resumed after the other run's end
