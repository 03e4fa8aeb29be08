"""Metamorphic: whatever the job, a change whose direction physics fixes moves a GPU's
prediction that way (more work never takes less time, sharding never holds more, a GPU with
the same compute and more bandwidth never takes longer)."""

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mdot_jax import MdotError, TrainingJob, predict

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
EPS = 1e-6  # relative: float sums in another order

JOBS = st.builds(
    TrainingJob, model=st.just("gpt2"), seq_len=st.sampled_from([32, 64]),
    batch_size=st.sampled_from([1, 2, 4]), device=st.sampled_from(["h100-sxm", "l4"]),
    precision=st.sampled_from(["fp32", "amp-bf16", "bf16"]),
    optimizer=st.sampled_from(["sgd", "adamw", "muon"]), grad_accum=st.sampled_from([1, 2, 8]),
    fused_optimizer=st.booleans(), attention=st.sampled_from([None, "eager"]))


def _priced(job: TrainingJob, **change):
    try:
        return predict(dataclasses.replace(job, **change))
    except MdotError:  # a combination the request refuses (muon with ZeRO): another example
        assume(False)


@pytest.mark.slow
@SETTINGS
@given(job=JOBS)
def test_more_work_on_one_gpu_never_takes_less_time(job):
    base = _priced(job)
    for change in (dict(batch_size=2 * job.batch_size), dict(grad_accum=2 * job.grad_accum),
                   dict(seq_len=2 * job.seq_len), dict(activation_checkpointing="full")):
        more = _priced(job, **change)
        assert more.iteration_ms >= base.iteration_ms * (1 - EPS), change
    assert _priced(job, grad_accum=2 * job.grad_accum).memory_gb == pytest.approx(
        base.memory_gb)  # one micro-batch's activations at a time
    assert _priced(job, activation_checkpointing="full").memory_gb <= base.memory_gb * (1 + EPS)
    if job.device == "h100-sxm":  # the H200: the same SMs and clocks, more memory bandwidth
        assert _priced(job, device="h200-sxm").iteration_ms <= base.iteration_ms * (1 + EPS)


@pytest.mark.slow
@SETTINGS
@given(job=JOBS.map(lambda j: dataclasses.replace(j, device="l4", seq_len=32)),
       strategy=st.sampled_from(["ddp", "zero1", "fsdp"]), nodes=st.sampled_from([1, 4]))
def test_more_work_on_many_gpus_never_takes_less_time(job, strategy, nodes):
    """The communication a pass hides is the pass's time on the GPU's timeline: where the
    host sets the pace, a larger batch lengthens the kernels, not the backward (a larger batch
    was priced faster when its kernels' share stretched the window)."""
    base = _priced(job, gpus=8, nodes=nodes, strategy=strategy)
    for change in (dict(batch_size=2 * job.batch_size), dict(seq_len=2 * job.seq_len)):
        more = _priced(job, gpus=8, nodes=nodes, strategy=strategy, **change)
        assert more.iteration_ms >= base.iteration_ms * (1 - EPS), change


@pytest.mark.slow
@SETTINGS
@given(job=JOBS, gpus=st.sampled_from([2, 8]), nodes=st.sampled_from([1, 2]),
       lora=st.sampled_from([None, 4]))
def test_each_zero_stage_holds_no_more_than_the_one_before(job, gpus, nodes, lora):
    held = [_priced(job, gpus=gpus, nodes=nodes, strategy=s, lora_rank=lora, seq_len=32,
                    batch_size=1).memory_gb for s in ("ddp", "zero1", "zero2", "fsdp")]
    assert all(b <= a * (1 + EPS) for a, b in zip(held, held[1:])), held
