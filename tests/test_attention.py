"""Attention blocks in an operator sequence (`converters.attention`), and the spec sheet saying
that PyTorch fuses them where it does."""

import pytest
from onnx_builders import attention, conv_bn_relu

from converters import convert, from_torch
from converters.attention import attention_blocks
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.spec_sheet import load_step_model, price

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("build", [
    lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=500)),
    lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=172, num_hidden_layers=3, num_attention_heads=4,
        vocab_size=500)),
    lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=500)),
])
def test_one_block_per_layer_of_a_transformer(build):
    with torch.device("meta"):
        model = build()
    seq = convert(from_torch(model, torch.zeros(1, 16, dtype=torch.long)), batch_size=2,
                  fuse=True)
    blocks = attention_blocks(seq)
    names = seq.op_names
    assert len(blocks) == 3
    for b in blocks:
        assert (names[b.scores], names[b.softmax], names[b.output]) == (
            "MatMul", "Softmax", "MatMul") and b.scores < b.softmax < b.output


def test_a_cnn_has_none():
    assert attention_blocks(convert(conv_bn_relu(training=True), batch_size=2)) == []


@pytest.mark.parametrize("gpu,precision,said", [("h100-sxm", "amp-bf16", True),
                                                ("a100-sxm-80gb", "amp-fp16", True),
                                                ("h100-sxm", "fp32", False),
                                                ("v100-sxm2-32gb", "amp-fp16", False)])
def test_the_spec_sheet_says_where_pytorch_fuses_attention(gpu, precision, said):
    seq = convert(attention(seq=64, dim=64), batch_size=8, fuse=True)
    p = price(seq, gpus.find(gpu), load_step_model(), precision=precision)
    assert any("FlashAttention" in w for w in p.warnings) == said
