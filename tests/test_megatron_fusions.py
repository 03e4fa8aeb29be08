"""Megatron-LM's fused kernels where a Hugging Face export writes them out
(`mdot_jax.gpu.megatron_fusions`): a Llama's RMSNorm, rotary embedding and SwiGLU each one
kernel, its grouped keys and values read in place; a GPT graph (vTrain's kind) unchanged."""

import dataclasses

import numpy as np
import onnx
import pytest

from converters import convert, from_hf_config
from converters.attention import attention_blocks
from converters.sequence import CONFIG_FIELDS
from mdot_jax import TrainingJob, predict
from mdot_jax.gpu import catalog, megatron_fusions
from mdot_jax.gpu.spec_sheet import load_step_model, price

pytest.importorskip("transformers")

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
             max_position_embeddings=128)
OUT = CONFIG_FIELDS.index("out_numel")
GPT2 = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=500,
            n_positions=128)


@pytest.fixture(scope="module")
def llama():
    return from_hf_config(LLAMA, seq_len=64)


def test_a_llamas_written_out_kernels_are_found_and_a_gpts_are_not(llama):
    seq = convert(llama, batch_size=2, fuse=True)
    blocks = attention_blocks(seq)
    names = seq.op_names
    assert megatron_fusions.fusing(seq, blocks, "pytorch") == []  # eager runs them all
    groups = megatron_fusions.fusing(seq, blocks, "megatron")
    kinds = [sorted({str(names[i]) for i in g.members}) for g in groups]
    norms = [g for g, k in zip(groups, kinds) if "ReduceMean" in k]
    assert len(norms) == 5  # two a layer and the final one, each whole: upcast to weight
    assert all(len(g.members) == 9 and g.reductions == 1 and g.rows == 2 * 64 for g in norms)
    assert kinds.count(["Add", "Concat", "Mul", "Neg", "Split"]) == 4  # queries', keys'
    assert kinds.count(["Mul", "Silu"]) == 2  # SwiGLU
    assert len(groups) == 11
    members = [i for g in groups for i in g.members]
    assert len(members) == len(set(members))  # no operator in two kernels
    assert not {i for b in blocks for i in b.inner} & set(members)
    on_chip = megatron_fusions.in_attention(seq, blocks)  # a layer's: keys' and values'
    # copies, the queries' and keys' scale, the causal mask made of the shapes
    assert sorted(str(names[i]) for i in on_chip) == ["Expand"] * 4 + ["Mul"] * 4 + ["Where"] * 2
    assert all(seq.op_names[j] != "Mul" or not (set(seq.neighbours()[1].get(j, [])) - {
        b.scores for b in blocks}) for j in on_chip)

    # queries, keys and values (64 + 32 + 32 features); gate and up (128 + 128): one GEMM each
    merged = megatron_fusions.projections(seq)
    assert sorted(n for n in merged.values() if n) == [128, 128, 256, 256]
    assert sum(1 for n in merged.values() if not n) == 6
    assert {str(seq.node_names[i]).split("/")[-2] for i, n in merged.items() if n} == {
        "q_proj", "gate_proj"}

    gpt = convert(from_hf_config(GPT2, seq_len=64), batch_size=2, fuse=True)
    assert megatron_fusions.fusing(gpt, attention_blocks(gpt), "megatron") == []
    assert megatron_fusions.projections(gpt) == {}  # its queries, keys and values one GEMM


def test_megatron_runs_a_llama_in_fewer_kernels_keeping_what_its_gemms_read(llama,
                                                                           monkeypatch):
    seq = convert(llama, batch_size=8, fuse=True)
    model, gpu = load_step_model(), catalog.find("h100-sxm")
    blocks = attention_blocks(seq)

    def priced():
        kernels: list[float] = []
        p = price(seq, gpu, model, precision="amp-bf16", optimizer="adamw",
                  attention="flash", blocks=blocks, framework="megatron", kernels=kernels)
        return p, len(kernels)

    (fused, n), groups = priced(), megatron_fusions.fusing(seq, blocks, "megatron")
    with monkeypatch.context() as m:  # each operator its own kernel, as before
        m.setattr(megatron_fusions, "fusing", lambda *a: [])
        m.setattr(megatron_fusions, "in_attention", lambda *a: set())
        m.setattr(megatron_fusions, "projections", lambda *a: {})
        written, n_written = priced()
    saved = sum(len(g.members) for g in groups)
    assert n < n_written - saved  # a group's kernels: fewer than its operators' forwards
    gemms = [o for o in fused.operators if o["type"] == "MatMul"]  # a layer's 7 -> 4
    assert len(gemms) == 2 * 4 + 1 and len([o for o in written.operators
                                            if o["type"] == "MatMul"]) == 2 * 7 + 1
    assert fused.phases["forward"] + fused.phases["backward"] < \
        written.phases["forward"] + written.phases["backward"]
    assert fused.iteration_ms < written.iteration_ms
    assert any("framework megatron" in w and "fused kernels" in w for w in fused.warnings)
    kept, was = fused.memory_parts["activations"], written.memory_parts["activations"]
    # fewer activations kept, but each norm's output the projections read still is
    norm_outputs = sum(2 * float(seq.config[g.last, OUT]) for g in groups if g.reductions)
    assert norm_outputs > 0 and norm_outputs / 1e9 < kept < was


def test_the_front_door_prices_a_llama_under_megatron_with_its_fused_kernels(llama, tmp_path):
    path = tmp_path / "llama.onnx"
    onnx.save(llama, path)
    job = TrainingJob(model=str(path), batch_size=4, device="h100-sxm", precision="amp-bf16",
                      optimizer="adamw", framework="megatron")
    p = predict(job)
    assert any("framework megatron" in w and "fused kernels" in w for w in p.warnings)
    eager = predict(dataclasses.replace(job, framework="pytorch"))
    assert not any("framework megatron" in w for w in eager.warnings)
    assert np.isfinite(p.iteration_ms) and p.iteration_ms < eager.iteration_ms
