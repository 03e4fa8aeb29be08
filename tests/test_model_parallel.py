"""Tensor and pipeline parallelism, fused attention and the LLM front door
(`gpu.model_parallel`, `gpu.spec_sheet.fused_attention`, `mdot predict --tp/--pp`): the work
and the parameters split as Megatron splits them, the bubble shrinks with micro-batches and
virtual stages, the pipeline's memory follows its schedule, fused attention keeps no S x S
tensor, and what a model cannot take is one named error."""

import dataclasses
import json

import numpy as np
import pytest

from converters import convert
from converters.attention import attention_blocks
from mdot_jax import RequestError, TrainingJob, predict
from mdot_jax.cli import main
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.model_parallel import shard, width
from mdot_jax.gpu.spec_sheet import load_step_model, price

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = dict(model_type="gpt2", n_layer=8, n_embd=256, n_head=8, n_positions=256,
              vocab_size=1024)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """An 8-layer GPT-2 config.json, and its sequence at batch 4 x 256 tokens."""
    root = tmp_path_factory.mktemp("gpt")
    (root / "config.json").write_text(json.dumps(CONFIG))
    from converters import from_hf_config

    seq = convert(from_hf_config(CONFIG, seq_len=256), batch_size=4, fuse=True)
    return root / "config.json", seq


def _job(gpt, **fields):
    return TrainingJob(**{"model": gpt[1], "batch_size": 4, "device": "h100-sxm",
                          "precision": "amp-bf16", "optimizer": "adamw", **fields})


def test_a_language_models_defaults_and_an_unusual_node_are_said(gpt):
    """Without precision or optimizer, a language model is priced at fp32 with SGD, as any model
    is; both defaults are said, with the values language models train with. More GPUs in a
    node than an HGX board holds are priced as asked, and said."""
    said = predict(_job(gpt, precision=None, optimizer="sgd")).warnings
    assert any(w.startswith("precision: fp32, the default") for w in said)
    assert any(w.startswith("optimizer: sgd; language models") for w in said)
    said = predict(_job(gpt, gpus=8)).warnings
    assert not any(w.startswith(("precision:", "optimizer:", "gpus ")) for w in said)
    said = predict(_job(gpt, gpus=16, nodes=2)).warnings
    assert "gpus 16: priced as 16 GPUs in one node; HGX boards and DGX systems hold 8: give " \
        "gpus 8 and nodes 4 for such nodes" in said


def test_tensor_parallel_splits_the_gemms_heads_and_weights_not_the_residual_stream(gpt):
    seq = gpt[1]
    assert width(seq) == 256
    half = shard(seq, 2)
    names = seq.op_names
    gemm = np.isin(names, ["Gemm", "MatMul"])
    flops, split = seq.column("fwd_flops"), half.column("fwd_flops")
    assert split[gemm].sum() == pytest.approx(flops[gemm].sum() / 2, rel=1e-6)
    norms = names == "LayerNormalization"
    assert np.array_equal(split[norms], flops[norms])  # replicated
    assert shard(seq, 2, sequence_parallel=True).column("fwd_flops")[norms].sum() == \
        pytest.approx(flops[norms].sum() / 2)
    embeddings = seq.params - 8 * 2 * 256 * 2 - 2 * 256  # all but the layers' norms
    assert half.params == pytest.approx(seq.params - embeddings / 2, rel=0.01)
    assert shard(seq, 1) is seq
    # one split of one model is made once (a plan prices it on every GPU asked)
    assert shard(seq, 2) is half and shard(seq, 4) is not half
    assert shard(seq, 2, sequence_parallel=True) is not half
    # a block's scores, mask and softmax hold its heads: split, though their rows are as long
    # as the model is wide here (256 keys, 256 features), which once kept them whole
    from converters.attention import attention_blocks

    blocks = attention_blocks(seq)
    inner = [i for b in blocks for i in b.inner if names[i] == "Softmax"]
    assert len(inner) == 8
    by_heads = shard(seq, 2, blocks=blocks).column("fwd_flops")
    assert by_heads[inner].sum() == pytest.approx(flops[inner].sum() / 2)


def test_a_config_exports_its_loss_priced_over_the_vocabulary_and_split_by_tp(gpt):
    """What a causal LM trains on: the cross-entropy of its logits ([tokens, vocabulary]),
    a row-wise kernel of vocabulary-long rows; tensor parallelism splits the vocabulary."""
    from mdot_jax.gpu.classify import classify

    seq = gpt[1]
    loss = int(np.flatnonzero(seq.op_names == "SoftmaxCrossEntropyLoss")[0])
    c, load = seq.config[loss], seq.load[loss]
    assert classify("SoftmaxCrossEntropyLoss", c, load) == ("softmax", "softmax", (1024, 1024))
    assert load[0] == 6 * 4 * 256 * 1024  # 6 FLOPs a logit
    assert not seq.unknown_ops
    split = shard(seq, 4)
    assert classify("SoftmaxCrossEntropyLoss", split.config[loss], split.load[loss])[2] == \
        (1024, 256)


def test_pipeline_bubble_memory_and_schedules(gpt):
    one = predict(_job(gpt, gpus=4, pp=4, grad_accum=4))
    many = predict(_job(gpt, gpus=4, pp=4, grad_accum=32))
    assert one.phases["bubble"] / one.iteration_ms > many.phases["bubble"] / many.iteration_ms
    # uniform stages: the bubble is (P - 1) / (m + P - 1) of the iteration, give or take the
    # embedding and the head on the end stages
    assert 0.5 * 3 / 7 < one.phases["bubble"] / one.iteration_ms < 1.5 * 3 / 7
    gpipe = predict(_job(gpt, gpus=4, pp=4, grad_accum=32, schedule="gpipe"))
    inter = predict(_job(gpt, gpus=4, pp=4, grad_accum=32, schedule="interleaved"))
    assert gpipe.memory_gb > many.memory_gb  # all micro-batches in flight, not P
    assert inter.phases["bubble"] < many.phases["bubble"]
    for p in (one, many, gpipe, inter):
        assert 0 < p.scaling_efficiency <= 1 and 0 < p.mfu < 1
        assert p.iteration_ms == pytest.approx(sum(p.phases.values()))
        assert p.global_batch == 4 * p.grad_accum  # one replica
    assert any("pipeline stages" in w for w in many.warnings)


def test_a_tied_embeddings_copies_on_two_stages_sum_their_gradients(gpt):
    """GPT-2 ties its embedding and head: with stages, the first and the last hold a copy each
    and all-reduce its fp32 gradient once an iteration (Megatron's embedding group): over
    NVLink in a node, over a GPU's share of the network across nodes. No stages: nothing."""
    from mdot_jax.gpu.parallel import allreduce_ms, group_link

    shared = 1024 * 256  # the vocabulary x the width, once more than the parameters
    assert gpt[1].total("params") - gpt[1].params == shared
    gpu = gpus.find("h100-sxm")
    for nodes, net in ((1, 400.0), (2, 1.0)):
        p = predict(_job(gpt, gpus=2 // nodes, nodes=nodes, pp=2, grad_accum=2,
                         **({"network_gbs": net} if nodes > 1 else {})))
        link = group_link(gpu, 2 // nodes, nodes, None, net, 2, 1)
        ms = allreduce_ms(4.0 * shared, 2, link, 1)
        assert link.name == ("nvlink" if nodes == 1 else "network")
        assert f"the gradients of the tied embedding's copies summed over the first and last " \
            f"stage {ms:.3g} ms" in next(w for w in p.warnings if "pipeline stages" in w)
    assert not any("tied" in w for w in predict(_job(gpt, gpus=2)).warnings)


def test_tensor_parallel_communicates_every_layer_and_shares_the_replicas(gpt):
    alone = predict(_job(gpt, gpus=1))
    tp = predict(_job(gpt, gpus=8, tp=2, pp=2, grad_accum=4))
    assert tp.replicas == 2 and tp.global_batch == 4 * 2 * 4
    assert tp.phases["communication"] > 0 and tp.memory_gb < alone.memory_gb
    nodes = predict(_job(gpt, gpus=8, nodes=2, tp=8, grad_accum=4, network_gbs=25))
    within = predict(_job(gpt, gpus=8, tp=8, grad_accum=4))
    assert nodes.phases["communication"] > within.phases["communication"]  # the DP ring leaves
    note = next(w for w in within.warnings if "tensor parallel" in w)  # no pipeline to speak of
    assert "bubble" not in within.phases and "pipeline" not in note and "bubble" not in note
    # sequence parallelism's all-gather and reduce-scatter move the all-reduce's bytes (at tp
    # 8 over 4 x 256 tokens it was "math domain error": [4, 256] token ids cut to 128 elements
    # were priced as 0 rows of 256)
    cut = predict(_job(gpt, gpus=8, tp=8, grad_accum=4, sequence_parallel=True))
    assert cut.phases["communication"] == pytest.approx(within.phases["communication"])


def test_context_parallel_cuts_each_sequence_and_passes_keys_round_a_ring(gpt, tmp_path):
    """cp 2: each GPU runs half of every sequence, its attention over all the keys (the cut
    model's FLOPs twice over are the whole one's), fewer activations; the two GPUs are one
    replica (the global batch and tokens as on one GPU); the ring's sends hide behind attention
    over NVLink, not over a slow network; what cannot be cut is one named error."""
    from converters import from_hf_config
    from mdot_jax.gpu.model_parallel import whole_keys

    cut = convert(from_hf_config(CONFIG, seq_len=128), batch_size=4, fuse=True)
    keys = whole_keys(cut, attention_blocks(cut), 2)
    assert 2 * keys.total("fwd_flops") == pytest.approx(gpt[1].total("fwd_flops"), rel=0.02)
    assert keys.params == gpt[1].params
    config = dict(model=str(gpt[0]), seq_len=256, batch_size=4, device="h100-sxm",
                  precision="amp-bf16", optimizer="adamw")
    one, two = predict(TrainingJob(**config)), predict(TrainingJob(**config, gpus=2, cp=2))
    assert (two.replicas, two.global_batch, two.tokens, two.cp) == (1, 4, 256, 2)
    assert two.memory_gb < one.memory_gb and 0 < two.mfu <= 1
    assert two.phases["forward"] < one.phases["forward"]
    note = next(w for w in two.warnings if "context parallel over 2 GPUs" in w)
    assert "over nvlink" in note
    far = predict(TrainingJob(**config, gpus=1, nodes=2, cp=2, network_gbs=0.01))
    assert far.phases["communication"] > two.phases["communication"] + 1.0
    for fields, needle in ((dict(seq_len=250, gpus=2, cp=2), "not a multiple of 2 x cp"),
                           (dict(gpus=3, cp=2), r"tp x pp x cp \(1 x 1 x 2\) does not divide"),
                           (dict(gpus=2, cp=2, ep=2), "with ep")):
        with pytest.raises(RequestError, match=needle) as e:
            predict(TrainingJob(**dict(config, **fields)))
        assert e.value.field == "cp"
    with pytest.raises(RequestError, match="cp: give seq_len"):
        predict(_job(gpt, gpus=2, cp=2))  # a converted sequence cannot be cut again
    import onnx
    from onnx_builders import conv_bn_relu

    onnx.save(conv_bn_relu(), tmp_path / "cnn.onnx")  # said of cp, not of the cut seq_len
    with pytest.raises(RequestError, match="cp: the model has no token-id input"):
        predict(TrainingJob(**dict(config, model=str(tmp_path / "cnn.onnx"), gpus=2, cp=2)))


@pytest.mark.parametrize("config,expected", [
    (dict(model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
          num_attention_heads=8, num_key_value_heads=2, vocab_size=1024), (8, 2, 32)),
    pytest.param(dict(model_type="falcon", hidden_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True,
                      vocab_size=1024), (8, 2, 32), marks=pytest.mark.slow),
    pytest.param(dict(model_type="olmo2", hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                      vocab_size=1024), (8, 2, 32), marks=pytest.mark.slow),  # QK norm
    (CONFIG, (8, 8, 32)),  # GPT-2: one projection of queries, keys and values
])
def test_key_value_heads_are_read_from_the_projections(config, expected, tmp_path):
    """Grouped-query attention: the keys' projection is the narrowest the scores read (Llama's
    k_proj, Falcon's fused one as wide as heads + 2 x KV heads); tensor parallelism must divide
    the KV heads as Megatron asserts (Llama: 8 heads but 2 KV heads, tp 4 refused); the ring
    of context parallelism sends the KV heads' keys and values, not the model's width."""
    from converters import from_hf_config
    from mdot_jax.gpu.model_parallel import heads

    seq = convert(from_hf_config(config, seq_len=128), batch_size=2, fuse=True)
    assert {heads(seq, b) for b in attention_blocks(seq)} == {expected}
    if expected[1] == expected[0]:
        return
    (tmp_path / "config.json").write_text(json.dumps(config))
    job = dict(model=str(tmp_path / "config.json"), seq_len=128, batch_size=2,
               device="h100-sxm", precision="amp-bf16", gpus=4)
    with pytest.raises(RequestError, match="^tp 4: does not divide the model's 2 key-value"):
        predict(TrainingJob(**job, tp=4))
    note = next(w for w in predict(TrainingJob(**job, cp=4)).warnings if "context par" in w)
    kv = 2 * 2 * 128 / 4 * 2 * 32 * 2  # K and V of a GPU's piece: 2 KV heads of 32, bf16
    assert f"({kv / 1e6:.3g} MB)" in note, note


def test_the_operators_update_is_the_one_a_gpu_runs(gpt):
    """`--top`'s optimizer row is the update one GPU runs: its shard under FSDP, its stage's
    parameters in a pipeline (it was the whole model's, 8x the phase under FSDP on 8 GPUs)."""
    for fields in (dict(gpus=8, strategy="fsdp"), dict(gpus=2, pp=2, grad_accum=2)):
        p = predict(_job(gpt, operators=True, **fields))
        update = [o for o in p.operators if o["type"] == "optimizer"]
        assert len(update) == 1 and update[0]["ms"] == pytest.approx(p.phases["update"])


def test_data_parallel_replicas_are_tp_ranks_apart_as_megatron_orders_them(gpt):
    """tp 2 x pp 4 x 4 replicas on 4 nodes of 8: Megatron's order (tp, then dp, then pp) puts
    a stage's 4 replicas, 2 ranks apart, in one node: their gradients reduce over NVLink, not
    the network (they were priced tp x pp = 8 ranks apart, one a node)."""
    job = _job(gpt, gpus=8, nodes=4, tp=2, pp=4, grad_accum=4, network_gbs=1.0)
    p = predict(job)
    note = next(w for w in p.warnings if "gradient all-reduce" in w)
    assert "from the nvlink bandwidth" in note, note
    far = predict(dataclasses.replace(job, pp=2))  # 8 replicas, 2 apart: over 2 nodes
    assert "from the network bandwidth" in next(
        w for w in far.warnings if "gradient all-reduce" in w)


@pytest.mark.parametrize("fields,field,needle", [
    (dict(gpus=3, tp=3), "tp", "does not divide the model's 8 attention heads"),
    (dict(gpus=16, pp=16), "pp", "16 stages are more than the model's 8 layers"),
    (dict(gpus=4, pp=4, schedule="interleaved", grad_accum=6), "schedule", "multiple of pp"),
    (dict(gpus=2, pp=2, schedule="interleaved", virtual_stages=8, grad_accum=2), "pp",
     "x 8 virtual stages"),
    (dict(gpus=8, ep=2), "ep", "the model has no experts to split"),
])
def test_a_plan_the_model_cannot_take_is_one_named_error(gpt, fields, field, needle):
    with pytest.raises(RequestError) as e:
        predict(_job(gpt, **fields))
    assert e.value.field == field and needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("fields,field,words", [(dict(pp=2), "pp", "not pipeline parallel"),
                                              (dict(cp=2), "cp", "not context parallel")])
def test_an_encoder_decoder_is_not_split_into_stages_or_sequence_pieces(fields, field, words,
                                                                       tmp_path):
    """T5's decoder layers attend twice (themselves, the encoder): its blocks are no layers
    to cut into stages, and ring attention cuts no encoder's keys; tensor parallel prices."""
    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="t5", d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
        vocab_size=512)))
    job = TrainingJob(model=str(tmp_path / "config.json"), seq_len=64, batch_size=2,
                      device="h100-sxm", gpus=4, precision="amp-bf16")
    with pytest.raises(RequestError) as e:
        predict(dataclasses.replace(job, **fields))
    assert e.value.field == field and "2 of its 6 attention blocks attend to an encoder's states" \
        in str(e.value) and words in str(e.value)
    assert predict(dataclasses.replace(job, tp=2)).iteration_ms > 0
    # its layers are 2 + 2 (a decoder layer's two blocks are one layer): checkpointed, and
    # FSDP's units (the layers and the root)
    p = predict(dataclasses.replace(job, strategy="fsdp", activation_checkpointing="full"))
    assert any("activation checkpointing over 4 layers" in w for w in p.warnings)
    assert any("in 5 units (its layers and the root)" in w for w in p.warnings)


@pytest.mark.parametrize("config,named", [
    (dict(model_type="mpt", d_model=64, n_layers=2, n_heads=4, max_seq_len=128,
          vocab_size=512), "as transformers' MptForCausalLM does"),
    (dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
          num_attention_heads=4, vocab_size=512), None),
])
def test_the_attention_note_names_a_config_class_that_computes_attention_itself(
        config, named, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=64, batch_size=2,
                            device="h100-sxm", precision="amp-bf16"))
    note = next(w for w in p.warnings if w.startswith("attention: flash ("))
    assert (named in note) if named else ("as transformers'" not in note)


def test_layers_that_stages_do_not_divide_split_unevenly(gpt):
    """8 layers over 3 stages: 2, 3, 3 (chunk c from layer floor(8 c / 3)); the slowest stage
    has 3, and its share of the step is more than a third."""
    p = predict(_job(gpt, gpus=3, pp=3, grad_accum=6))
    note = next(w for w in p.warnings if "pipeline stages" in w)
    assert "3 pipeline stages (1f1b, 6 micro-batches): 3 layers on the slowest stage" in note
    even = predict(_job(gpt, gpus=4, pp=4, grad_accum=6))
    assert p.iteration_ms > even.iteration_ms  # 3 layers a stage at most, against 2


def test_a_model_without_token_ids_counts_its_heads_and_tokens_from_its_attention():
    """A ViT-like graph (float input [batch, positions, width], one head): the batch is not
    taken for heads, the tokens are batch x positions (not 1)."""
    from onnx_builders import attention

    from mdot_jax.gpu.model_parallel import tokens_of

    seq = convert(attention(batch=8, seq=8, dim=16), batch_size=8, fuse=True)
    assert tokens_of(seq, attention_blocks(seq)) == 8 * 8
    with pytest.raises(RequestError, match="^tp 2: does not divide the model's 1 attention"):
        predict(TrainingJob(model=seq, batch_size=8, device="h100-sxm", gpus=2, tp=2))


def test_fused_attention_is_causal_cheaper_and_keeps_no_scores(gpt):
    seq, h100, model = gpt[1], gpus.find("h100-sxm"), load_step_model()
    blocks = attention_blocks(seq)
    assert len(blocks) == 8 and all(b.causal for b in blocks)
    eager = price(seq, h100, model, precision="amp-bf16", attention="eager")
    flash = price(seq, h100, model, precision="amp-bf16", attention="flash")
    assert flash.iteration_ms < eager.iteration_ms and flash.memory_gb < eager.memory_gb
    scores = 4 * 8 * 256 * 256 * 2  # one layer's S x S at bf16
    assert eager.memory_gb - flash.memory_gb > 8 * scores / 1e9
    assert any("fused kernels (8 causal)" in w for w in flash.warnings)


@pytest.mark.parametrize("config,tokens", [
    (dict(CONFIG, n_layer=2, n_embd=64, n_head=4, n_positions=1024, vocab_size=256), 1024),
    # SDPA's is_causal, which the exporter writes as a mask built from the shapes a layer
    # (past the size the conversion folds into a constant)
    (dict(model_type="llama", hidden_size=64, intermediate_size=64, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
          max_position_embeddings=2048), 1100)])
def test_fused_attention_has_no_scores_in_its_working_set_either(config, tokens):
    """Nor the causal mask an export builds for SDPA's `is_causal` (`causal_mask`)."""
    from converters import from_hf_config
    from converters.attention import causal_mask
    from mdot_jax.serving.memory import step_memory

    seq = convert(from_hf_config(config, seq_len=tokens), batch_size=1, fuse=True)
    head = tokens * tokens * 2  # one head's S x S at bf16
    eager = step_memory(seq, "amp-bf16", "adamw")
    flash = step_memory(seq, "amp-bf16", "adamw", fused=attention_blocks(seq))
    assert eager.working >= 2 * 4 * head and flash.working < head  # the backward's transients
    masks = [causal_mask(seq, b) for b in attention_blocks(seq)]
    assert all(masks) == (config["model_type"] == "llama")


def test_megatron_runs_no_casts_a_fused_softmax_and_a_fused_update(gpt):
    seq, a100, model = gpt[1], gpus.find("a100-sxm-80gb"), load_step_model()
    eager, megatron = (price(seq, a100, model, precision="amp-fp16", optimizer="adam",
                             attention="eager", framework=f, host_ms=0.0)  # kernels alone:
                       for f in ("pytorch", "megatron"))  # each framework has its own host
    ms = [{o["type"]: 0.0 for o in p.operators} for p in (eager, megatron)]
    for d, p in zip(ms, (eager, megatron)):
        for o in p.operators:
            d[o["type"]] += o["ms"]
    # the mask and its guards live inside Megatron's softmax kernel, which reads half tensors
    assert "IsNaN" in ms[0] and "IsNaN" not in ms[1]
    rest = [sum(v for k, v in d.items() if k not in ("Gemm", "MatMul", "optimizer"))
            for d in ms]
    assert rest[1] < rest[0]
    assert ms[0]["casts"] > 0 and "casts" not in ms[1]  # no weight is cast
    assert ms[1]["Gemm"] == pytest.approx(ms[0]["Gemm"])  # the GEMMs themselves alike
    assert megatron.phases["update"] == pytest.approx(eager.phases["update"] * 4 / 8)
    assert any("Megatron-LM's fused optimizer" in w for w in megatron.warnings)
    with pytest.raises(RequestError) as e:
        predict(_job(gpt, precision="fp32", framework="megatron"))
    assert e.value.field == "framework" and "amp-fp16, amp-bf16" in str(e.value)


def test_megatron_reduces_the_gradients_after_the_backward_in_its_fp16(gpt):
    """Megatron-LM all-reduces the data-parallel gradients once the backward is done
    (overlap_grad_reduce off by default), in the model's fp16 at fp16 and in fp32 at bf16, from
    the buffer that holds them; PyTorch's DDP hides its fp32 buckets, a copy of the gradients,
    behind the backward."""
    import re

    said = {}
    for framework, precision in (("pytorch", "amp-fp16"), ("megatron", "amp-fp16"),
                                 ("megatron", "amp-bf16")):
        p = predict(_job(gpt, gpus=8, framework=framework, precision=precision))
        note = next(w for w in p.warnings if "gradient all-reduce" in w)
        said[framework, precision] = [float(x) for x in re.search(
            r"\(([\d.e+-]+) ms, ([\d.e+-]+) ms of it hidden", note).groups()]
    (torch_ms, torch_hidden), fp16, bf16 = said.values()
    assert torch_hidden > 0 and fp16[1] == bf16[1] == 0  # nothing hidden under Megatron
    assert bf16[0] == pytest.approx(torch_ms)  # fp32 gradients, as PyTorch's
    buckets = -(-4 * gpt[1].params // (25 * 2 ** 20))  # DDP's 25 MB of fp32 gradients
    latency = buckets * 2 * (8 - 1) * 3.5e-3  # ms: the ring's steps over NVLink
    assert fp16[0] - latency == pytest.approx((bf16[0] - latency) / 2, rel=0.02)  # half the bytes
    # PyTorch's DDP keeps a bucket copy of the fp32 gradients; Megatron's buffer is them
    for framework, copy in (("pytorch", 4e-9 * gpt[1].params), ("megatron", 0.0)):
        one, eight = (predict(_job(gpt, gpus=n, framework=framework, precision="amp-fp16"))
                      for n in (1, 8))
        assert eight.memory_gb - one.memory_gb == pytest.approx(copy, abs=1e-6)


def test_megatron_keeps_a_half_model_beside_fp32_master_weights(gpt):
    """Megatron-LM's bytes a parameter with Adam (its distributed optimizer's guide): 18 at
    bf16 (half model, fp32 master weights, fp32 main gradients, two moments), 16 at fp16 (the
    gradients in fp16), PyTorch's 16 under autocast; its distributed optimizer (zero1) shards
    the master weights with the moments: 6 + 12 / d at bf16. With pipeline stages too."""
    params = gpt[1].params
    mem = {(f, pr, s, pp): predict(_job(gpt, gpus=8, framework=f, precision=pr, strategy=s,
                                        pp=pp, grad_accum=pp)).memory_gb
           for f, pr in (("pytorch", "amp-bf16"), ("megatron", "amp-bf16"),
                         ("megatron", "amp-fp16")) for s in ("ddp", "zero1") for pp in (1, 2)}
    for pp in (1, 2):
        bf16, fp16 = (mem["megatron", pr, "ddp", pp] for pr in ("amp-bf16", "amp-fp16"))
        held = (bf16 - fp16) / 2e-9  # a GPU's parameters: fp32 against fp16 gradients
        assert held == pytest.approx(params, rel=1e-6) if pp == 1 else \
            0.3 * params < held < 0.8 * params  # a stage holds about half
        if pp == 1:  # PyTorch's DDP holds fp32 weights and a bucket copy of the gradients,
            # and autocast a half copy of each weight a GEMM reads (not the position table's,
            # nor the 17 layer norms' weights and biases)
            copied = params - 256 * 256 - 17 * 2 * 256
            assert mem["pytorch", "amp-bf16", "ddp", 1] - fp16 == pytest.approx(
                4e-9 * params + 2e-9 * copied)
        d = 8 // pp  # the distributed optimizer: 12 of 18 bytes sharded over d replicas
        assert bf16 - mem["megatron", "amp-bf16", "zero1", pp] == pytest.approx(
            12e-9 * held * (d - 1) / d - min(25 * 2 ** 20, 4 * held) / 1e9, rel=1e-6)  # a
        # bucket in flight, or all of a GPU's parameters where they fill none


def test_megatrons_distributed_optimizer_gathers_its_half_type_model(gpt):
    """zero1's all-gather of the updated weights moves their width: PyTorch's fp32 weights,
    Megatron-LM's half-type model (its fp32 master weights stay sharded); the reduce-scatter
    the gradients' (fp32 at bf16)."""
    import re

    said = {}
    for framework in ("pytorch", "megatron"):
        note = next(w for w in predict(_job(gpt, gpus=8, framework=framework,
                                            strategy="zero1")).warnings
                    if "reduce-scatter and all-gather" in w)
        said[framework] = float(re.search(r"over 8 GPUs \(([\d.e+-]+) ms", note).group(1))
    buckets = -(-4 * gpt[1].params // (25 * 2 ** 20))
    latency = 2 * buckets * (8 - 1) * 3.5e-3  # ms: the ring steps of both collectives
    assert said["megatron"] - latency == pytest.approx(0.75 * (said["pytorch"] - latency),
                                                       rel=0.05)  # 4 + 2 bytes against 4 + 4


@pytest.mark.slow
def test_a_plan_keeps_the_hosts_launch_gaps(gpt, tmp_path):
    shipped = load_step_model()  # shared: copied, never changed
    slow_host = dataclasses.replace(shipped, info=dict(shipped.info, host_ms_per_kernel=1.0))
    slow_host.save(tmp_path)  # the host issues a kernel a millisecond
    gaps = [predict(_job(gpt, gpus=2, checkpoint=str(tmp_path), **plan)).phases
            .get("launch gaps", 0.0) for plan in ({}, {"tp": 2})]
    assert gaps[0] > 100 and gaps[1] > 100  # hundreds of kernels, each waiting on the host


@pytest.mark.parametrize("gpu,precision,chosen", [("h100-sxm", "amp-bf16", "flash"),
                                                  ("a100-sxm-80gb", "amp-fp16", "flash"),
                                                  ("h100-sxm", "fp32", "eager"),
                                                  ("v100-sxm2-32gb", "amp-fp16", "eager")])
def test_the_default_attention_is_what_pytorch_runs_and_says_why(gpt, gpu, precision, chosen):
    p = predict(_job(gpt, device=gpu, precision=precision))
    assert any(w.startswith(f"attention: {chosen} (") for w in p.warnings)


@pytest.mark.parametrize("gpu,precision,noted", [("v100-sxm2-32gb", "amp-fp16", True),
                                                 ("h100-sxm", "fp32", True),
                                                 ("h100-sxm", "amp-bf16", False)])
def test_flash_asked_where_pytorch_cannot_run_it_says_what_runs(gpt, gpu, precision, noted):
    p = predict(_job(gpt, device=gpu, precision=precision, attention="flash"))
    said = [w for w in p.warnings if w.startswith("attention: flash as asked")]
    assert bool(said) == noted and all("memory-efficient kernel" in w for w in said)


def test_a_hugging_face_config_needs_its_tokens(gpt, capsys):
    with pytest.raises(RequestError, match="seq_len: required with a Hugging Face config"):
        predict(TrainingJob(model=str(gpt[0]), batch_size=4, device="h100-sxm"))
    assert main(["convert", str(gpt[0]), "--batch-size", "4"]) == 2
    assert capsys.readouterr().err.startswith("mdot: error: --seq-len: required")


def test_a_hugging_face_config_converts_as_it_predicts(gpt, capsys):
    assert main(["convert", str(gpt[0]), "--seq-len", "256", "--batch-size", "4",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == gpt[0].parent.name and summary["params"] == gpt[1].params
    assert summary["inputs"] == {"input_ids": [4, 256]} and summary["flops"] == gpt[1].flops


@pytest.mark.slow
def test_a_hugging_face_config_is_a_model(gpt, capsys):
    config = str(gpt[0])
    p = predict(TrainingJob(model=config, seq_len=256, batch_size=4, device="h100-sxm",
                            precision="amp-bf16", optimizer="adamw"))
    assert p.iteration_ms == pytest.approx(predict(_job(gpt)).iteration_ms)
    assert p.tokens == 256 and p.tokens_per_s > 0
    assert main(["predict", config, "--seq-len", "256", "--batch-size", "2", "--device",
                 "h100-sxm", "--gpus", "8", "--tp", "2", "--pp", "2", "--grad-accum", "8",
                 "--precision", "amp-bf16"]) == 0
    out = capsys.readouterr().out
    assert "each of 2 data-parallel replicas: 2-way tensor parallel x 2 pipeline stages, 8 " \
        "micro-batches of 2, 32 samples an iteration; memory per GPU" in out
    assert "bubble" in out


def test_selective_checkpointing_keeps_no_scores_in_a_pipeline_either(gpt):
    eager = dict(attention="eager", gpus=2, pp=2, grad_accum=4)
    plain = predict(_job(gpt, **eager))
    selective = predict(_job(gpt, **eager, activation_checkpointing="selective"))
    full = predict(_job(gpt, **eager, activation_checkpointing="full"))
    assert plain.memory_gb > selective.memory_gb > full.memory_gb


def test_what_was_never_measured_carries_no_band(gpt):
    """A pipeline, tensor parallelism or a fused attention kernel: priced by rules, never
    measured, so no 80% band is claimed for them (fp32, where the step itself has one)."""
    plain = predict(_job(gpt, precision="fp32", attention="eager"))
    assert plain.interval_ms is not None
    for fields in (dict(gpus=2, pp=2, grad_accum=4), dict(gpus=2, tp=2), dict(attention="flash")):
        assert predict(_job(gpt, precision="fp32", **fields)).interval_ms is None, fields


@pytest.mark.parametrize("plan", [dict(gpus=8, strategy="fsdp"), dict(gpus=4, tp=2, pp=2,
                                                                       grad_accum=4)])
def test_a_forward_and_backward_alone_has_no_update_and_no_optimizer_state(gpt, plan):
    train, fwd_bwd = (predict(_job(gpt, step=step, **plan)) for step in ("train", "fwd-bwd"))
    assert train.phases["update"] > 0 and "update" not in fwd_bwd.phases
    assert fwd_bwd.iteration_ms == pytest.approx(sum(fwd_bwd.phases.values()))
    # AdamW at amp-bf16: 16 bytes a parameter; without its update, 8 (weights, gradients)
    states = train.memory_parts["model_states"], fwd_bwd.memory_parts["model_states"]
    assert states[1] == pytest.approx(states[0] / 2, rel=0.02)
    assert any("no adamw update, so no optimizer state" in w for w in fwd_bwd.warnings)


def test_a_sharded_graph_of_billions_holds_no_weight_twice_that_it_did_not():
    """A GPU's share of a 10B graph's parameters was summed in float32, which misses thousands:
    the shortfall read as a weight two pipeline stages hold, and Qwen3-235B (untied) was said
    to sum "the gradients of the tied embedding's copies" over its first and last stage."""
    from converters import from_hf_config
    from mdot_jax.gpu.model_parallel import shard_experts

    moe = dict(model_type="qwen3_moe", hidden_size=4096, intermediate_size=12288,
               moe_intermediate_size=1536, num_hidden_layers=2, num_attention_heads=64,
               num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
               vocab_size=151936, tie_word_embeddings=False)  # 5.7B parameters
    seq = convert(from_hf_config(moe, seq_len=32), batch_size=1, fuse=True)
    for held in (shard(seq, 4), shard_experts(shard(seq, 4), 8)):
        assert held.total("params") == held.params
