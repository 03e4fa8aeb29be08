"""What would fit (`serving.fits.suggest`): a step that does not fit its GPUs' memory priced
again with each memory lever moved, the smallest move that fits said; the fewest levers
together where none fits alone; moves a job cannot take passed over."""

import dataclasses
import json

import onnx
import pytest
from onnx_builders import attention

from mdot_jax import RequestError, TrainingJob
from mdot_jax.cli import main
from mdot_jax.serving import fits, front
from mdot_jax.serving.prediction import SPEC_SHEET, Prediction


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("fits") / "attn.onnx"
    onnx.save(attention(seq=64, dim=256), path)
    return str(path)


def _fake(limit=80.0, refuse=()):
    """A predictor whose memory is 10 GB of state a GPU (8-bit state: 5; offloaded Adam 2, and
    its parameters 0.5; sharded: / replicas)
    plus 1 GB a sample (checkpointed: selective 0.6, full 0.25; bf16 halves both); each job
    priced recorded; a field in `refuse` refused."""
    asked = []

    def predict(job):
        asked.append(job)
        for name in refuse:
            if getattr(job, name) != getattr(BASE, name):
                raise RequestError(f"{name}: refused", name)
        state = 5.0 if job.optimizer == "adamw-8bit" else 10.0
        state = {None: state, "optimizer": 2.0, "params": 0.5}[job.offload]  # on the host
        state /= job.gpus if job.strategy in ("zero1", "zero2", "fsdp") else 1
        kept = {None: 1.0, "selective": 0.6, "full": 0.25}[job.activation_checkpointing]
        gb = (state + kept * job.batch_size) * (0.5 if job.precision == "bf16" else 1.0)
        return Prediction(iteration_ms=100.0 * job.grad_accum, device="gpu", num_ops=1,
                          memory_gb=gb, memory_limit_gb=limit, source=f"{SPEC_SHEET} by x",
                          batch_size=job.batch_size, gpus=job.gpus, grad_accum=job.grad_accum)

    return predict, asked


BASE = TrainingJob(model="gpt2", batch_size=96, seq_len=128, device="h100-sxm",
                   precision="amp-bf16", optimizer="adamw", gpus=1)


def test_each_lever_says_its_smallest_move_that_fits():
    predict, asked = _fake()
    p = predict(BASE)  # 106 GB
    got = fits.suggest(BASE, p, predict)
    changes = [f["change"] for f in got.fits_with]
    assert changes == [dict(activation_checkpointing="selective"),  # 67.6
                       dict(batch_size=48, grad_accum=2),  # 58: a divisor of 96, the largest
                       dict(precision="bf16")]  # 53; 8-bit state: 101, no; one GPU: no sharding
    assert all(f["memory_gb"] <= 80 for f in got.fits_with)
    assert got.fits_with[1]["iteration_ms"] == pytest.approx(200.0)  # two micro-batches
    assert len(asked) < 12  # bisected, not every divisor of 96 priced
    assert p.fits_with is None  # the prediction given is not changed


def test_a_tight_move_is_followed_by_the_smallest_with_room():
    """A suggestion within a tenth of the memory may not fit (estimates miss by a fifth): the
    lever's smallest move that leaves room is said after it."""
    predict, _ = _fake(limit=60.0)
    got = fits.suggest(BASE, predict(BASE), predict)  # 106 GB
    assert [(f["change"], f["tight"]) for f in got.fits_with] == [
        (dict(activation_checkpointing="full"), False),  # 34 (selective 67.6: no)
        (dict(batch_size=48, grad_accum=2), True),  # 58 of 60
        (dict(batch_size=32, grad_accum=3), False),  # 42
        (dict(precision="bf16"), False)]  # 53


def test_where_none_fits_alone_the_fewest_together():
    predict, _ = _fake(limit=20.0)
    job = dataclasses.replace(BASE, gpus=8)
    got = fits.suggest(job, predict(job), predict)
    # alone: full checkpointing 34, micro-batches of 8 (18: the largest divisor that fits)
    assert [f["change"] for f in got.fits_with] == [dict(batch_size=8, grad_accum=12)]
    predict, _ = _fake(limit=9.0)
    got = fits.suggest(job, predict(job), predict)  # nothing alone; together, then pruned
    # checkpointing (34), + micro-batches of 1 (10.25), + fsdp (1.5) fit; checkpointing is
    # dropped (2.25), the micro-batch is not (fsdp alone 97.25)
    assert [f["change"] for f in got.fits_with] == [
        dict(batch_size=1, grad_accum=96, strategy="fsdp")]
    predict, _ = _fake(limit=0.1)
    assert fits.suggest(job, predict(job), predict).fits_with == []  # nothing fits at all
    # one GPU, 3 GB: checkpointing, micro-batches of 1, 8-bit state (5.25) taken; offloading
    # Adam is ruled out by 8-bit state (TrainingJob refuses both), passed over; bf16 fits
    # (2.625); checkpointing dropped (3.0 fits), the rest needed
    predict, _ = _fake(limit=3.0)
    got = fits.suggest(BASE, predict(BASE), predict)
    assert [f["change"] for f in got.fits_with] == [
        dict(batch_size=1, grad_accum=96, optimizer="adamw-8bit", precision="bf16")]


def test_moves_a_job_cannot_take_are_passed_over_and_fitting_steps_left_alone():
    predict, _ = _fake(refuse=("precision", "activation_checkpointing"))
    got = fits.suggest(BASE, predict(BASE), predict)
    # offloading does not fit either (96.5 GB at most): the micro-batch alone
    assert [f["change"] for f in got.fits_with] == [dict(batch_size=48, grad_accum=2)]
    predict, asked = _fake(limit=500.0)
    p = predict(BASE)
    assert fits.suggest(BASE, p, predict) is p and len(asked) == 1
    checkpointed = dataclasses.replace(_fake()[0](BASE), source="timm-rtx3090")
    assert fits.suggest(BASE, checkpointed, predict) is checkpointed  # a checkpoint's: none


def test_a_real_step_that_does_not_fit_gets_a_micro_batch_that_does(model, capsys):
    job = TrainingJob(model=model, batch_size=1 << 17, precision="amp-bf16", device="l4",
                      optimizer="adamw", gpus=2)
    p = front.predict(job)
    assert not p.fits and p.memory_limit_gb == 24
    got = fits.suggest(job, p)
    first = got.fits_with[0]
    assert first["change"] == dict(batch_size=1 << 16, grad_accum=2)
    again = front.predict(dataclasses.replace(job, **first["change"]))
    assert again.fits and again.memory_gb == pytest.approx(first["memory_gb"])
    assert json.loads(json.dumps(got.to_json()))["fits_with"][0]["change"]["grad_accum"] == 2
    assert main(["predict", model, "--device", "l4", "--batch-size", str(1 << 17), "--gpus", "2",
                 "--precision", "amp-bf16", "--optimizer", "adamw"]) == 0
    out = capsys.readouterr().out
    assert "fits the nvidia-l4's 24 GB with one change" in out
    assert "--batch-size 65536 --grad-accum 2" in out
    assert "* more than the nvidia-l4's 24 GB: may not fit\n" in out  # its row marked
    assert main(["predict", model, "--device", "l4", "--batch-sizes", f"{1 << 16},{1 << 17}",
                 "--gpus", "2", "--precision", "amp-bf16", "--optimizer", "adamw"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:4]
    assert not rows[0].split()[5].endswith("*") and rows[1].split()[5].endswith("*")  # memory


@pytest.mark.parametrize("device, precision, moves", [
    ("nvidia-h100-sxm", "fp32", ["amp-bf16", "bf16"]),
    ("nvidia-v100-sxm2-32gb", "tf32", ["amp-fp16"]),  # no bf16 on a V100
    ("nvidia-h100-sxm", "amp-fp16", ["bf16"]),
    ("nvidia-v100-sxm2-32gb", "amp-fp16", []),
    ("nvidia-h100-sxm", "fp8", []),
])
def test_precision_moves_to_the_gpus_half_type_then_pure_bf16(device, precision, moves):
    p = Prediction(iteration_ms=1.0, device=device, num_ops=1)
    job = dataclasses.replace(BASE, precision=precision)
    assert [m["precision"] for m in fits.LEVERS["precision"].moves(job, p)] == moves


def test_a_step_within_a_tenth_of_the_memory_is_said_to_be_tight(model, capsys):
    """Estimates of measured peaks err by up to a fifth: a plan's first row at 179 of a
    B200's 180 GB was shown as plainly as one at half of it."""
    from mdot_jax.cli_show import table
    from mdot_jax.serving.memory import check_fit

    p = front.predict(TrainingJob(model=model, batch_size=8, device="l4"))
    assert p.fits and not p.tight and not any("tight" in w for w in p.warnings)
    near = dataclasses.replace(p, memory_gb=0.95 * 24, warnings=[])
    check_fit(near, 24, "the nvidia-l4's memory")
    assert near.fits and near.tight and near.to_json()["memory_tight"] is True
    assert any("95% of the nvidia-l4's memory (24 GB): tight" in w for w in near.warnings)
    over = dataclasses.replace(p, memory_gb=25.0, warnings=[])
    check_fit(over, 24, "the nvidia-l4's memory")
    assert not over.tight and not any("tight" in w for w in over.warnings)  # said as over
    table("m", [p, near, over], by_batch=True, by_gpus=False, top=None)
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[4][-1] for r in rows[2:5]] == [rows[2].split()[4][-1], "!", "*"]
    assert any(r.startswith("! within 10% of the nvidia-l4's 24 GB") for r in rows)
    from mdot_jax.cli_show import fits_with  # a suggested change that is tight: marked too

    fits_with(dataclasses.replace(over, fits_with=[dict(
        change=dict(batch_size=4), memory_gb=23.0, iteration_ms=1.0, tight=True)]))
    said = capsys.readouterr().out
    assert "23! GB" in said and "! within 10% of the nvidia-l4's 24 GB" in said
