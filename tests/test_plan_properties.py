"""Property-based, over the LLM training plans a user can ask for (slow tier): every job is
a prediction that obeys physics, or one error naming a field. Physics here: the phases sum to
the step, scaling and MFU in (0, 1], a token rate that is the global batch's tokens over the
step, memory that is finite; checkpointing never makes a step faster nor its memory larger;
more micro-batches an update, or more replicas, never fewer tokens a second; FSDP over more
replicas never holds more a GPU."""

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdot_jax import RequestError, TrainingJob, predict
from mdot_jax.options import SCHEDULES, STRATEGIES

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

LAYERS, HEADS, TOKENS, BATCH = 4, 8, 128, 2
CONFIG = dict(model_type="llama", hidden_size=256, intermediate_size=688,
              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=4,
              vocab_size=1024, max_position_embeddings=TOKENS)
EXPERTS = dict(CONFIG, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
RUNS = {"h100-sxm": ("amp-bf16", "amp-fp16", "fp32", "fp8"), "l4": ("amp-bf16", "fp8"),
        "a100-sxm-80gb": ("amp-bf16", "fp32"), "v100-sxm2-32gb": ("amp-fp16", "fp32")}


@st.composite
def jobs(draw) -> dict:
    """A plan that divides its GPUs, at a precision its GPU runs: mostly priced, not refused."""
    tp, pp, cp, dp = (draw(st.sampled_from(v)) for v in ([1, 2, 4], [1, 2, 4], [1, 1, 2],
                                                         [1, 2, 4]))
    total = tp * pp * cp * dp
    nodes = draw(st.sampled_from([n for n in (1, 2, 4, 8, 16) if total % n == 0
                                  and total // n <= 8]))
    device = draw(st.sampled_from(sorted(RUNS)))
    precision = draw(st.sampled_from(RUNS[device]))
    moe = draw(st.booleans())
    return dict(
        moe=moe, ep=draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0])) if moe else 1,
        device=device, precision=precision, tp=tp, pp=pp, cp=cp, gpus=total // nodes,
        nodes=nodes, strategy=draw(st.sampled_from(STRATEGIES if dp > 1 else ["ddp"])),
        optimizer=draw(st.sampled_from(["sgd", "adamw"])),
        grad_accum=draw(st.sampled_from([1, 2, 8])),
        schedule=draw(st.sampled_from([None, *SCHEDULES])) if pp > 1 else None,
        sequence_parallel=tp > 1 and draw(st.booleans()),
        activation_checkpointing=draw(st.sampled_from([None, "full", "selective"])),
        attention=draw(st.sampled_from([None, "flash", "eager"])),
        framework=draw(st.sampled_from(["pytorch", "megatron"]))
        if precision.startswith("amp") else "pytorch",
        fused_optimizer=draw(st.booleans()))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A decoder and a mixture of experts as config.json files (context parallelism converts
    them at its own lengths)."""
    paths = {}
    for moe, config in ((False, CONFIG), (True, EXPERTS)):
        paths[moe] = tmp_path_factory.mktemp("model") / "config.json"
        paths[moe].write_text(json.dumps(config))
    return {k: str(v) for k, v in paths.items()}


def _predict(fields: dict):
    """The prediction of the job of `fields`, or None where it is refused in one line naming
    a field."""
    try:
        return predict(TrainingJob(**fields))
    except (RequestError, ValueError) as e:
        assert str(e) and "\n" not in str(e), repr(e)
        field = getattr(e, "field", None)
        assert field is None or field in {f.name for f in dataclasses.fields(TrainingJob)}, e
        return None


@SETTINGS
@given(jobs())
def test_any_plan_obeys_physics_or_is_one_named_error(models, fields):
    fields = dict(fields)
    job = dict(fields, model=models[fields.pop("moe")], batch_size=BATCH, seq_len=TOKENS)
    p = _predict(job)
    if p is None:
        return
    assert math.isfinite(p.iteration_ms) and p.iteration_ms > 0
    assert p.iteration_ms == pytest.approx(sum(p.phases.values()))
    assert 0 < p.scaling_efficiency <= 1 + 1e-9 and 0 < p.mfu <= 1
    assert p.gpus == fields["gpus"] * fields["nodes"] and p.cp == fields["cp"]
    assert p.tokens_per_s == pytest.approx(
        p.batch_size * p.grad_accum * p.replicas * TOKENS / (p.iteration_ms / 1e3))
    assert math.isfinite(p.memory_gb) and p.memory_gb > 0
    if not fields["activation_checkpointing"]:  # recomputing costs time and saves memory
        for kind in ("full", "selective"):
            q = _predict(dict(job, activation_checkpointing=kind))
            assert q is not None
            assert q.iteration_ms >= p.iteration_ms * (1 - 1e-9), kind
            assert q.memory_gb <= p.memory_gb * (1 + 1e-9), kind
    more = _predict(dict(job, grad_accum=2 * fields["grad_accum"]))  # the update, the
    assert more is not None and more.tokens_per_s >= p.tokens_per_s * (1 - 1e-9)  # bubble
    # and data-parallel reductions spread over more tokens
    wider = _predict(dict(job, nodes=2 * fields["nodes"]))  # twice the replicas
    assert wider is not None and wider.tokens_per_s >= p.tokens_per_s * (1 - 1e-9)
    if fields["strategy"] == "fsdp":  # sharded over twice the GPUs
        assert wider.memory_gb <= p.memory_gb * (1 + 1e-9)
