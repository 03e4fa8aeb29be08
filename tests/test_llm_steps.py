"""The kit's LLM steps (`mdot_jax.measure.llm_steps`): every planned step is a job the front
door can price (so each measured row has its prediction), and a step runs on this CPU."""

import json

import pytest

from mdot_jax import TrainingJob
from mdot_jax.measure import llm_steps


@pytest.mark.parametrize("dry", [False, True])
def test_every_planned_step_is_a_valid_job(tmp_path, dry):
    rows = llm_steps.plan(dry)
    assert len({r["key"] for r in rows}) == len(rows) == (4 if dry else 24)
    (tmp_path / "config.json").write_text(json.dumps(rows[0]["config"]))
    for r in rows:
        TrainingJob(model=str(tmp_path / "config.json"), device="h100-sxm", **r["job"])
    if not dry:  # 8,192 tokens a micro-batch; flash and eager, with and without checkpointing
        assert {r["job"]["batch_size"] * r["job"]["seq_len"] for r in rows} == {8192}
        assert {(r["job"]["attention"], r["job"]["activation_checkpointing"])
                for r in rows} == {("flash", None), ("flash", "full"), ("eager", None),
                                   ("eager", "full")}


def test_a_step_is_measured_and_a_second_run_resumes(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "llm.jsonl"
    assert llm_steps.main([str(out), "--dry-run", "--seconds", "0"]) == 0  # one, then time
    first = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(first) == 1 and first[0]["ms"] > 0 and len(first[0]["ms_all"]) == 5
    assert llm_steps.main([str(out), "--dry-run", "--seconds", "0"]) == 0
    second = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(second) == 2 and second[0] == first[0]  # resumed: nothing measured twice
