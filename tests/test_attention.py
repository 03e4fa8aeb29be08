"""Attention blocks in an operator sequence (`converters.attention`)."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_builders import attention, conv_bn_relu

from converters import ConversionError, convert, from_torch
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
        assert not b.cross  # queries and keys from one tensor (fused, rotated or not)


def test_a_cnn_has_none():
    assert attention_blocks(convert(conv_bn_relu(training=True), batch_size=2)) == []


@pytest.mark.parametrize("config,causal,batch", [
    # MPT's causal mask, folded into a constant at a short sequence, the condition of a Where
    (dict(model_type="mpt", d_model=64, n_layers=2, n_heads=4, max_seq_len=128,
          vocab_size=500, expansion_ratio=4), True, 2),
    # Gemma 2 caps its scores with a tanh before the softmax
    (dict(model_type="gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=500), True, 2),
    (dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=128, vocab_size=500), False, 2),
    # one sequence of one head: the mask as large as the scores (it was not called causal)
    (dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=1, vocab_size=500), True, 1),
    (dict(model_type="mpt", d_model=64, n_layers=2, n_heads=1, max_seq_len=128,
          vocab_size=500, expansion_ratio=4), True, 1),
    (dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=1,
          intermediate_size=128, vocab_size=500), False, 1),
])
def test_blocks_and_their_causal_masks_however_exported(config, causal, batch):
    from converters import from_hf_config

    seq = convert(from_hf_config(config, seq_len=128), batch_size=batch, fuse=True)
    blocks = attention_blocks(seq)
    assert len(blocks) == 2 and {b.causal for b in blocks} == {causal}


class _Biased(torch.nn.Module):
    """One attention block over [B, 8, 16] whose scores gain a learned relative position bias
    (a table gathered per query-key pair: Swin's, LeViT's, T5's), a causal mask kept as a
    buffer (a constant at export) and added, or zeros made in the forward (T5's
    cross-attention)."""

    def __init__(self, bias: str):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        idx = torch.arange(8)[:, None] - torch.arange(8)[None, :] + 7
        self.register_buffer("idx", idx)
        self.table = torch.nn.Parameter(torch.zeros(15)) if bias == "learned" else None
        self.register_buffer("mask", torch.full((8, 8), -1e4).triu(1)[None])
        self.bias = bias

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = q @ k.transpose(1, 2)
        s = s + {"learned": lambda: self.table[self.idx], "mask": lambda: self.mask,
                 "zeros": lambda: torch.zeros(1, 8, 8)}[self.bias]()
        return s.softmax(-1) @ v


@pytest.mark.parametrize("bias,causal", [("learned", False), ("mask", True), ("zeros", False)])
def test_only_an_added_constant_that_masks_is_a_causal_mask(bias, causal):
    seq = convert(from_torch(_Biased(bias), torch.zeros(2, 8, 16)), batch_size=2, fuse=True)
    (block,) = attention_blocks(seq)
    assert block.causal is causal


@pytest.mark.parametrize("where", ["inside", "beside"])
@pytest.mark.parametrize("mask", ["causal", "padding", "none"])
def test_a_mask_folded_into_an_initializer_is_no_weight(tmp_path, where, mask):
    """torch.export folds SDPA's mask into a float initializer ([B, 1, S, S], stored inside
    the file or beside it: of 0 and the float's lowest value where keys are masked, of 0 alone
    where a batch masks nothing) and names no parameters: never a weight; causal where it masks
    keys by query, a mask handed to attention (padded: every key) where it masks the same keys
    for every query, nothing where it masks none."""
    m = attention(batch=2, seq=8, dim=16, heads=2)
    softmax = next(n for n in m.graph.node if n.op_type == "Softmax")
    softmax.input[0] = "masked"
    m.graph.node.insert(list(m.graph.node).index(softmax),
                        helper.make_node("Add", ["s", "mask"], ["masked"], name="add_mask"))
    lowest, values = np.finfo(np.float32).min, np.zeros((2, 1, 8, 8), np.float32)
    if mask == "causal":
        values = np.triu(np.full((2, 1, 8, 8), lowest, np.float32), 1)
    elif mask == "padding":
        values[..., 6:] = lowest  # the last two keys of every query
    m.graph.initializer.append(numpy_helper.from_array(values, "mask"))
    path = tmp_path / "m.onnx"
    onnx.save_model(m, path, save_as_external_data=where == "beside", location="m.data",
                    size_threshold=0)
    seq = convert(path, batch_size=2, fuse=True)
    assert seq.meta["params"] == 2 * 16 * 16 + 2 * 16  # wq, wk, the norm's scale and shift
    assert [(b.causal, b.padded) for b in attention_blocks(seq)] == \
        [(mask == "causal", mask == "padding")]


@pytest.mark.parametrize("config,seq_len,causal", [
    # T5 adds zeros to its cross-attention's scores: folded (a short sequence) or not (past
    # the loader's folding size); its decoder's causal mask is added to its learned bias
    (dict(model_type="t5", d_model=64, d_ff=128, num_layers=1, num_heads=4, d_kv=16,
          vocab_size=500), 32, {"SelfAttention": False, "EncDecAttention": False}),
    (dict(model_type="t5", d_model=64, d_ff=128, num_layers=1, num_heads=8, d_kv=8,
          vocab_size=500), 384, {"SelfAttention": False, "EncDecAttention": False}),
    (dict(model_type="bart", d_model=64, encoder_layers=1, decoder_layers=1,
          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
          decoder_ffn_dim=128, vocab_size=500), 32,
     {"self_attn": True, "encoder_attn": False}),  # (and the encoder's self_attn: False)
])
def test_an_encoder_decoders_blocks_cross_attention_and_masks(config, seq_len, causal):
    from converters import from_hf_config

    seq = convert(from_hf_config(config, seq_len=seq_len), batch_size=2, fuse=True)
    blocks = [(str(seq.node_names[b.scores]), b) for b in attention_blocks(seq)]
    assert len(blocks) == 3
    decoder = {name.split("/")[-2]: b.causal for name, b in blocks if "decoder" in name}
    assert decoder == causal
    assert [b.cross for _, b in blocks] == [False, False, True]  # encoder, decoder: self, cross


@pytest.mark.slow  # a DeepSeek config exported twice
def test_latent_attention_projected_in_two_steps_is_self_attention():
    """DeepSeek's multi-head latent attention projects its queries and keys each through a
    low-rank pair of linears (a projection, a norm, a projection) from one hidden state: self-
    attention, causal; as cross-attention it took no pipeline parallelism."""
    from converters import from_hf_config

    mla = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, vocab_size=500, q_lora_rank=48,
               kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
               n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               first_k_dense_replace=1, n_group=1, topk_group=1)
    blocks = attention_blocks(convert(from_hf_config(mla, seq_len=32), batch_size=2))
    assert len(blocks) == 2
    assert [(b.cross, b.causal) for b in blocks] == [(False, True)] * 2


def test_a_sliding_window_is_read_from_the_config_and_priced_as_the_mask_runs():
    """Gemma 3's local layers keep a sliding window, which transformers gives SDPA as a mask
    tensor once the sequence is longer: not FlashAttention but the memory-efficient kernel over
    every key (twice a causal block's work), while the model needs the window's keys alone
    (MFU's count)."""
    from converters import from_hf_config
    from converters.attention import needed
    from mdot_jax.gpu.fused import fused_attention, masked
    from mdot_jax.serving.memory import saved

    gemma = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=128, head_dim=16,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=256, max_position_embeddings=512, sliding_window=32,
                 query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"])
    seq = convert(from_hf_config(gemma, seq_len=128), batch_size=2, fuse=True)
    blocks = attention_blocks(seq)
    assert seq.meta["sliding_window"] == [32, 0]
    assert [b.window for b in blocks] == [32, 0] and all(b.causal for b in blocks)
    local, full = blocks
    assert needed(full, 128) == 0.5 and needed(local, 128) == pytest.approx(32 * 112 / 128 ** 2)
    assert needed(local, 32) == 0.5  # a window as long as the keys: causal, but masked
    assert masked(local, 32) and not masked(local, 31) and not masked(full, 128)
    flops = [sum(2 * b * m * n * k for b, m, n, k in fused_attention(seq, x)["fw"])
             for x in (local, full)]
    assert flops[0] == pytest.approx(2 * flops[1], rel=0.02)  # every key, not the causal half
    # SDPA makes the boolean mask additive in the query's type (bf16) each call and the kernel
    # keeps it for the backward: 2 x 128 x 128 of 2 bytes, the full layer none
    kept = saved(seq, blocks, 0.5) - saved(seq, [b._replace(window=0) for b in blocks], 0.5)
    assert kept[local.output] == 2 * 128 * 128 * 2 and not np.delete(kept, local.output).any()


def test_attention_with_sinks_is_a_block_each_layer_whose_heads_split():
    """gpt-oss joins each head's learned sink logit to its scores before the softmax and cuts
    it off after (Concat, Slice): no block was found, so `--tp` was refused ("the model has no
    attention blocks ... whose heads to split") and its attention priced as loose GEMMs."""
    from converters import from_hf_config
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    oss = dict(model_type="gpt_oss", hidden_size=64, intermediate_size=64, head_dim=16,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=256, num_local_experts=4, num_experts_per_tok=2, sliding_window=32,
               layer_types=["sliding_attention", "full_attention"])
    seq = convert(from_hf_config(oss, seq_len=64), batch_size=2, fuse=True)
    blocks = attention_blocks(seq)
    assert [b.window for b in blocks] == [32, 0] and all(b.causal for b in blocks)
    p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16",
                            gpus=2, tp=2))
    assert any("2-way tensor parallel" in w for w in p.warnings)


def test_the_flash_attn_package_takes_the_window_itself():
    """`attention="flash_attention_2"` (the flash-attn package): a windowed layer is priced as
    FlashAttention over its window's keys alone, holds no mask and says so; a layer without a
    window as SDPA's flash; at fp32 one error naming attention."""
    from converters import from_hf_config
    from mdot_jax import TrainingJob, predict
    from mdot_jax.errors import RequestError
    from mdot_jax.gpu.fused import fused_attention, mask_bytes
    from mdot_jax.gpu.spec_sheet import FUSED

    mistral = dict(model_type="mistral", hidden_size=64, intermediate_size=64,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=256, max_position_embeddings=512, sliding_window=32)
    seq = convert(from_hf_config(mistral, seq_len=256), batch_size=2, fuse=True)
    b = attention_blocks(seq)[0]
    local = b._replace(local=True)
    assert mask_bytes(seq, b) > 0 and mask_bytes(seq, local) == 0

    def work(block):
        return sum(x[0] * x[1] * x[2] * x[3] for x in fused_attention(seq, block)["fw"])

    assert work(local) / work(b) == pytest.approx(32 * (256 - 16) / 256 ** 2, rel=0.05)
    assert work(local._replace(window=0)) == work(b._replace(window=0))  # no window: flash's

    def step(attention, precision="amp-bf16"):
        return predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm",
                                   precision=precision, attention=attention, operators=True))

    sdpa, package = step("flash"), step("flash_attention_2")
    fused = [sum(o["ms"] for o in p.operators if o["type"] == FUSED) for p in (sdpa, package)]
    assert fused[1] < fused[0] and package.memory_gb < sdpa.memory_gb
    assert any("2 with a sliding window, the flash-attn package's" in w
               for w in package.warnings)
    with pytest.raises(RequestError, match="^attention: the flash-attn package") as e:
        step("flash_attention_2", "fp32")
    assert e.value.field == "attention"


@pytest.mark.slow
def test_a_window_is_every_layers_where_the_config_names_no_layer_types():
    """Mistral masks every layer with its `sliding_window` (none: none); a Llama, whose code
    builds no sliding-window mask, ignores the field. The prediction says what it priced."""
    from converters import from_hf_config
    from mdot_jax import TrainingJob, predict

    mistral = dict(model_type="mistral", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=256, max_position_embeddings=512)
    for model_type, window, said in (("mistral", 32, [32, 32]), ("mistral", None, None),
                                     ("llama", 32, None)):
        proto = from_hf_config(dict(mistral, model_type=model_type, sliding_window=window),
                               seq_len=64)
        assert convert(proto, batch_size=2).meta.get("sliding_window") == said
        if said:
            p = predict(TrainingJob(model=convert(proto, batch_size=2, fuse=True),
                                    batch_size=2, device="h100-sxm", precision="amp-bf16"))
            assert any("; 2 given a mask (a sliding window" in w
                       for w in p.warnings)


class _WithMask(torch.nn.Module):
    """A Hugging Face model called as its users train it: token ids and an attention mask."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


@pytest.mark.parametrize("kind,tokens,causal", [
    ("bert", 64, False), ("gpt2", 64, True),  # the mask's constant part folded at conversion
    ("gpt2", 1100, True), ("bert", 1100, False)])  # past the folding size: compared at run time
def test_a_padding_mask_is_not_a_causal_one(kind, tokens, causal):
    """An encoder exported with its attention mask gets an S x S mask made of the batch's
    padding alone: every key attended, not the causal half; a decoder's mask also compares
    queries with keys, folded or not."""
    cfg = dict(bert=transformers.BertConfig(hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=64,
                                            vocab_size=64, max_position_embeddings=2048),
               gpt2=transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64,
                                            n_positions=2048))[kind]
    model = transformers.AutoModelForMaskedLM.from_config(cfg) if kind == "bert" else \
        transformers.AutoModelForCausalLM.from_config(cfg)
    ids, mask = torch.zeros(1, tokens, dtype=torch.long), torch.ones(1, tokens, dtype=torch.long)
    graph = from_torch(_WithMask(model), (ids, mask), input_names=["input_ids", "attention_mask"])
    seq = convert(graph, batch_size=2, fuse=True)
    blocks = attention_blocks(seq)
    assert blocks and {b.causal for b in blocks} == {causal}
    # the batch's mask is handed to SDPA as a tensor: its memory-efficient kernel, every key
    assert {b.padded for b in blocks} == {True}
    if tokens == 64:
        plain = convert(from_torch(model, (ids,), input_names=["input_ids"]), batch_size=2,
                        fuse=True)
        assert {(b.causal, b.padded) for b in attention_blocks(plain)} == {(causal, False)}
        from mdot_jax import TrainingJob, predict

        job = dict(batch_size=2, device="h100-sxm", precision="amp-bf16")
        masked, unmasked = (predict(TrainingJob(model=s, **job)) for s in (seq, plain))
        assert any(f"; {len(blocks)} given a mask" in w for w in masked.warnings)
        assert not any("given a mask" in w for w in unmasked.warnings)
        assert masked.iteration_ms > unmasked.iteration_ms


def test_a_tokenizers_dict_exports_by_keyword_as_a_wrapper_does():
    """`from_torch(model, {"input_ids": ..., "attention_mask": ...})`: the inputs passed by
    name (the mask is not taken for the next positional parameter), named by their keys; a
    value that is no tensor (a flag) passed as given, no input."""
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64,
                                  use_cache=False)  # (the wrapper hides the config from_torch sets)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids, mask = torch.zeros(1, 16, dtype=torch.long), torch.ones(1, 16, dtype=torch.long)
    by_name = from_torch(model, {"input_ids": ids, "use_cache": False, "attention_mask": mask})
    wrapped = from_torch(_WithMask(model), (ids, mask),
                         input_names=["input_ids", "attention_mask"])
    assert [i.name for i in by_name.graph.input[:2]] == ["input_ids", "attention_mask"]
    seqs = [convert(g, batch_size=2, fuse=True) for g in (by_name, wrapped)]
    assert seqs[0].op_type_counts() == seqs[1].op_type_counts()
    assert {b.padded for b in attention_blocks(seqs[0])} == {True}
    with pytest.raises(ConversionError, match="no example inputs"):
        from_torch(model, {})


def test_a_learned_bias_given_to_sdpa_runs_its_memory_efficient_kernel():
    """BEiT's relative position bias, T5's: SDPA is given it as its mask, which FlashAttention
    does not take; the blocks were priced as FlashAttention."""
    class Biased(torch.nn.Module):
        def __init__(self, learned, expanded=False):
            super().__init__()
            self.qkv = torch.nn.Linear(64, 192)
            self.bias = torch.nn.Parameter(torch.zeros(4, 128, 128)) if learned else None
            self.expanded = expanded

        def forward(self, x):  # [B, 128, 64] -> [B, 4, 128, 16]
            q, k, v = self.qkv(x).view(x.shape[0], 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
            bias = self.bias.expand(x.shape[0], -1, -1, -1) if self.expanded else self.bias
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    from mdot_jax import TrainingJob, predict

    seqs = [convert(from_torch(Biased(*b), torch.randn(2, 128, 64)), batch_size=2, fuse=True)
            for b in ((True,), (False,), (True, True))]
    # expanded over the batch (as many elements as the scores): a bias still
    assert [[(b.biased, b.causal) for b in attention_blocks(s)] for s in seqs] == \
        [[(True, False)], [(False, False)], [(True, False)]]
    job = dict(batch_size=2, device="h100-sxm", precision="amp-bf16", attention="flash")
    biased, plain, expanded = (predict(TrainingJob(model=s, **job)) for s in seqs)
    assert any("; 1 given a mask" in w and "a learned bias" in w for w in biased.warnings)
    assert not any("given a mask" in w for w in plain.warnings)
    assert biased.iteration_ms > plain.iteration_ms
    assert any("; 1 given a mask" in w for w in expanded.warnings)


class _Attention(torch.nn.Module):
    """Self-attention over [B, 64, 32] (4 heads of 8): PyTorch's SDPA over the whole sequence,
    or over `pieces` of it in turn and concatenated, as transformers' SDPA path runs Qwen-VL's
    windows."""

    def __init__(self, pieces=1):
        super().__init__()
        self.qkv, self.pieces = torch.nn.Linear(32, 96), pieces

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], 64, 3, 4, 8).permute(2, 0, 3, 1, 4)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return torch.cat([sdpa(*p) for p in zip(
            *(t.split(64 // self.pieces, dim=2) for t in (q, k, v)))], dim=2)


def _priced(seq, attention):
    from mdot_jax import TrainingJob, predict

    return predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16",
                               attention=attention, operators=True))


def test_a_loop_over_a_splits_pieces_is_one_varlen_call_of_the_flash_attn_package():
    """Qwen-VL's encoder under transformers' SDPA path: the queries, keys and values split by
    window, SDPA a window, the outputs concatenated. Its flash_attention_2 path runs one varlen
    call: priced as one fused kernel of the pieces' work, without the splits and the
    concatenation, and said; SDPA a kernel a piece. Blocks no Concat joins are calls of their
    own."""
    from converters.attention import varlen
    from mdot_jax.gpu.fused import fused_attention
    from mdot_jax.gpu.spec_sheet import FUSED

    seq = convert(from_torch(_Attention(pieces=4), torch.randn(2, 64, 32)), batch_size=2,
                  fuse=True)
    blocks, left = varlen(seq, attention_blocks(seq))
    assert len(blocks) == 4 and {b.call for b in blocks} == {blocks[0].scores}
    assert sorted(str(seq.op_names[i]) for i in left) == ["Concat"] + ["Split"] * 3

    def work(*bs):
        return sum(np.prod(g) for g in fused_attention(seq, *bs)["fw"])

    assert work(*blocks) == pytest.approx(sum(work(b) for b in blocks), rel=0.05)  # cubes
    sdpa, package = _priced(seq, "flash"), _priced(seq, "flash_attention_2")
    assert [sum(o["type"] == FUSED for o in p.operators) for p in (sdpa, package)] == [4, 1]
    ran = {o["index"] for o in package.operators if "index" in o}
    assert not ran & left and package.iteration_ms < sdpa.iteration_ms
    assert any("4 looped over a split's pieces (windows, images) as 1 varlen calls" in w
               for w in package.warnings)
    whole = convert(from_torch(_Attention(), torch.randn(2, 64, 32)), batch_size=2, fuse=True)
    assert [b.call for b in varlen(whole, attention_blocks(whole))[0]] == [-1]


@pytest.mark.parametrize("asked", [None, "flash", "eager", "flash_attention_2"])
@pytest.mark.parametrize("precision,cc", [("fp32", 9.0), ("amp-bf16", 8.0), ("amp-fp16", 7.5),
                                          ("fp8", 9.0)])
def test_the_attention_chosen_is_one_a_gpu_runs_and_says_why(asked, precision, cc):
    """`serving.attention_choice.choose`: FlashAttention only at half precision from compute
    capability 8.0 (else the flash-attn package is refused), PyTorch's choice said in a note."""
    from mdot_jax.errors import RequestError
    from mdot_jax.options import ATTENTION
    from mdot_jax.serving.attention_choice import choose

    blocks = attention_blocks(convert(attention(), batch_size=2))
    half = precision != "fp32" and cc >= 8
    try:
        kernel, note = choose(asked, cc, precision, blocks, len(blocks), None)
    except RequestError as e:
        assert asked == "flash_attention_2" and not half and e.field == "attention"
        return
    assert kernel in ATTENTION and (kernel == asked if asked else kernel == (
        "flash" if half else "eager"))
    assert (note is None) == (asked == "eager" or (asked == "flash" and half))
    assert choose(None, cc, precision, [], 0, None) == ("eager", None)  # nothing to fuse
