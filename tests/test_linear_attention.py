"""A gated delta rule exported as its chunked kernels (`converters.linear_attention`), and
hybrid models (Mamba-2's and the rule's causal convolutions) exported from the meta device."""

import numpy as np
import pytest

from converters import convert, from_torch, state_space
from converters.linear_attention import CHUNK, FUNCTION, chunked
from converters.substitutes import substituted

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _inputs(t, hk=2, h=4, dk=16, dv=24, b=2):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, t, hk, dk, generator=g), torch.randn(b, t, hk, dk, generator=g),
            torch.randn(b, t, h, dv, generator=g), -torch.rand(b, t, h, generator=g),
            torch.rand(b, t, h, generator=g))


@pytest.mark.parametrize("t", [CHUNK, 100])  # a whole chunk; a padded one
def test_the_chunked_rule_gives_what_transformers_rule_gives_in_shape(t):
    q, k, v, g, beta = _inputs(t)
    ref, ref_state = qwen3_next.torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, state = chunked(q, k, v, g=g, beta=beta, output_final_state=True,
                         use_qk_l2norm_in_kernel=True)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert state.shape == ref_state.shape
    assert chunked(q, k, v, g=g, beta=beta)[1] is None


class _Rule(torch.nn.Module):
    def forward(self, q, k, v, g, beta):
        return qwen3_next.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta)[0].sum()


def test_the_rule_exports_one_graph_whatever_the_sequence_with_its_kernels_flops():
    """The graph does not grow with the tokens (no loop over the chunks), and its matrix
    products are the chunked kernels': per (batch, head) and chunk 2 C^2 (3 dk + 2 dv) +
    6 C dk dv FLOPs."""
    rule = _Rule()
    with substituted(rule):  # no layer of a transformers module: nothing patched
        pass
    assert getattr(qwen3_next, FUNCTION) is not chunked
    rule.__module__ = qwen3_next.__name__  # as a model's layer of that module
    type(rule).__module__ = qwen3_next.__name__
    try:
        sizes, flops = [], []
        for t in (CHUNK, 4 * CHUNK):
            onnx_model = from_torch(rule, _inputs(t, b=1))
            sizes.append(len(onnx_model.graph.node))
            flops.append(convert(onnx_model, batch_size=2).flops_by_type()["MatMul"])
    finally:
        type(rule).__module__ = __name__
    assert getattr(qwen3_next, FUNCTION) is not chunked  # restored after each export
    assert sizes[0] == sizes[1]
    c, dk, dv, heads, batch = CHUNK, 16, 24, 4, 2
    per_chunk = 2 * c * c * (3 * dk + 2 * dv) + 6 * c * dk * dv
    np.testing.assert_allclose(flops, [batch * heads * n * per_chunk for n in (1, 4)],
                               rtol=1e-6)


SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=256)
QWEN3_NEXT = dict(model_type="qwen3_next", linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32, **SHAPE)


@pytest.mark.parametrize("kind, fields", [
    pytest.param("qwen3_next", {k: v for k, v in QWEN3_NEXT.items()
                                if k not in SHAPE and k != "model_type"},
                 marks=pytest.mark.slow),  # the gated delta rule converts in the fast tier
    ("bamba", dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16)),
])
def test_a_hybrid_exports_from_the_meta_device_not_a_cpu_copy(kind, fields, monkeypatch):
    """Qwen3-Next's gated delta rule and Bamba's Mamba-2 layers, each after a causal
    convolution whose meta kernel checks its channels: traced on the meta device (no CPU copy
    is allowed here), every parameter counted; the rule said so in the graph's metadata."""
    import converters.export as export
    from converters import from_hf_config

    monkeypatch.setattr(export, "CPU_FALLBACK_BYTES", 0)
    config = dict(SHAPE, **fields, model_type=kind)
    seq = convert(from_hf_config(config, seq_len=CHUNK), batch_size=2, seq_len=CHUNK)
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert seq.meta.get("linear_attention") == (FUNCTION if kind == "qwen3_next" else
                                                state_space.FUNCTION)


KIMI = dict(model_type="kimi_linear", linear_num_heads=4, linear_head_dim=16, num_experts=4,
            num_experts_per_token=2, moe_intermediate_size=32, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, pad_token_id=0,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            **dict(SHAPE, num_key_value_heads=4))


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 3 minutes
def test_kimi_delta_attention_exports_as_chunked_kernels_whatever_the_sequence():
    """Kimi Linear's attention (a delta rule decaying each key channel) exported as
    transformers' reference loop over its chunks: 4,539 operators for a four-layer 6B model at
    256 tokens, 88% of its step waiting on the host; it exports as the chunked kernels' work,
    the graph the same at any length, every parameter counted, said in the prediction."""
    from converters import from_hf_config
    from converters.linear_attention import PER_CHANNEL
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seqs = [convert(from_hf_config(KIMI, seq_len=t), batch_size=2, seq_len=t, fuse=True)
            for t in (CHUNK, 4 * CHUNK)]
    assert seqs[0].num_ops == seqs[1].num_ops
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**KIMI))
    assert seqs[1].params == sum(p.numel() for p in model.parameters())
    assert seqs[1].meta.get("linear_attention") == PER_CHANNEL
    p = predict(TrainingJob(model=seqs[1], batch_size=2, device="h100-sxm"))
    assert any("Kimi delta attention" in w and "chunked KDA" in w for w in p.warnings)


@pytest.mark.slow  # a hybrid exported and priced six ways
def test_a_gated_delta_rule_is_said_in_the_prediction():
    from converters import from_hf_config
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seq = convert(from_hf_config(QWEN3_NEXT, seq_len=CHUNK), batch_size=2, seq_len=CHUNK, fuse=True)
    p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16"))
    assert any("gated delta rule" in w and "chunked kernels" in w for w in p.warnings)


def test_a_hybrid_is_split_and_checkpointed_by_all_of_its_layers():
    """Qwen3-Next's four layers hold one softmax attention block (the fourth's): FSDP's units
    are the four layers and the root, a pipeline takes four stages, full checkpointing keeps
    one layer's activations of four; each, with that one block alone, said one layer."""
    from converters import from_hf_config
    from converters.attention import attention_blocks, layer_starts
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seq = convert(from_hf_config(QWEN3_NEXT, seq_len=CHUNK), batch_size=2, seq_len=CHUNK, fuse=True)
    blocks = attention_blocks(seq)
    starts = layer_starts(seq, blocks)
    assert len(blocks) == 1 and len(starts) == 4 and starts == sorted(starts)
    assert blocks[0].scores > starts[3]  # the fourth layer's attention, inside it

    def notes(**job):
        return predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm",
                                   precision="amp-bf16", **job)).warnings

    assert any("in 5 units" in w for w in notes(gpus=8, strategy="fsdp"))
    assert any(w.startswith("4 pipeline stages") and "1 layers on the slowest stage" in w
               for w in notes(gpus=4, pp=4, grad_accum=4))
    assert any("checkpointing over 4 layers" in w
               for w in notes(activation_checkpointing="full"))


def test_convert_says_a_file_holds_a_chunked_gated_delta_rule(tmp_path, capsys):
    import json

    import onnx

    from converters import from_hf_config
    from mdot_jax.cli import main

    onnx.save(from_hf_config(QWEN3_NEXT, seq_len=CHUNK), tmp_path / "qwen3_next.onnx")
    path = str(tmp_path / "qwen3_next.onnx")
    assert main(["convert", path, "--batch-size", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["linear_attention"] == FUNCTION
    assert main(["convert", path, "--batch-size", "2"]) == 0
    assert "gated delta rule: exported as flash-linear-attention's chunked kernels" in \
        capsys.readouterr().out
