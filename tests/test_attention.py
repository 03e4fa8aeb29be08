"""Attention blocks in an operator sequence (`converters.attention`)."""

import pytest
from onnx_builders import conv_bn_relu

from converters import convert, from_torch
from converters.attention import attention_blocks

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
