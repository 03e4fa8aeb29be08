"""Training (`mdot_jax.training.train`): compiled shapes, resuming, data parallel, fusion
versions, losses, `mdot train`."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from mdot_jax.data.features import FeatureCache
from mdot_jax.models import tiny_config
from mdot_jax.serving.predict import Predictor
from mdot_jax.storage import checkpoint
from mdot_jax.training.train import TrainConfig, train

FAST = TrainConfig(epochs=2, tokens_per_batch=2048, val_fraction=0.2)


@pytest.mark.slow
def test_train_step_compiles_once_per_bucket(trained, tiny_real_dataset):
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    buckets = {b.op_type.shape[1] for b, _ in cache.batches(
        trained_samples(trained, tiny_real_dataset), 2048)}
    assert trained.info["compiled_train_shapes"] == len(buckets) >= 1
    assert trained.info["steps"] > len(buckets)  # several steps per shape, no recompiles


def trained_samples(trained, ds):
    return ds.samples[: trained.info["train_samples"]]


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


@pytest.mark.slow
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
    from mdot_jax.data.splits import make_splits

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
