"""Models built on the meta device export with every layer's weights (issue: GPT-2 125M
counted 47M parameters when the exporter merged equal-shaped weights)."""

import dataclasses
import json
import re

import numpy as np
import onnx
import pytest

from converters import ConversionError, convert, from_torch
from converters.loader import load_model
from converters.sequence import LOAD_FIELDS, PARAMS_KEY, to_sequence

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=500, n_positions=64)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=172, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=500, max_position_embeddings=64)),
    "mpt": lambda: transformers.MptForCausalLM(transformers.MptConfig(  # ALiBi slopes
        d_model=64, n_heads=4, n_layers=2, vocab_size=500, max_seq_len=64)),
}


def _sequence(proto, batch=2):
    return to_sequence(load_model(proto, batch_size=batch), "m", fuse=True)


def _build(name, device):
    torch.manual_seed(0)
    with torch.device(device):
        return SMALL[name]()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_meta_model_exports_what_its_real_twin_does(name, capfd):
    meta = _build(name, "meta")
    seq = _sequence(from_torch(meta, torch.zeros(1, 16, dtype=torch.long)))
    real = _sequence(from_torch(_build(name, "cpu"), torch.zeros(1, 16, dtype=torch.long)))
    assert seq.meta["params"] == sum(p.numel() for p in meta.parameters())
    assert seq.meta["params"] == real.meta["params"]
    np.testing.assert_array_equal(seq.op_type, real.op_type)
    np.testing.assert_allclose(seq.load, real.load)
    assert all(p.is_meta for p in meta.parameters())  # nothing was allocated or swapped
    out, err = capfd.readouterr()
    assert "graph(" not in out + err  # the exporter's Torch IR never reaches the terminal


@pytest.mark.parametrize("name", ["llama", "mpt"])  # mpt: its ALiBi goes to the CPU copy
def test_a_model_exported_inside_the_meta_block_that_built_it_exports_as_outside(name):
    """`from_torch` called inside `with torch.device("meta")` failed ("Tensor on device cpu is
    not on the expected device meta")."""
    outside = _sequence(from_torch(_build(name, "meta"), torch.zeros(1, 16, dtype=torch.long)))
    with torch.device("meta"):
        model = SMALL[name]()
        inside = _sequence(from_torch(model, torch.zeros(1, 16, dtype=torch.long)))
        assert torch.empty(1).is_meta  # the user's block is still in force
    assert inside.meta["params"] == outside.meta["params"] > 0
    np.testing.assert_array_equal(inside.op_type, outside.op_type)


def test_an_export_with_merged_weights_is_refused_naming_the_parameter():
    from converters import symbolics
    from converters.export import FALLBACK_OPSET, OPSET

    meta = _build("gpt2", "meta")
    meta.config.use_cache = False
    symbolics.register(torch, OPSET, FALLBACK_OPSET)  # as from_torch has (GPT-2's masks: diff)
    import io
    buf = io.BytesIO()  # torch's own exporter, as a user would call it: weights merged
    torch.onnx.export(meta, (torch.zeros(1, 16, dtype=torch.long, device="meta"),), buf,
                      dynamo=False, export_params=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["ids"], dynamic_axes={"ids": {0: "batch"}})
    proto = onnx.load_from_string(buf.getvalue())
    proto.metadata_props.add(key=PARAMS_KEY,
                             value=",".join(n for n, _ in meta.named_parameters()))
    with pytest.raises(ConversionError, match=r"parameter 'transformer\..*' is an alias "
                       r"of .*from_torch"):
        _sequence(proto)


def test_a_model_that_does_not_trace_on_meta_traces_on_a_cpu_copy_or_says_what_to_do(
        monkeypatch):
    class ReadsAValue(torch.nn.Module):  # `.item()` does not trace on the meta device
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.register_buffer("index", torch.arange(4))  # a table's indices: in range

        def forward(self, x):
            y = self.conv(x).flatten(1)[:, self.index]
            return y[: int(x.sum().item()) + 1]

    with torch.device("meta"):
        net = ReadsAValue()
    on_cpu = from_torch(ReadsAValue(), torch.zeros(2, 3, 8, 8))
    on_meta = from_torch(net, torch.zeros(2, 3, 8, 8))
    assert [n.op_type for n in on_meta.graph.node] == [n.op_type for n in on_cpu.graph.node]
    assert next(net.parameters()).is_meta  # the user's module is left where it was
    monkeypatch.setattr("converters.export.CPU_FALLBACK_BYTES", 0)  # too large for the CPU
    with pytest.raises(ConversionError, match="meta device.*smaller config .* on the CPU"):
        from_torch(net, torch.zeros(2, 3, 8, 8))


class _CausalConv(torch.nn.Module):  # Mamba-2's: depthwise, padded, cut to the sequence
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 4, groups=8, padding=3)

    def forward(self, x):
        return torch.nn.functional.conv1d(x, self.conv.weight, self.conv.bias, padding=3,
                                          groups=x.shape[1])[..., :x.shape[-1]].sum()


@pytest.mark.parametrize("build, x", [
    (lambda: pytest.importorskip("torchvision").models.mobilenet_v3_small(), (1, 3, 64, 64)),
    (_CausalConv, (1, 8, 64)),
])
def test_convolutions_trace_on_the_meta_device_as_on_a_cpu(build, x, monkeypatch):
    """PyTorch's meta kernel of a convolution traced as its shape arithmetic (no Conv, its
    weight uncounted) or failed on sizes the tracer holds as tensors: each is one Conv, as on
    a CPU, with no CPU copy made."""
    monkeypatch.setattr("converters.export.CPU_FALLBACK_BYTES", 0)
    with torch.device("meta"):
        model = build()
    on_meta = from_torch(model, torch.zeros(x))
    on_cpu = from_torch(build(), torch.zeros(x))
    assert [n.op_type for n in on_meta.graph.node] == [n.op_type for n in on_cpu.graph.node]
    meta, cpu = (to_sequence(load_model(m, batch_size=2)) for m in (on_meta, on_cpu))
    assert meta.params == cpu.params > 0 and meta.flops == cpu.flops


def test_a_small_model_that_cannot_be_copied_to_the_cpu_is_not_said_to_be_large():
    """Under a mode that keeps tensors on the meta device (a vision-language model's export),
    a model that reads a value has no CPU copy to trace: it was said to hold more than 4 GB."""
    from converters import ConversionError
    from converters.meta_joins import meta_joins

    class Reads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.linear(x)
            return y * float(y.sum().item() > 0)

    with torch.device("meta"):
        model = Reads()
    with pytest.raises(ConversionError, match=r"\.item\(\).*no CPU copy of it can be made") as e, \
            meta_joins():
        from_torch(model, torch.zeros(2, 4))
    assert "4 GB" not in str(e.value)


def test_weights_tied_on_meta_stay_tied_on_the_cpu_copy():
    """`to_empty` gives every module its own tensor: a tied head counted its vocabulary twice
    (XLM's and LFM's configs, which trace on the CPU copy)."""
    class TiedAndConvolves(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 8)
            self.conv = torch.nn.Conv1d(8, 8, 3, padding=1)  # no trace on the meta device
            self.head = torch.nn.Linear(8, 64, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.conv(self.embed(ids).transpose(1, 2)).transpose(1, 2)).sum()

    with torch.device("meta"):
        net = TiedAndConvolves()
    seq = _sequence(from_torch(net, torch.zeros(2, 16, dtype=torch.long)))
    assert seq.meta["params"] == 64 * 8 + 8 * 8 * 3 + 8

# the sizes of the issue (seconds each): parameters within 1% of the real models'
@pytest.mark.slow  # the fast tier counts small configs' parameters
@pytest.mark.parametrize("n_embd,n_layer,n_head", [(768, 12, 12), (2048, 24, 16), (4096, 32, 32)])
def test_gpt2_sizes_on_meta_count_their_parameters(n_embd, n_layer, n_head):
    cfg = transformers.GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
    seq = to_sequence(load_model(from_torch(model, torch.zeros(1, 128, dtype=torch.long)),
                                 batch_size=1), "gpt2")
    true = sum(p.numel() for p in model.parameters())
    assert abs(seq.meta["params"] / true - 1) < 0.01


def test_a_config_json_that_is_not_one_is_refused_naming_it(tmp_path):
    from converters import from_hf_config

    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConversionError, match="bad.json: no 'model_type'"):
        from_hf_config(tmp_path / "bad.json")
    # a field the config class will not take: its own words, no traceback
    with pytest.raises(ConversionError, match="'falcon' builds no model here: .*head_dim"):
        from_hf_config({"model_type": "falcon", "head_dim": 16})
    # a config its class's validator refuses: the reason, not the validator's wrapper
    with pytest.raises(ConversionError, match="'llama' builds no model here: The hidden "
                                              "size .64. is not a multiple .* heads .3."):
        from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 3})
    # heads that cannot be built: the fields as the file names them, before any export
    with pytest.raises(ConversionError, match=r"num_attention_heads \(8\) is not a multiple of "
                                              r"num_key_value_heads \(3\)"):
        from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8,
                        "num_key_value_heads": 3})
    # a model's own code (Kimi K2's `kimi_k2`) whose class transformers has: what to set
    with pytest.raises(ConversionError, match="Unrecognized model identifier: kimi_k2; its "
                                              "architectures name DeepseekV3ForCausalLM, "
                                              "transformers' own for model_type 'deepseek_v3'"):
        from_hf_config({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]})
    for kind in ([1, 2], 1e-30, ""):  # an unhashable list raised from deep in transformers
        with pytest.raises(ConversionError, match=r"config: model_type .*: expected a name"):
            from_hf_config({"model_type": kind})
    for archs in (1, "GPT2LMHeadModel", [1]):  # read as a list of class names before this
        with pytest.raises(ConversionError, match=r"config: architectures .*: expected a list"):
            from_hf_config({"model_type": "gpt2", "architectures": archs})
    with pytest.raises(ConversionError, match="Unrecognized model identifier: mine$"):
        from_hf_config({"model_type": "mine", "architectures": ["MineForCausalLM"]})
    with pytest.raises(ConversionError, match="config: n_head is 0"):
        from_hf_config({"model_type": "gpt2", "n_head": 0})
    # a typo's depth (32,000 for 32) is refused before its layers are built, not hours later
    with pytest.raises(ConversionError, match=r"config: n_layer is 32,000, over 2,048 layers"):
        from_hf_config({"model_type": "gpt2", "n_layer": 32000})
    with pytest.raises(ConversionError, match=r"config: decoder_layers is 9,999, over 2,048"):
        from_hf_config({"model_type": "bart", "decoder_layers": 9999})
    # none of a stack, a width or a vocabulary: an export of nothing, or torch's words
    for fields, needle in ((dict(n_layer=0), "n_layer is 0"),
                           (dict(n_layer=-1), "n_layer is -1"), (dict(n_embd=0), "n_embd is 0"),
                           (dict(vocab_size=0), "vocab_size is 0")):
        with pytest.raises(ConversionError, match=f"config: {needle}; a model has at least one"):
            from_hf_config({"model_type": "gpt2", "n_head": 1, **fields})
    with pytest.raises(ConversionError, match="config: intermediate_size is 0; a model has"):
        from_hf_config({"model_type": "llama", "intermediate_size": 0})
    # a name transformers looks up and has not (its KeyError said the name alone): the field
    for fields, needle in ((dict(hidden_act="sigmoidish"), "hidden_act 'sigmoidish'"),
                           (dict(rope_scaling=dict(rope_type="nope", factor=2.0)),
                            "rope_scaling.rope_type 'nope'")):
        with pytest.raises(ConversionError, match=f"here: {needle} is none of the names"):
            from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                            "num_hidden_layers": 1, "intermediate_size": 128, **fields},
                           seq_len=8)
    # Python's own words from transformers' code: the odd value named beside them
    small = dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                 intermediate_size=128)
    for fields, needle in ((dict(head_dim=0), r"a value to check: head_dim 0 \(its default"),
                           (dict(rope_theta="16"), r"a value to check: rope_theta \"16\"")):
        with pytest.raises(ConversionError, match=needle):
            from_hf_config({**small, **fields}, seq_len=8)
    for seq_len in (-1, 64.0, True):  # torch's reshape error, a TypeError, a one-token model
        with pytest.raises(ConversionError, match=f"seq_len {seq_len!r}: expected a positive"):
            from_hf_config({"model_type": "gpt2"}, seq_len=seq_len)
    with pytest.raises(ConversionError, match="config: a list; expected a config.json's path"):
        from_hf_config([{"model_type": "gpt2"}])
    # longer than the positions its ALiBi bias was built for: the field to change
    mpt = dict(model_type="mpt", d_model=32, n_layers=1, n_heads=2, max_seq_len=64,
               vocab_size=64, attn_config=dict(alibi=True))
    with pytest.raises(ConversionError, match=r"128 tokens are more than its max_seq_len \(64\)"):
        from_hf_config(mpt, seq_len=128)
    # rotary positions extend past the config's: exported, and said
    from mdot_jax.serving.model_source import config_said

    llama = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, vocab_size=64, max_position_embeddings=64)
    for seq_len, past in ((64, False), (128, True)):
        said = config_said(convert(from_hf_config(llama, seq_len=seq_len), batch_size=1))
        assert ("128 tokens a sample are past its max_position_embeddings (64)" in " ".join(said)
                ) == past


def test_an_encoder_alone_trains_as_a_masked_lm_and_a_config_of_no_language_model_is_named():
    """DistilBERT, ALBERT, ModernBERT have no causal LM: they were refused with transformers'
    'Unrecognized configuration class <class ...>'; a ViT's config too, with nothing to do."""
    import transformers

    from converters import from_hf_config

    small = dict(model_type="distilbert", dim=64, hidden_dim=128, n_layers=2, n_heads=2,
                 vocab_size=300)
    with torch.device("meta"):
        mlm = transformers.AutoModelForMaskedLM.from_config(
            transformers.AutoConfig.for_model(**small))
    seq = convert(from_hf_config(small, seq_len=32), batch_size=2)
    assert seq.params == sum(p.numel() for p in mlm.parameters())
    with pytest.raises(ConversionError, match=r"^config: model_type 'vit' has no causal, masked, "
                       r"sequence-to-sequence, image-text-to-text or audio-text language model .*"
                       r"converters.from_torch$"):
        from_hf_config({"model_type": "vit"})


def test_a_recurrence_the_exporter_unrolls_over_tokens_is_refused_and_chunked_scans_are_not():
    """RWKV's recurrence runs on the CPU as a loop over the tokens (a graph growing with them, a
    kernel set per token), traced on a CPU copy of the meta model; Mamba-2's chunked scan and
    Mamba-1's scan as its fused kernel do not grow."""
    from converters import from_hf_config

    tiny = dict(hidden_size=32, num_hidden_layers=3, vocab_size=64)
    with pytest.raises(ConversionError, match="'rwkv' exports as a loop over its tokens"):
        from_hf_config(dict(model_type="rwkv", attention_hidden_size=32, intermediate_size=64,
                            **tiny), seq_len=32)
    graph = from_hf_config(dict(model_type="mamba2", num_heads=2, head_dim=32, n_groups=1,
                                state_size=16, **tiny), seq_len=32)
    assert len(graph.graph.node) > 100
    assert from_hf_config(dict(model_type="mamba", **tiny), seq_len=32).graph.node


def test_a_config_short_of_the_models_shape_says_which_defaults_built_it(tmp_path, capsys):
    from converters import convert, from_hf_config
    from mdot_jax.cli import main

    # a Llama without its depth: transformers builds its 32 layers, and says so
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="llama", hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, vocab_size=64)))
    assert main(["predict", str(config), "--device", "h100-sxm", "--batch-size", "1",
                 "--seq-len", "16"]) == 0
    said = "no num_hidden_layers: transformers' defaults built the model (num_hidden_layers 32)"
    assert said in capsys.readouterr().err
    assert main(["convert", str(config), "--seq-len", "16", "--batch-size", "1"]) == 0
    assert said in capsys.readouterr().out
    # under the model's own names (GPT-2's n_embd, n_layer, n_head), nothing was defaulted
    gpt2 = from_hf_config(dict(model_type="gpt2", n_embd=32, n_layer=1, n_head=4,
                               vocab_size=64), seq_len=16)
    assert "defaulted" not in convert(gpt2, batch_size=1, fuse=True).meta


DECODER = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256, max_position_embeddings=512)


@pytest.fixture(scope="module")
def moe_graph():
    """A 3-layer Mixtral of 8 experts, top 2, at 32 tokens."""
    from converters import from_hf_config

    return from_hf_config(dict(model_type="mixtral", intermediate_size=128,
                               num_local_experts=8, num_experts_per_tok=2, **DECODER), seq_len=32)


@pytest.fixture(scope="module")
def moe(moe_graph):
    from converters import convert

    return convert(moe_graph, batch_size=2, fuse=True)


def test_convert_says_what_experts_a_file_holds(moe_graph, tmp_path, capsys):
    import onnx

    from mdot_jax.cli import main

    onnx.save(moe_graph, tmp_path / "moe.onnx")  # the experts travel in the file's metadata
    assert main(["convert", str(tmp_path / "moe.onnx"), "--batch-size", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["experts"] == dict(experts=8, top_k=2, layers=3, params=3 * 8 * 3 * 128 * 64)


def test_experts_that_do_not_divide_the_routed_tokens_take_a_padded_share_at_any_batch():
    """6 experts, top 2, 32 tokens: 64 routed copies are 11 rows an expert, 2 of padding. The
    ceiling was taken by negated floor division, which ONNX's Div truncates: 10 rows, a negative
    padding, and no such mixture converted."""
    from converters import convert, from_hf_config

    graph = from_hf_config(dict(model_type="mixtral", intermediate_size=128, num_local_experts=6,
                                num_experts_per_tok=2, **DECODER), seq_len=32)
    flops = [convert(graph, batch_size=b, fuse=True).flops for b in (1, 2, 3)]
    assert flops[0] < flops[1] < flops[2] and flops[2] < 3.1 * flops[0]


@pytest.mark.parametrize("kind, fields", [
    ("ernie4_5_moe", dict(moe_num_experts=8, moe_k=2, moe_intermediate_size=64)),
    ("aria_text", dict(moe_num_experts=8, moe_topk=2, moe_num_shared_experts=1)),
    ("kimi_linear", dict(num_experts=8, num_experts_per_token=2, moe_intermediate_size=64,
                         layer_types=["full_attention"] * 3, pad_token_id=0, kv_lora_rank=16,
                         qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                         num_key_value_heads=4))])
def test_experts_counted_under_other_field_names_route_balanced(kind, fields, monkeypatch):
    """ERNIE 4.5's and Aria's configs count their experts as `moe_num_experts`: left to
    transformers' grouped-GEMM path, which no exporter takes (`aten::_grouped_mm`). Kimi
    Linear's top k (`num_experts_per_token`) was read as 1, its experts' exchange over expert
    parallel GPUs priced at a k-th of its bytes: the top k is what the routers traced give."""
    import converters.hf_config as hf_config
    from converters import convert, from_hf_config

    monkeypatch.setattr(hf_config, "TOP_K_FIELDS", ())  # whatever a config names it

    graph = from_hf_config(dict(DECODER, model_type=kind, intermediate_size=128, **fields),
                           seq_len=32)
    experts = convert(graph, batch_size=2, fuse=True).meta["experts"]
    assert experts["experts"] == 8 and experts["top_k"] == 2 and experts["layers"] >= 2


@pytest.mark.parametrize("kind, fields, top_k, layers", [
    ("dbrx", dict(d_model=64, n_heads=4, n_layers=3, max_seq_len=512, vocab_size=256,
                  attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=1e4),
                  ffn_config=dict(ffn_hidden_size=128, moe_num_experts=8, moe_top_k=2)), 2, 3),
    ("switch_transformers", dict(d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=4,
                                 num_decoder_layers=4, num_experts=8, vocab_size=256,
                                 encoder_sparse_step=2, decoder_sparse_step=2), 1, 4),
    pytest.param("nllb-moe", dict(
        d_model=32, encoder_layers=4, decoder_layers=4, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128,
        num_experts=8, encoder_sparse_step=2, decoder_sparse_step=2), 2, 4,
        marks=pytest.mark.slow),  # an encoder-decoder's experts, as Switch's (fast tier)
    ("jetmoe", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, kv_channels=16,
                    num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
                    vocab_size=256), 2, 3)])
def test_experts_outside_transformers_interface_route_balanced(kind, fields, top_k, layers):
    """DBRX's, Switch Transformers', NLLB-MoE's and JetMoE's experts size each expert's rows
    by the data (`nonzero`, `.tolist()`), which no meta tensor has: DBRX (132B) was refused, a
    Switch Transformer too ("NonZero: output shape unknown"), JetMoE traced on the CPU with its
    example's row counts baked in, which no other batch matched ("Mismatch between the sum of
    'split' (128) and the split dimension of the input (256)"), NLLB-MoE on the CPU with the
    experts its example's tokens reached alone (20.9M of its small config's 418.9M parameters
    priced, silently)."""
    import torch
    import transformers

    from converters import convert, from_hf_config

    graph = from_hf_config(dict(model_type=kind, **fields), seq_len=32)
    seqs = [convert(graph, batch_size=b, fuse=True) for b in (1, 2, 3)]
    cfg = transformers.AutoConfig.for_model(kind, **fields)
    with torch.device("meta"):
        model = (transformers.AutoModelForSeq2SeqLM if cfg.is_encoder_decoder
                 else transformers.AutoModelForCausalLM).from_config(cfg)
    assert seqs[0].params == sum(p.numel() for p in model.parameters())
    assert seqs[2].flops == pytest.approx(3 * seqs[0].flops, rel=0.02)
    said = seqs[1].meta["experts"]
    assert (said["experts"], said["top_k"], said["layers"]) == (8, top_k, layers)


def test_a_dense_model_whose_config_counts_experts_has_none():
    """A Llama config carrying `num_experts` (a leftover of another model's) was said to be a
    mixture "of 8 experts in 0 layers", and `ep` was priced for it."""
    from converters import convert, from_hf_config

    graph = from_hf_config(dict(model_type="llama", intermediate_size=128, num_experts=8,
                                **DECODER), seq_len=32)
    assert "experts" not in convert(graph, batch_size=2, fuse=True).meta


def test_a_mixture_of_experts_exports_as_balanced_routing(moe):
    """Every expert's weights are parameters; each computes an equal share of the T x k
    routed tokens, so the experts' GEMMs are a dense FFN's k times as wide, beside the router."""
    from converters import convert, from_hf_config

    dense = convert(from_hf_config(dict(model_type="mistral", intermediate_size=2 * 128,
                                        **DECODER), seq_len=32), batch_size=2, fuse=True)
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 2 * 64 + 8 * 64  # attention (GQA), norms, router
    assert moe.params == 2 * 256 * 64 + 64 + 3 * (layer + 8 * 3 * 128 * 64)
    router = 3 * 3 * 2 * (2 * 32) * 64 * 8  # forward and backward of a [T, d] x [d, E] GEMM
    assert moe.flops - router == pytest.approx(dense.flops, rel=0.03)  # the dispatch's copies
    names = set(moe.op_names)
    assert {"TopK", "Gather"} <= names  # the router's choice and the dispatch, priced
    assert moe.meta["experts"] == dict(experts=8, top_k=2, layers=3, params=3 * 8 * 3 * 128 * 64)
    assert "experts" not in dense.meta
    from mdot_jax import TrainingJob, predict

    p = predict(TrainingJob(model=moe, batch_size=2, device="h100-sxm", precision="amp-bf16"))
    assert any(w.startswith("mixture of experts (8 experts, top 2, in 3 layers): priced as "
                            "balanced routing")
               for w in p.warnings)


@pytest.mark.slow
def test_a_70b_llama_on_meta_will_not_fit_one_h200():
    from converters import from_hf_config
    from mdot_jax.gpu import catalog as gpus
    from mdot_jax.gpu.spec_sheet import load_step_model, price

    llama_70b = dict(model_type="llama", hidden_size=8192, intermediate_size=28672,
                     num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                     vocab_size=128256)
    seq = to_sequence(load_model(from_hf_config(llama_70b, seq_len=64), batch_size=1),
                      "llama-70b", fuse=True)
    assert abs(seq.meta["params"] / 70_553_706_496 - 1) < 0.01  # 70.6B: Llama 3 70B's count
    p = price(seq, gpus.find("h200"), load_step_model(), precision="amp-bf16")
    assert p.memory_gb > 500  # fp32 weights, gradients and master copies alone: 70.6B x 12 B
    assert any("will not fit" in w for w in p.warnings) and p.interval_ms is None


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_causal_lm_exports_the_logits_of_every_position(name):
    """The exporter bound `logits_to_keep=0` (keep all) as a traced input, which made it a
    scalar index: the language-model head priced one position of each sequence."""
    model = _build(name, "meta")
    proto = from_torch(model, torch.zeros(1, 16, dtype=torch.long), input_names=["input_ids"])
    assert "logits_to_keep" not in {i.name for i in proto.graph.input}
    assert "forward" not in model.__dict__  # the module's own forward is back
    seq = _sequence(proto, batch=2)
    written = seq.load[:, LOAD_FIELDS.index("bytes_written")]
    assert seq.op_names[-1] == "MatMul" and written[-1] == 4 * 2 * 16 * 500  # fp32 logits


REPEATED = {  # 4 layers: layer 1 copied twice
    "gpt2": dict(n_layer=4, n_embd=64, n_head=4, vocab_size=500),
    "llama": dict(hidden_size=64, intermediate_size=172, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=500),
    "mpt": dict(d_model=64, n_heads=4, n_layers=4, vocab_size=500),
}


def _same_as_the_full_trace(fields, config, monkeypatch, layers=4, t=1):
    """`config` (a config.json or its fields) traced up to layer `t` and repeated, checked
    against `fields` traced whole: the same operator sequence; the repeated one."""
    import converters.hf_config as export
    from converters import from_hf_config

    full, copied = _sequence(from_hf_config(fields, seq_len=16, repeat=False)), []
    real = export.repeat_layer
    monkeypatch.setattr(export, "repeat_layer",
                        lambda m, s, n, k, p=1: copied.append((n, k)) or real(m, s, n, k, p))
    fast = _sequence(from_hf_config(config, seq_len=16))
    assert copied == [(layers, t)], "not repeated"
    for f in ("op_type", "config", "load", "edges", "node_names"):
        np.testing.assert_array_equal(getattr(fast, f), getattr(full, f), err_msg=f)
    assert fast.meta == full.meta
    return fast


# decoders of other families, 4 layers (the repeat copies layer 1 twice)
MORE = {
    "mistral": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=2),
    "qwen2": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2),
    "phi": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4),
    "gpt_neox": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4),
    "falcon": dict(hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                   new_decoder_architecture=True),
    "opt": dict(hidden_size=64, ffn_dim=128, num_attention_heads=4, word_embed_proj_dim=64),
    "bloom": dict(hidden_size=64, n_head=4),
    "gemma": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16),
    "gptj": dict(n_embd=64, n_head=4, rotary_dim=8),
    "starcoder2": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MORE))
def test_other_decoders_repeat_as_they_trace(name, monkeypatch):
    fields = dict(MORE[name], model_type=name, num_hidden_layers=4, vocab_size=256)
    _same_as_the_full_trace(fields, fields, monkeypatch)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "llama" else pytest.mark.slow)
                                  for n in sorted(REPEATED)])  # the fast tier: Llama's
def test_a_config_json_exports_every_layer_tracing_two(name, tmp_path, monkeypatch):
    """`from_hf_config`: a causal LM from its config.json alone (no network), on meta. A 70B
    decoder's 80 layers took half a minute to trace: two are traced and layer 1 is copied in
    the graph (`converters.repeat`); the operator sequence is the full trace's."""
    fields = dict(REPEATED[name], model_type=name)
    # as checkpoints ship it: stored in bf16, which says nothing of how it trains (it failed)
    (tmp_path / "config.json").write_text(json.dumps(dict(fields, torch_dtype="bfloat16")))
    fast = _same_as_the_full_trace(fields, tmp_path, monkeypatch)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(name, **REPEATED[name]))
    assert fast.meta["params"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind, fields, t", [
    ("gpt_oss", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention"] * 4), 3),
    pytest.param("qwen3", dict(use_sliding_window=True, sliding_window=8, layer_types=(
        ["sliding_attention"] * 2 + ["full_attention"]) * 2 + ["sliding_attention"] * 2), 4,
        marks=pytest.mark.slow)])  # (gpt-oss's alternation in the fast tier)
def test_a_stack_alternating_kinds_of_layers_repeats_its_pattern(kind, fields, t, monkeypatch):
    """gpt-oss alternates sliding-window and full attention, Gemma 3 and Qwen3 configs repeat
    patterns of them: every layer was traced (gpt-oss-120b's 36 in 20 s, Qwen3-Next's 48 in
    39 s). The pattern's layers are traced once past the first and copied in turn; the graph
    is the full trace's."""
    n = len(fields["layer_types"])
    config = dict(model_type=kind, hidden_size=64, intermediate_size=64, head_dim=16,
                  num_hidden_layers=n, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=500, **fields)
    _same_as_the_full_trace(config, config, monkeypatch, layers=n, t=t)


@pytest.mark.slow
def test_layers_that_differ_are_all_traced(monkeypatch):
    """Gemma 2 alternates sliding-window and full attention: layer 1 is not every layer."""
    import converters.hf_config as export
    from converters import from_hf_config
    from converters.repeat import layer_stack, template

    fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, head_dim=16,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=500)
    cfg = transformers.AutoConfig.for_model("gemma2", **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    name, layers = layer_stack(model, 4)
    assert name == "model.layers" and template(layers, cfg) is None
    cfg.layer_types = [cfg.layer_types[1]] * 4  # the config agrees; the modules still differ
    assert template(layers, cfg) is None
    monkeypatch.setattr(export, "repeat_layer", lambda *a: pytest.fail("repeated"))
    seq = _sequence(from_hf_config(dict(fields, model_type="gemma2"), seq_len=16))
    assert seq.meta["params"] == sum(p.numel() for p in model.parameters())
    assert sum(f"layers.{i}/" in n for n in seq.node_names for i in (2, 3)) > 0


@pytest.mark.parametrize("fields,needle", [
    (dict(gpus=8, ep=3), "does not divide the 8 data-parallel replicas"),
    (dict(gpus=16, ep=16), "does not divide the model's 8 experts"),
    (dict(gpus=1, ep=2), "does not divide the 1 data-parallel replicas"),
])
def test_expert_parallelism_the_model_cannot_take_is_one_named_error(moe, fields, needle):
    from mdot_jax import RequestError, TrainingJob, predict

    with pytest.raises(RequestError) as e:
        predict(TrainingJob(model=moe, batch_size=2, device="h100-sxm", **fields))
    assert e.value.field == "ep" and needle in str(e.value) and "\n" not in str(e.value)


def test_experts_split_over_gpus_exchange_tokens_and_hold_less(moe):
    from mdot_jax import TrainingJob, predict

    job = dict(model=moe, batch_size=2, device="h100-sxm", gpus=8, precision="amp-bf16",
               optimizer="adamw")
    plain, split = (predict(TrainingJob(**job, ep=ep)) for ep in (1, 4))
    note = next(w for w in split.warnings if w.startswith("expert parallel over 4 GPUs"))
    assert "(2 of 8 experts each): 12 all-to-alls" in note  # 3 layers x 2 passes x 2
    assert split.memory_gb < plain.memory_gb and not any(
        w.startswith("expert parallel") for w in plain.warnings)


@pytest.mark.slow  # two configs exported; balanced routing is in the fast tier
def test_first_dense_layers_then_experts_trace_to_the_second_of_the_run(monkeypatch):
    """DeepSeek V3: its first layers dense, the rest experts; traced up to the second layer
    with experts (layer 3 of 6), which is copied: the full trace's operator sequence."""
    fields = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=128,
                  moe_intermediate_size=32, num_hidden_layers=6, first_k_dense_replace=2,
                  num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                  num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
                  kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                  v_head_dim=16, vocab_size=256, max_position_embeddings=512)
    seq = _same_as_the_full_trace(fields, fields, monkeypatch, layers=6, t=3)
    assert seq.meta["experts"]["layers"] == 4


def test_a_gpu_of_an_expert_parallel_group_runs_its_experts_over_more_rows(moe):
    from converters.sequence import CONFIG_FIELDS
    from mdot_jax.gpu.model_parallel import expert_params, shard_experts

    four = shard_experts(moe, 4)
    assert shard_experts(moe, 1) is moe and four.flops == moe.flops  # the same work a GPU
    assert expert_params(moe) == moe.meta["experts"]["params"]
    assert moe.params - four.params == expert_params(moe) * 3 // 4 == expert_params(four) * 3
    b, m = CONFIG_FIELDS.index("mm_batch"), CONFIG_FIELDS.index("mm_m")
    gemms = [i for i, n in enumerate(moe.node_names) if "/experts/MatMul" in n]
    assert len(gemms) == 2 * 3  # up and down, 3 layers
    for i in gemms:
        assert four.config[i, b] == moe.config[i, b] / 4 == 2
        assert four.config[i, m] == moe.config[i, m] * 4


def test_a_plan_prices_a_mixture_at_its_best_expert_parallel_degree(moe_graph, tmp_path):
    import onnx

    from mdot_jax import TrainingJob
    from mdot_jax.serving.plan import Plan, plan

    onnx.save(moe_graph, tmp_path / "moe.onnx")
    job = TrainingJob(model=str(tmp_path / "moe.onnx"), batch_size=2, train_tokens=10 ** 9,
                      precision="amp-bf16", optimizer="adamw", gpus=(8,))
    options = plan(Plan(job, devices="h100-sxm", gpus=(8,), global_batch=16))
    assert options and all(o.feasible for o in options)
    for o in options:  # ep divides the replicas and the 8 experts
        replicas = 8 // (o.layout.tp * o.layout.pp)
        assert replicas % o.layout.ep == 0 and 8 % o.layout.ep == 0
        assert (f" ep{o.layout.ep} " in str(o.layout)) == (o.layout.ep > 1)
    fixed = plan(Plan(dataclasses.replace(job, ep=2), devices="h100-sxm", gpus=(8,),
                      global_batch=16))
    assert {o.layout.ep for o in fixed} == {2}  # the job's own degree, kept
    assert all(" ep2 " in str(o.layout) for o in fixed)


def test_expert_parallelism_over_a_pipeline_reduces_the_stages_experts(moe):
    """Under pipeline parallelism a GPU holds a stage's parameters: the experts' share of those
    (not the model's, which made the data-parallel reduction negative), so the iteration's
    communication holds the all-to-alls and a reduction."""
    from mdot_jax import TrainingJob, predict

    p = predict(TrainingJob(model=moe, batch_size=2, device="h100-sxm", gpus=6, pp=3, ep=2,
                            grad_accum=3, precision="amp-bf16", optimizer="adamw"))
    note = next(w for w in p.warnings if w.startswith("expert parallel over 2 GPUs"))
    exchange = float(re.search(r"MB \(([\d.e+-]+) ms\)", note)[1])
    reduce = next(w for w in p.warnings if w.startswith("ddp: gradient all-reduce"))
    assert float(re.search(r"\(([\d.e+-]+) ms,", reduce)[1]) > 0
    assert p.phases["communication"] > exchange


def test_experts_over_nodes_exchange_through_the_nodes_network(moe):
    from mdot_jax import TrainingJob, predict

    job = dict(model=moe, batch_size=2, device="h100-sxm", precision="amp-bf16", ep=8)
    within, across = (predict(TrainingJob(**job, gpus=g, nodes=k, network_gbs=net)) for g, k, net
                      in ((8, 1, None), (4, 2, 25)))
    notes = [next(w for w in p.warnings if w.startswith("expert parallel")) for p in
             (within, across)]
    assert "network" not in notes[0] and "and the network (6.25 GB/s a GPU)" in notes[1]
    ms = [float(re.search(r"MB \(([\d.e+-]+) ms\)", n)[1]) for n in notes]
    assert ms[1] > 2 * ms[0]  # 25 GB/s a node shared by its 4 GPUs, the network latency


@pytest.mark.parametrize("config", [
    dict(model_type="t5", d_model=64, d_ff=128, num_layers=3, num_decoder_layers=2,
         num_heads=4, d_kv=16, vocab_size=500),  # no decoder_start_token_id: T5's pad's
    dict(model_type="bart", d_model=64, encoder_layers=3, decoder_layers=3,
         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
         decoder_ffn_dim=128, vocab_size=500),
])
def test_an_encoder_decoders_config_exports_its_sequence_to_sequence_step(config):
    """T5 and BART (`is_encoder_decoder`) train on targets through their decoder: built as
    sequence-to-sequence LMs (their causal-LM class, where one exists, is the decoder alone),
    every parameter counted, the loss over the targets in the graph; T5's relative-position
    buckets (log(0), its -inf cast) fold without numpy's warnings, once printed by every
    `mdot predict` of a T5."""
    import warnings

    from converters import from_hf_config

    graph = from_hf_config(config, seq_len=32)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        seq = _sequence(graph)
    assert [str(w.message) for w in said] == []
    fields = dict(config)
    with torch.device("meta"):
        model = transformers.AutoModelForSeq2SeqLM.from_config(
            transformers.AutoConfig.for_model(fields.pop("model_type"), **fields))
    assert seq.meta["params"] == sum(p.numel() for p in model.parameters())
    assert "SoftmaxCrossEntropyLoss" in seq.op_names.tolist() or \
        "NegativeLogLikelihoodLoss" in seq.op_names.tolist()


def test_a_t5_built_by_the_user_exports_without_its_stacks_caches():
    """T5's encoder and decoder each read a copy of the model's config: the model's
    `use_cache` off, the decoder still returned its cache, which the tracer refused
    ("received an input of unsupported type: EncoderDecoderCache")."""
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16,
        vocab_size=128))
    ids = {"input_ids": torch.randint(0, 128, (2, 16)),
           "decoder_input_ids": torch.randint(0, 128, (2, 8))}
    seq = _sequence(from_torch(model, ids))
    assert seq.meta["params"] == sum(p.numel() for p in model.parameters())
    assert model.config.use_cache and model.decoder.config.use_cache  # as they were


@pytest.mark.slow  # a T5 exported and predicted twice; the fast tier exports encoder-decoders above
def test_an_encoder_decoders_targets_may_be_shorter_than_its_inputs(tmp_path, capsys):
    """A summariser's targets (`target_len`, `--target-len`): its decoder runs that many
    positions; a causal LM, or an ONNX file, is refused in one line naming the field."""
    from converters import convert, from_hf_config
    from mdot_jax import RequestError, TrainingJob, predict
    from mdot_jax.cli import main

    t5 = dict(model_type="t5", d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
              vocab_size=512)
    whole, short = (convert(from_hf_config(t5, seq_len=64, target_len=t), batch_size=2)
                    for t in (None, 16))
    assert short.meta["inputs"] == whole.meta["inputs"] == {"input_ids": [2, 64]}
    assert short.meta["params"] == whole.meta["params"]
    assert 0.4 < short.flops / whole.flops < 0.9  # the encoder's work stays
    with pytest.raises(ConversionError, match="'gpt2' is a causal LM, whose targets are its "
                                              "inputs"):
        from_hf_config(dict(model_type="gpt2", n_layer=1, n_embd=32, n_head=4,
                            vocab_size=64), seq_len=16, target_len=8)
    (tmp_path / "config.json").write_text(json.dumps(t5))
    job = dict(batch_size=2, seq_len=64, device="h100-sxm")
    times = [predict(TrainingJob(model=str(tmp_path / "config.json"), target_len=t,
                                 **job)).iteration_ms for t in (None, 16)]
    assert times[1] < times[0]
    from mdot_jax.serving.plan import Plan, plan  # it prices the converted model: as asked

    for global_batch in (None, 4):
        options = plan(Plan(TrainingJob(model=str(tmp_path / "config.json"), target_len=16,
                                        train_tokens=10**6, **job), devices=("h100-sxm",),
                            gpus=(2,), global_batch=global_batch))
        assert options and all(o.feasible for o in options), options
    onnx.save(from_hf_config(t5, seq_len=64), tmp_path / "t5.onnx")
    with pytest.raises(RequestError) as e:
        predict(TrainingJob(model=str(tmp_path / "t5.onnx"), target_len=16, **job))
    assert e.value.field == "target_len"
    assert main(["convert", str(tmp_path / "t5.onnx"), "--batch-size", "2", "--seq-len", "64",
                 "--target-len", "16"]) != 0
    assert "--target-len: an encoder-decoder's config.json takes it" in capsys.readouterr().err


def test_a_speech_recognisers_config_exports_its_transcription_step(tmp_path):
    """Whisper's config.json was refused ("has no causal, masked or sequence-to-sequence
    language model"): it trains on its audio features [B, mel bins, 2 x max_source_positions
    frames] (every clip padded to 30 s) and --seq-len target tokens."""
    import torch
    import transformers

    from converters import convert, from_hf_config
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    whisper = dict(model_type="whisper", d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                   decoder_ffn_dim=128, vocab_size=512, num_mel_bins=80, pad_token_id=0,
                   bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                   max_source_positions=100, max_target_positions=64)
    graph = from_hf_config(whisper, seq_len=16)
    short, long = (convert(graph, batch_size=2, seq_len=t, fuse=True) for t in (16, 48))
    assert long.meta["inputs"] == {"input_features": [2, 80, 200], "labels": [2, 48]}
    with torch.device("meta"):
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(
            transformers.AutoConfig.for_model(**whisper))
    assert short.params == sum(p.numel() for p in model.parameters())
    assert short.flops < long.flops < 3 * short.flops  # the encoder's work stays
    with pytest.raises(ConversionError, match="transcribes its audio into --seq-len tokens"):
        from_hf_config(whisper, seq_len=16, target_len=8)
    with pytest.raises(ConversionError, match="65 tokens are more than its "
                                              "max_target_positions"):
        from_hf_config(whisper, seq_len=65)
    (tmp_path / "config.json").write_text(json.dumps(whisper))
    for device in (None, "h100-sxm"):  # --seq-len is its targets' length, not its audio's
        assert predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=16,
                                   batch_size=2, device=device)).iteration_ms > 0
    with pytest.raises(ConversionError, match="audio_seconds 30: model_type 'whisper' pads "
                                              "every clip to its \\(80, 200\\) features"):
        from_hf_config(whisper, seq_len=16, audio_seconds=30)
    assert config_said(short) == ["trained as WhisperForConditionalGeneration, on 80 x 200 "
                                  "audio features a sample, transcribed into its tokens: every "
                                  "token's loss"]


def test_a_model_whose_forward_changes_it_is_probed_on_a_copy():
    """BigBird sets its attention dense when a sequence is shorter than its sparse blocks: the
    probe for recurrences (8 and 24 tokens, its first layer alone) switched the model and that
    layer, the other layers stayed sparse, and no BigBird of more than two layers exported at
    any length ("gather(): argument 'input' (position 1) must be Tensor, not NoneType")."""
    from converters import convert, from_hf_config

    bird = dict(model_type="big_bird", is_decoder=True, hidden_size=64, num_hidden_layers=4,
                num_attention_heads=4, intermediate_size=128, vocab_size=512, block_size=16,
                num_random_blocks=2, max_position_embeddings=1024)
    dense, sparse = (convert(from_hf_config(bird, seq_len=t), batch_size=2, fuse=True)
                     for t in (64, 512))
    assert dense.params == sparse.params and sparse.flops > dense.flops


BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)


@pytest.mark.parametrize("kind, arch, fields, labels", [
    ("llama", "LlamaForSequenceClassification", DECODER, ", 3 labels"),
    ("bert", "BertForTokenClassification", BERT, ", 3 labels"),
    ("bert", "BertForQuestionAnswering", BERT, "")])
def test_a_classifiers_config_trains_its_head_not_a_language_models(kind, arch, fields, labels):
    """A fine-tuned classifier's config.json names it in `architectures` (a reward model, a
    BERT classifier, SQuAD's answer spans): it was priced as its language model, the
    vocabulary's logits and their loss in place of a few labels' (Llama 7B: 131M parameters of
    head, a fifth of a short sequence's work)."""
    import torch
    import transformers

    from converters import convert, from_hf_config
    from mdot_jax import TrainingJob, predict

    config = dict(fields, model_type=kind, intermediate_size=128, num_labels=3 if labels else 2)
    lm, classifier = (convert(from_hf_config(dict(config, **named), seq_len=32), batch_size=2,
                              fuse=True) for named in ({}, dict(architectures=[arch])))
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = getattr(transformers, arch)._from_config(cfg)
    assert classifier.params == sum(p.numel() for p in model.parameters()) < lm.params
    assert classifier.meta["head"] == dict(head=arch, labels=3 if labels else None)
    assert classifier.flops < lm.flops and "head" not in lm.meta
    p = predict(TrainingJob(model=classifier, batch_size=2, device="h100-sxm"))
    assert f"trained as {arch} (the config's architectures){labels}: its head and loss" in \
        " ".join(p.warnings)


def test_lora_on_a_classifier_trains_its_head_in_full():
    """peft's task models train their head in full beside the adapters (`modules_to_save`:
    `score`, `classifier`): it was frozen with the base, and adapted under all-linear."""
    from converters import convert, from_hf_config
    from mdot_jax import autograd

    config = dict(DECODER, model_type="llama", intermediate_size=128, num_labels=3)
    lm, classifier = (convert(from_hf_config(dict(config, architectures=[arch]), seq_len=32,
                                             lora_rank=4), batch_size=2, fuse=True)
                      for arch in ("LlamaForCausalLM", "LlamaForSequenceClassification"))
    assert autograd.trainable(classifier) == autograd.trainable(lm) + 64 * 3  # score [3, 64]


def test_an_image_classifiers_config_trains_on_its_images(tmp_path):
    """A ViT fine-tuned to classify (`architectures`: `ViTForImageClassification`) was refused
    ("has no causal, masked or sequence-to-sequence language model"), and any config wanted
    --seq-len: it trains on images of its config's size, its labels' loss."""
    import torch
    import transformers

    from converters import convert, from_hf_config
    from mdot_jax import RequestError, TrainingJob, predict

    vit = dict(model_type="vit", architectures=["ViTForImageClassification"], hidden_size=64,
               num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
               image_size=64, patch_size=16, num_labels=10)
    graph = from_hf_config(vit)
    small, large = (convert(graph, batch_size=b, fuse=True) for b in (2, 6))
    assert large.meta["inputs"] == {"pixel_values": [6, 3, 64, 64]}
    assert large.flops == pytest.approx(3 * small.flops, rel=0.01)
    with torch.device("meta"):
        model = transformers.ViTForImageClassification._from_config(
            transformers.AutoConfig.for_model(**vit))
    assert small.params == sum(p.numel() for p in model.parameters())
    assert small.meta["head"] == dict(head="ViTForImageClassification", labels=10,
                                      pixels=[64, 64])
    with pytest.raises(ConversionError, match=r"depends on the size it was exported at .*"
                                              r"predict at --image-size 64"):
        convert(graph, batch_size=2, image_size=96)  # its position table's size
    (tmp_path / "config.json").write_text(json.dumps(vit))
    job = dict(model=str(tmp_path / "config.json"), batch_size=2, device="h100-sxm")
    assert predict(TrainingJob(**job)).iteration_ms > 0  # no --seq-len wanted
    with pytest.raises((RequestError, ConversionError), match="seq_len 16 does not apply"):
        predict(TrainingJob(seq_len=16, **job))
    with pytest.raises(ConversionError, match="'vit' is a ViTForImageClassification, trained on "
                                              "its labels$"):
        from_hf_config(vit, target_len=4)
    (tmp_path / "config.json").write_text(json.dumps(dict(vit, architectures=["ViTModel"])))
    with pytest.raises(RequestError, match="seq_len: required"):
        predict(TrainingJob(**job))


def test_a_cohere_config_converts():
    """torch's repeat_interleave symbolic normalised a negative dim in the constant the graph
    pools, so every later -1 took its value: Cohere's interleaved rotary made its rotate_half's
    stack(dim=-1) a stack(dim=2), and no Cohere config converted (`test_symbolics`)."""
    from converters import convert, from_hf_config

    cohere = from_hf_config(dict(model_type="cohere", hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=3, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=256), seq_len=32)
    assert convert(cohere, batch_size=2, seq_len=32).params > 0


def test_llama_4s_complex_rotary_config_converts_with_every_parameter():
    import transformers

    from converters import convert, from_hf_config

    fields = dict(model_type="llama4_text", intermediate_size=128, intermediate_size_mlp=128,
                  head_dim=16, num_local_experts=4, num_experts_per_tok=1, **DECODER)
    seq = convert(from_hf_config(fields, seq_len=32), batch_size=2, fuse=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**fields))
    assert seq.params == sum(p.numel() for p in model.parameters())


def test_a_shallower_override_of_a_config_listing_its_layers_cuts_the_list():
    """`num_hidden_layers=4` over a config listing each layer's kind (every Qwen3, Gemma 3,
    Llama 4 config.json has `layer_types`) was refused by transformers: "`num_hidden_layers`
    (4) must be equal to the number of `layer_types` (6)"; the list's pattern is kept."""
    import transformers

    from converters import convert, from_hf_config

    kinds = ["sliding_attention"] * 2 + ["full_attention"]
    fields = dict(DECODER, model_type="qwen3", intermediate_size=128, head_dim=16,
                  num_hidden_layers=6, layer_types=kinds * 2, sliding_window=8,
                  use_sliding_window=True)
    seq = convert(from_hf_config(fields, seq_len=32, num_hidden_layers=4), batch_size=2)
    cfg = transformers.AutoConfig.for_model(**dict(fields, num_hidden_layers=4,
                                                   layer_types=kinds + kinds[:1]))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert fields["layer_types"] == kinds * 2  # the caller's config is left as it was


@pytest.mark.slow  # a DeepSeek-V3.2 config converted through the CLI
def test_deepseeks_sparse_attention_exports_dense_and_masked_and_says_so(capsys, tmp_path):
    """DeepSeek-V3.2's indexer masks each query to its top-k keys with a scatter of a Python
    bool, which the tracer refused; it exports (every parameter counted), and the prediction
    says the attention is priced dense, not as sparse kernels."""
    from converters import convert, from_hf_config
    from mdot_jax.cli import main
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    config = dict(model_type="deepseek_v32", hidden_size=128, intermediate_size=256,
                  moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  vocab_size=1000, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                  topk_group=1, first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=32,
                  qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, index_n_heads=4,
                  index_head_dim=32, index_topk=16)
    graph = from_hf_config(config, seq_len=64)
    seq = convert(graph, batch_size=2, seq_len=64, fuse=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**config))
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert seq.meta["sparse_attention"] == 16
    p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16"))
    assert any(w.startswith("sparse attention (each query's top 16 keys") for w in p.warnings)
    onnx.save(graph, tmp_path / "dsv32.onnx")
    assert main(["convert", str(tmp_path / "dsv32.onnx"), "--batch-size", "2"]) == 0
    assert "sparse attention: each query's top 16 keys" in capsys.readouterr().out


@pytest.mark.slow  # two children, each importing PyTorch and transformers
@pytest.mark.child_export
def test_a_config_exports_in_a_child_process_and_its_error_is_one_line(tmp_path, monkeypatch):
    """The library exports a config.json in a process of its own (the other tests do it in
    theirs): the graph comes back, and a ConversionError as its own line; a config.json edited
    since is exported again (a service had kept its first graph, cached by the path alone).
    On a terminal a line says the export runs, and for how long (a 70B's takes half a
    minute); it is cleared when it ends."""
    import io
    import sys

    pytest.importorskip("transformers")
    from mdot_jax.serving.model_source import config_graph

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(model_type="llama", hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    vocab_size=100)))
    seq = to_sequence(load_model(config_graph(path, 8), batch_size=2))
    shown = sys.stderr.getvalue()
    assert "\rexporting config.json on the meta device: 00:0" in shown and shown.endswith("\r")
    assert seq.params == 100 * 32 * 2 + 4 * 32 * 32 + 3 * 32 * 64 + 3 * 32  # tied: no
    path.write_text(json.dumps(dict(hidden_size=32)))
    with pytest.raises(ConversionError, match=r"config.json: no 'model_type'") as e:
        config_graph(path, 8)
    assert "\n" not in str(e.value)


def test_a_config_jsons_model_is_converted_once_a_batch_while_the_file_is_unchanged(
        tmp_path, monkeypatch):
    """Pricing one config.json at many settings (what would fit, a service's requests)
    converts its graph once at each batch; an edited file is converted again."""
    pytest.importorskip("transformers")
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving import model_source

    calls = []
    real = model_source.convert
    monkeypatch.setattr(model_source, "convert", lambda *a, **k: calls.append(k) or real(*a, **k))
    path = tmp_path / "config.json"
    fields = dict(model_type="llama", hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, vocab_size=100)
    path.write_text(json.dumps(fields))
    job = TrainingJob(model=str(path), seq_len=16, batch_size=2, device="h100-sxm")
    first = predict(job).iteration_ms
    for change in (dict(precision="amp-bf16"), dict(activation_checkpointing="full"),
                   dict(optimizer="adamw")):
        predict(dataclasses.replace(job, **change))
    assert [k["batch_size"] for k in calls] == [2]
    predict(dataclasses.replace(job, batch_size=1))
    assert [k["batch_size"] for k in calls] == [2, 1]
    path.write_text(json.dumps(dict(fields, num_hidden_layers=2, intermediate_size=128)))
    assert predict(job).iteration_ms > first
    assert [k["batch_size"] for k in calls] == [2, 1, 2]


def test_a_config_jsons_export_is_kept_on_disk_for_the_next_command(tmp_path, monkeypatch):
    """A later process asking the same of the same file answers without exporting; an edited
    file, another length or a kept file that does not read are exported again; `off` keeps
    nothing; a folder it cannot write still answers."""
    pytest.importorskip("transformers")
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving import exports, model_source

    asked = []
    exported = model_source._export_child  # the test's in-process one (conftest)
    monkeypatch.setattr(model_source, "_export_child",
                        lambda argv: asked.append(argv[1]) or exported(argv))
    monkeypatch.setenv("MDOT_EXPORTS", str(tmp_path / "kept"))
    path = tmp_path / "config.json"
    fields = dict(model_type="llama", hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, vocab_size=100)
    path.write_text(json.dumps(fields))
    job = TrainingJob(model=str(path), seq_len=16, batch_size=2, device="h100-sxm")

    def command(**change) -> float:  # a new process: nothing kept in memory
        model_source._from_config.cache_clear()
        model_source._config_converted.cache_clear()
        return predict(dataclasses.replace(job, **change)).iteration_ms

    first = command()
    assert command() == first and asked == ["16"]
    kept = list((tmp_path / "kept").glob("*.onnx"))
    assert len(kept) == 1 and not list((tmp_path / "kept").glob(".*"))
    command(seq_len=32)
    assert asked == ["16", "32"]
    path.write_text(json.dumps(dict(fields, num_hidden_layers=2)))
    assert command() > first and asked == ["16", "32", "16"]
    path.write_text(json.dumps(fields))
    assert command() == first and len(asked) == 3  # the first file's export, kept
    kept[0].write_bytes(b"not onnx")
    assert command() == first and len(asked) == 4  # exported again, and kept again
    assert exports.load(path, ["16", "0", "0", "", "1", "0", "0", "0"]) is not None
    monkeypatch.setenv("MDOT_EXPORTS", "off")
    assert command() == first and len(asked) == 5 and exports.folder() is None
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder would be: nothing kept, still answered
    monkeypatch.setenv("MDOT_EXPORTS", str(blocked / "kept"))
    assert command() == first and command() == first and len(asked) == 7


def test_a_config_jsons_model_is_named_by_its_folder(tmp_path):
    """`gpt2/config.json` at more tokens than its learned positions: refused naming `gpt2`,
    not the file's stem every such file shares."""
    from mdot_jax import RequestError, TrainingJob, predict
    from mdot_jax.serving.model_source import config_name

    folder = tmp_path / "tiny-gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(
        model_type="gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)))
    assert config_name(folder / "config.json") == config_name(folder) == "tiny-gpt2"
    assert config_name(tmp_path / "gpt2-small.json") == "gpt2-small"
    with pytest.raises(RequestError, match=r"^seq_len 128: past the 64 positions model "
                       r"'tiny-gpt2' has \(a table of them, read by node '.*Gather'\)") as e:
        predict(TrainingJob(model=str(folder / "config.json"), batch_size=2, seq_len=128,
                            device="h100-sxm"))
    assert e.value.field == "seq_len"  # the service's answer names the field to change


def test_positions_computed_from_the_input_past_a_learned_table_are_refused(tmp_path):
    """RoBERTa's positions are a cumulative sum of its input's mask, from its padding index
    on: past its table they export, and 600 tokens of roberta-base were priced (PyTorch's
    index error when run), 513 with no word (its 514 rows hold 512 positions).
    A rotary model past its max_position_embeddings is priced, said."""
    from mdot_jax import RequestError, TrainingJob, predict

    tiny = dict(model_type="roberta", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, vocab_size=64, max_position_embeddings=34)
    (tmp_path / "roberta.json").write_text(json.dumps(tiny))
    job = TrainingJob(model=str(tmp_path / "roberta.json"), batch_size=2, seq_len=32,
                      device="h100-sxm")
    assert predict(job).iteration_ms > 0  # its 34 rows hold 32 positions (padding index 1)
    for seq_len in (33, 64):  # 33: within max_position_embeddings, past the table
        with pytest.raises(RequestError, match=rf"^seq_len {seq_len}: past the 32 positions "
                           r"model 'roberta' has \(a table of them, read by node "
                           r"'.*position_embeddings/Gather'"):
            predict(dataclasses.replace(job, seq_len=seq_len))
    (tmp_path / "llama.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, vocab_size=64, max_position_embeddings=32)))
    p = predict(dataclasses.replace(job, model=str(tmp_path / "llama.json"), seq_len=64))
    assert any("past its max_position_embeddings (32)" in w for w in p.warnings)


def test_llama4s_experts_route_balanced_not_every_token_through_every_expert():
    """transformers' Llama4TextMoe runs every expert on every token (its router's scores zero
    the rest): Llama 4 Scout was priced at 16x its experts' work, and said to be no mixture of
    experts at all (`ep` refused). Now balanced routing, as its training code runs it, and the
    prediction says what transformers' own class does."""
    import torch
    import transformers

    from converters import convert, from_hf_config
    from mdot_jax.serving.model_source import config_said

    fields = dict(model_type="llama4_text", hidden_size=64, intermediate_size=128,
                  intermediate_size_mlp=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256, num_local_experts=8,
                  num_experts_per_tok=1, interleave_moe_layer_step=1)
    seq = convert(from_hf_config(fields, seq_len=32), batch_size=2, fuse=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**fields))
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert seq.meta["experts"] == dict(experts=8, top_k=1, layers=2, params=2 * 8 * 3 * 64 * 128,
                                       every="Llama4TextMoe")
    gemms = [i for i, n in enumerate(seq.node_names)
             if "experts" in n and seq.op_names[i] == "MatMul"]
    assert gemms and all(seq.config[i][4:6].tolist() == [8, 8] for i in gemms)  # 64 tokens / 8
    assert any("runs every expert on every token (8x" in s for s in config_said(seq))


def test_a_heterogeneous_configs_windows_are_its_layers():
    """transformers' heterogeneous configs (NeoMME's, Dots3's) refuse to read a per-layer field
    on the whole config (`AmbiguousGlobalPerLayerAttributeError`, a RuntimeError): reading
    `sliding_window` crashed NeoMME's export. A model whose code builds no causal
    sliding-window mask (create_sliding_window_causal_mask: this file names it) says none;
    one that does, each layer's."""
    from types import SimpleNamespace

    from converters.hf_config import _windows

    class Heterogeneous:
        num_hidden_layers = 3
        per_layer_config = [SimpleNamespace(sliding_window=w) for w in (8, None, 8)]

        @property
        def sliding_window(self):
            raise RuntimeError("'sliding_window' is a per-layer attribute")

    class Model:  # its code (this file) builds sliding-window masks
        pass

    assert _windows(Model(), Heterogeneous()) == [8, 0, 8]
    Model.__module__ = "json"  # code that builds none: nothing read
    assert _windows(Model(), Heterogeneous()) == []


def test_the_defaults_said_of_a_heterogeneous_config_skip_its_per_layer_fields():
    """Dots3's default config crashed its export with a traceback
    (`AmbiguousGlobalPerLayerAttributeError`) reading `num_attention_heads` for the note of
    the shape fields transformers' defaults filled in: a per-layer field is its layers', not
    said."""
    from converters.hf_fields import defaulted

    class Heterogeneous:
        hidden_size, num_hidden_layers, vocab_size = 64, 3, 512

        @property
        def num_attention_heads(self):
            raise RuntimeError("'num_attention_heads' is a per-layer attribute")

    assert defaulted(Heterogeneous(), {"hidden_size": 64}) == dict(num_hidden_layers=3,
                                                                   vocab_size=512)


def test_a_model_whose_zero_weights_fail_its_forward_traces_with_its_own_initial_weights():
    """The CPU copy of a model that does not trace on the meta device held zeros, which
    D-FINE divides by (its boxes' scale: NaN boxes its loss refuses): a Hugging Face model's
    copy is traced once more with its own initial weights (`init_weights`)."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.scale = torch.nn.Parameter(torch.ones(1), requires_grad=False)

        def init_weights(self):
            self.scale.fill_(4.0)

        def forward(self, x):
            boxes = self.linear(x) / self.scale
            if not torch.isfinite(boxes).all():  # `.item()`: not on the meta device
                raise ValueError("boxes must be finite")
            return boxes.sum()

    with torch.device("meta"):
        net = Scaled()
    graph = from_torch(net, torch.zeros(2, 4))
    assert "Div" in {n.op_type for n in graph.graph.node}
    assert next(net.parameters()).is_meta
    del Scaled.init_weights  # a model without one says what failed, in one line
    with torch.device("meta"):
        plain = Scaled()
    with pytest.raises(ConversionError, match="boxes must be finite"):
        from_torch(plain, torch.zeros(2, 4))


def test_a_top_k_of_more_than_its_tensor_holds_says_what_to_change():
    """RF-DETR's config at 224 px: its 300 queries are a top-k of the image's 256 tokens,
    refused by torch as "selected index k out of range" alone."""
    class Proposals(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.score = torch.nn.Linear(4, 1)

        def forward(self, tokens):  # [B, T, 4] -> the 8 best tokens' scores
            return self.score(tokens).squeeze(-1).topk(8, dim=1).values.sum()

    with pytest.raises(ConversionError, match="selected index k out of range; a top-k asks "
                       "for more than its tensor holds .* a larger image_size"):
        from_torch(Proposals(), torch.randn(2, 5, 4))


def test_a_config_json_naming_its_classes_by_a_number_is_one_error_through_predict(tmp_path):
    """`"architectures": 1` was read as a list before the export (a TypeError's traceback)."""
    from mdot_jax import MdotError, TrainingJob, predict

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": 1}))
    with pytest.raises(MdotError, match=r"config.json: architectures 1: expected a list"):
        predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=16, batch_size=2,
                            device="h100-sxm"))
