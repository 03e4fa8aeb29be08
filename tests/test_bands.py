"""The Megatron band: carried only where vTrain's iterations back a job, and decided on models
left out (`docs/studies/megatron-band.md`)."""

import math

import numpy as np
import pytest
from benches import bench

from mdot_jax import TrainingJob, predict

GPT = dict(model_type="gpt2", n_embd=128, n_head=4, n_layer=4, n_positions=256,
           vocab_size=50304, activation_function="gelu")  # as bench_vtrain builds its models
MEGATRON = dict(seq_len=256, batch_size=2, device="a100-sxm-80gb", precision="amp-fp16",
                framework="megatron", attention="eager", activation_checkpointing="full",
                optimizer="adam", gpus=8, tp=2, pp=2, grad_accum=4)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("gpt") / "config.json"
    path.write_text(json.dumps(GPT))
    return str(path)


def test_a_megatron_job_like_vtrains_carries_the_band_said_of_what_measured_it(config):
    from mdot_jax.gpu.spec_sheet import load_step_model

    band = load_step_model().info["megatron_band"]  # the shipped one's
    p = predict(TrainingJob(model=config, **MEGATRON))
    lo, hi = p.interval_ms
    assert lo == pytest.approx(p.iteration_ms * math.exp(band["lo"]))
    assert hi == pytest.approx(p.iteration_ms * math.exp(band["hi"])) and lo < p.iteration_ms < hi
    assert "Megatron-DeepSpeed on A100s" in p.band_from and "vTrain" in p.band_from
    assert p.job_interval_s is None  # no job asked
    assert predict(TrainingJob(model=config, train_tokens=10**9, **MEGATRON)).job_interval_s


@pytest.mark.parametrize("change", [
    dict(attention="flash"), dict(activation_checkpointing=None), dict(framework="pytorch"),
    dict(device="h100-sxm"), dict(schedule="interleaved", virtual_stages=2),
    dict(sequence_parallel=True), dict(strategy="zero1", tp=1, pp=1), dict(optimizer="sgd"),
    dict(step="fwd-bwd")])
def test_a_job_vtrain_did_not_measure_carries_none(config, change):
    p = predict(TrainingJob(model=config, **{**MEGATRON, **change}))
    assert p.interval_ms is None


def test_a_model_of_other_operators_carries_none(tmp_path):
    import json

    path = tmp_path / "config.json"  # GPT-2's tanh GELU: operators vTrain's models lack
    path.write_text(json.dumps({**GPT, "activation_function": "gelu_new"}))
    assert predict(TrainingJob(model=str(path), **MEGATRON)).interval_ms is None


def test_the_band_is_decided_on_models_left_out_and_never_on_the_calibration_ones():
    b = bench("bench_megatron_band")
    rows = [dict(key=f"single-{i}", multi=False, hidden=h, layers=n, ms=100.0)
            for i, (h, n) in enumerate([(1024, 12), (2048, 24), (1024, 16), (2048, 16)] * 5)]
    rows += [dict(key=f"multi-{i}", multi=True, hidden=1024, layers=12, ms=100.0)
             for i in range(5)]  # a multi-node model of a calibration model's shape: kept
    predicted = {r["key"]: 100.0 * (1.5 if r["hidden"] == 2048 else 1.0) for r in rows}
    by_model = b.residuals(rows, predicted)
    assert sorted(by_model) == [(1024, 12), (1024, 16), (2048, 16)]
    assert len(by_model[(1024, 12)]) == 5  # the multi-node rows alone
    folds = b.leave_one_model_out(by_model)["folds"]
    # the odd model's own rows never make its band: the others' band misses it
    assert folds["2048x16"]["coverage"] == 0.0 and folds["1024x16"]["coverage"] == 1.0
    # each model weighs the same, whatever its rows
    lo, hi = b.weighted_quantiles([np.zeros(100), np.ones(1)], qs=(0.25, 0.75))
    assert lo == pytest.approx(0.0) and hi == pytest.approx(1.0)


# vTrain rows' configurations (not their measured times), one of each split kind and scope
VTRAIN_ROWS = [
    dict(key="single-0", gpus=2, global_batch=16, mb=8, hidden=1024, heads=16, layers=24,
         seq=1024, tp=1, dp=1, pp=2),
    dict(key="single-1", gpus=8, global_batch=32, mb=4, hidden=1024, heads=16, layers=24,
         seq=1024, tp=2, dp=2, pp=2),
    dict(key="single-6", gpus=4, global_batch=32, mb=2, hidden=2048, heads=16, layers=16,
         seq=1024, tp=1, dp=4, pp=1),
    dict(key="single-7", gpus=8, global_batch=32, mb=2, hidden=1024, heads=16, layers=16,
         seq=1024, tp=4, dp=2, pp=1),
    dict(key="multi-11", gpus=64, global_batch=512, mb=4, hidden=3072, heads=32, layers=30,
         seq=2048, tp=1, dp=32, pp=2)]


@pytest.mark.slow
def test_the_committed_vtrain_predictions_are_the_shipped_pricings():
    """The Megatron band and the README's vTrain numbers were measured on the committed
    predictions: a change of the pricing that moves them re-runs `bench_vtrain.py --framework
    megatron` and the band's script (`docs/studies/megatron-band.md`)."""
    import json
    from pathlib import Path

    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / \
        "vtrain-megatron" / "predictions.jsonl"
    kept = {d["key"]: d["predicted_ms"] for d in map(json.loads, committed.read_text().split(
        "\n")[:-1])}
    price, cache = bench("bench_vtrain").price, {}
    for r in VTRAIN_ROWS:
        assert price(r, "megatron", None, cache)["predicted_ms"] == pytest.approx(
            kept[r["key"]], rel=1e-4), r["key"]
