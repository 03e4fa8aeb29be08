"""Train on one split of a dataset, test on the held-out fold, save a checkpoint; refit a
checkpoint's companion."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from mdot_jax.data.dataset import Dataset
from mdot_jax.data.features import FeatureCache
from mdot_jax.data.splits import make_splits, split_validation
from mdot_jax.errors import UsageError
from mdot_jax.kernels.cost_model import OpSumLine, attach, load_cost_model
from mdot_jax.measure import core_set
from mdot_jax.metrics import regression_metrics
from mdot_jax.models import ModelConfig
from mdot_jax.models.ensemble import combine
from mdot_jax.models.trained import Trained, predict_samples
from mdot_jax.models.trees import TreeModel
from mdot_jax.storage import checkpoint
from mdot_jax.training.train import TrainConfig, make_mesh, make_steps, train


def score(trained: Trained, samples) -> tuple[np.ndarray, dict]:
    """Predicted ms and metrics of a trained model on `samples`."""
    import optax

    cache = FeatureCache(trained.stats, trained.feature_cfg, trained.model_cfg.vocab_size)
    _, predict_step, _ = make_steps(trained.graphdef, optax.identity(),
                                    trained.stats.target_std, "mse", make_mesh())
    pred = predict_samples(predict_step, trained.params, cache, samples)
    return pred, regression_metrics(pred, [s.label_ms for s in samples])


def fit_companion(trained: Trained, train_samples, train_cfg: TrainConfig,
                  op_sum: OpSumLine | None = None) -> tuple[TreeModel, dict]:
    """The LightGBM companion, fitted on the network's training samples with its validation
    carve-out, and the validation MAPE of the network, the trees, the `op_sum` line (if
    any) and their combination."""
    trees = TreeModel.fit(train_samples, seed=train_cfg.seed, val_fraction=train_cfg.val_fraction,
                          val_by=train_cfg.val_by)
    _, val = split_validation(train_samples, train_cfg.val_fraction, train_cfg.seed,
                              train_cfg.val_by)
    val = [s for s in val if s.seq.num_ops <= trained.feature_cfg.buckets[-1]]
    if not val:
        return trees, {}
    members = {"model": score(trained, val)[0], "lightgbm": trees.predict(val)}
    if op_sum is not None:
        members["op_sum"] = op_sum.predict(val)
    true = [s.label_ms for s in val]
    return trees, dict(val_mape=regression_metrics(combine(*members.values()), true)["mape"],
                       **{f"val_mape_{k}": regression_metrics(v, true)["mape"]
                          for k, v in members.items()})


def _fold(ds: Dataset, split: str, folds: int, fold: int, seed: int):
    """(train, test) sample indices of `fold` of `split` ("none": every sample trains)."""
    if split == "none":
        return np.arange(len(ds)), np.array([], int)
    splits = make_splits(ds, split, folds, seed=seed)
    if not 0 <= fold < len(splits):
        raise UsageError(f"--fold {fold}: the {split} split has folds 0-{len(splits) - 1}")
    return splits[fold]


def train_and_save(ds: Dataset, out: str | Path, *, split: str = "family", fold: int = 0,
                   folds: int = 5, model_cfg: ModelConfig = ModelConfig(),
                   train_cfg: TrainConfig = TrainConfig(), companion: bool = True,
                   cost_model=None, force: bool = False, progress: bool = True, log=None
                   ) -> dict:
    """Trains on every fold but `fold` of `split` (or on everything with split="none"),
    reports test metrics on `fold` and writes a self-describing checkpoint to `out`; with
    `companion`, a LightGBM companion is fitted on the same samples and saved with it (the
    test metrics are then those of the combined prediction; `model_only` the network's).
    With a kernel `cost_model` (`models.kernels.CostModel`), every operator gets its predicted time
    as a feature (op-grounded) and the checkpoint carries the cost model; with a companion
    too, the operator-sum line (`models.kernels.OpSumLine` with its parameter term, fitted on the
    same samples: docs/studies/op-sum-params.md) is the prediction's third member.
    A killed run continues from its last epoch when re-run with the same arguments (the
    state lives in `.<out>.resume/` beside `out` until the checkpoint is written). `out` must
    be new, empty, or (with `force`) a checkpoint to replace: checked before training."""
    checkpoint.prepare_out(out, force=force)
    if cost_model is not None:
        attach([s.seq for s in ds.samples], cost_model)
    train_idx, test_idx = _fold(ds, split, folds, fold, train_cfg.seed)
    train_samples = [ds.samples[i] for i in train_idx]
    test_samples = [ds.samples[i] for i in test_idx]
    resume_dir = Path(out).absolute().with_name(f".{Path(out).name}.resume")
    trained = train(train_samples, model_cfg, train_cfg, progress=progress, log=log,
                    resume_dir=resume_dir)
    op_grounded = companion and cost_model is not None
    line = OpSumLine.fit(train_samples, params=True) if op_grounded else None
    trees, trees_info = (fit_companion(trained, train_samples, train_cfg, line) if companion
                         else (None, None))
    longest = trained.feature_cfg.buckets[-1]
    held = [s for s in test_samples if s.seq.num_ops <= longest]
    metrics = {}
    if held:
        pred, metrics = score(trained, held)
        if trees:
            members = [pred, trees.predict(held), *([line.predict(held)] if line else [])]
            metrics = dict(regression_metrics(combine(*members), [s.label_ms for s in held]),
                           model_only=metrics)
    dataset = dict(path=str(ds.root), fingerprint=ds.fingerprint(), split=split, fold=fold,
                   folds=folds, num_train=len(train_samples), num_test=len(held),
                   test_excluded_too_long=len(test_samples) - len(held),
                   devices=sorted({s.workload.device for s in ds.samples}))
    probe = core_set.probe_of(ds.samples) if len(dataset["devices"]) == 1 else None
    if probe:  # what describes the device: `mdot adapt --probe` picks the nearest checkpoint
        dataset["probe"] = probe
    checkpoint.save(trained, out, dataset=dataset, metrics=metrics, companion=trees,
                    companion_info=trees_info, cost_model=cost_model, op_sum=line,
                    description=f"{model_cfg.label} trained on {ds.root.name} " + (
                        "(every sample)" if split == "none" else f"({split} split, fold {fold})"))
    shutil.rmtree(resume_dir, ignore_errors=True)
    return dict(test_metrics=metrics, info=trained.info, dataset=dataset)


def refit_companion(path: str | Path, ds: Dataset) -> dict:
    """Fits the LightGBM companion of the checkpoint at `path` again with this version's
    recipe (`models.trees`), on the samples and validation carve-out its MDOT was trained on
    (its recorded split, fold and seed), and replaces it; returns the validation metrics.
    The checkpoint's error bands described the old companion, so they are dropped: run
    `calibrate` again on results of the new recipe. An op-grounded checkpoint's operator
    times come from the kernel cost model it carries; its operator-sum line is kept."""
    meta = checkpoint.read_metadata(path)
    cost_model = load_cost_model(path)
    if cost_model is not None:
        attach([s.seq for s in ds.samples], cost_model)
    recorded = meta["dataset"]
    if recorded.get("fingerprint") != ds.fingerprint():
        raise ValueError(f"{path} was trained on dataset version {recorded.get('fingerprint')}, "
                         f"{ds.root} is version {ds.fingerprint()}")
    train_cfg = TrainConfig(**meta["train"]["train_config"])
    train_idx, _ = _fold(ds, recorded.get("split", "none"), recorded.get("folds", 5),
                         recorded.get("fold", 0), train_cfg.seed)
    samples = [ds.samples[i] for i in train_idx]
    line = OpSumLine.from_json(meta["op_sum"]) if meta.get("op_sum") else None
    trees, info = fit_companion(checkpoint.load(path), samples, train_cfg, line)
    checkpoint.attach_companion(path, trees, info)
    checkpoint.attach_calibration(path, None)
    return info
