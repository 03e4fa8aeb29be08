"""The step-memory estimate (`serving.memory`): what a CPU step holds, followed in time."""

import re

import pytest
from onnx import TensorProto, helper
from onnx_builders import model, value

from converters import convert
from mdot_jax.serving.memory import CPU_FIXED, CPU_RETENTION, live_bytes, saved, step_memory


def _chain(op, n=6, shape=(4, 256, 256)):
    """x -> `op` -> `op` -> ... (n operators, each writing one [4, 256, 256] fp32 tensor)."""
    names = ["x"] + [f"t{i}" for i in range(n)]
    nodes = [helper.make_node(op, [a, a] if op == "Add" else [a], [b], name=b)
             for a, b in zip(names, names[1:])]
    m = model(nodes, [value("x", list(shape))], [value(names[-1], None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return convert(m, fuse=True)


def test_the_forward_frees_what_no_backward_needs_and_keeps_the_rest():
    one = 4 * 256 * 256 * 4  # bytes of one output
    relu, add = _chain("Relu"), _chain("Add")
    # every Relu keeps its output for its backward: all six are live at the forward's end
    assert live_bytes(relu).activations == pytest.approx(6 * one)
    # Add keeps nothing: an output is freed once its consumer has run (at most two live)
    assert live_bytes(add).activations + live_bytes(add).gradients <= 2 * one
    # the GPU's sum form counts both chains' kept tensors the same way, never by time
    assert saved(add).sum() == 0 and saved(relu).sum() == pytest.approx(6 * one)


def _norm_after(perm):
    """x[2, 8, 32, 32] -> Transpose(perm) -> LayerNorm over the last axis."""
    shape = [[2, 8, 32, 32][p] for p in perm]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=perm),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["y"], name="norm",
                              axis=-1)]
    m = model(nodes, [value("x", [2, 8, 32, 32]), value("g", [shape[-1]]),
                      value("b", [shape[-1]])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return convert(m, fuse=True)


def test_a_permuted_view_a_backward_needs_is_a_kept_copy_on_a_cpu():
    x = 2 * 8 * 32 * 32 * 4
    channels_last = live_bytes(_norm_after([0, 2, 3, 1]))  # ConvNeXt's permute: a copy
    last_two = live_bytes(_norm_after([0, 1, 3, 2]))  # a swap of the last two axes: no copy
    assert channels_last.activations == pytest.approx(last_two.activations + x)


def test_the_cpu_estimate_is_the_live_peak_with_the_allocators_share():
    seq = _chain("Relu")
    live = live_bytes(seq)
    cpu = step_memory(seq, cpu=True)
    held = cpu.parameters + cpu.optimizer + cpu.inputs + live.total
    assert cpu.total == pytest.approx(CPU_FIXED + CPU_RETENTION * held)
    # the GPU sums every holder instead: never below the CPU's live peak
    assert step_memory(seq).total >= held
    # half-width activations under AMP
    assert live_bytes(seq, 0.5).activations == pytest.approx(live.activations / 2)


def test_a_parameter_heavy_step_peaks_in_the_update():
    """x[2, 1024] @ W[1024, 1024]: 4 MB of weights, 8 kB of activations: the peak is the
    update's (gradients + one temporary the size of the parameters for momentum SGD and
    AdamW; none for plain SGD)."""
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
              [value("x", [2, 1024]), value("w", [1024, 1024])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, fuse=True)
    w = 4.0 * seq.params
    assert live_bytes(seq, optimizer="sgd").total == pytest.approx(2 * w)
    assert live_bytes(seq, optimizer="sgd-plain").total == pytest.approx(w, rel=0.01)
    adamw = step_memory(seq, optimizer="adamw", cpu=True)
    assert adamw.optimizer == 2 * w and adamw.total > step_memory(seq, cpu=True).total
    assert adamw.peak == "the update" and adamw.activations == 0  # said so: none is live then


def test_autocast_copies_a_weight_several_gemms_share_once():
    """ALBERT's layers share their weights: autocast caches one half copy a tensor (it was
    counted at each GEMM reading it, +86% on ALBERT's measured steps); an embedding's table
    is not cast at all (a gather is no autocast operator)."""
    from mdot_jax.serving.memory import autocast_copies

    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["y"], name="fc2")]
    m = model(nodes, [value("ids", [2, 8], TensorProto.INT64), value("table", [100, 64]),
                      value("w", [64, 64])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="ids")
    seq = convert(m, fuse=True)
    assert seq.params == 100 * 64 + 64 * 64
    assert autocast_copies(seq, "amp-bf16") == 2.0 * 64 * 64
    assert autocast_copies(seq, "fp32") == autocast_copies(seq, "bf16") == 0.0


def test_a_wide_losss_fp32_tensors_are_counted_or_said():
    """A language model's cross-entropy keeps fp32 tensors the size of its scores: one GPU's
    estimate (and data parallel's) counts them in place of what it kept of the loss's input;
    a tensor-parallel estimate, which leaves them out, says them with their bytes (a GPU's
    vocabulary share); a classifier's 1,000 classes are not worth a line."""
    pytest.importorskip("transformers")
    from onnx_builders import conv_bn_relu

    from converters import from_hf_config
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving.memory import loss_bytes, loss_note, saved, step_memory

    graph = from_hf_config(dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=2,
                                vocab_size=50257, n_positions=256), seq_len=256)
    seq = convert(graph, batch_size=8, seq_len=256, fuse=True)
    scores = 8 * 256 * 50257
    kept = saved(seq, (), 1.0)
    assert 0 < 8.0 * scores - loss_bytes(seq, kept) <= 4.0 * scores  # the scores kept, at most
    fp32 = step_memory(seq)
    assert fp32.activations == pytest.approx(kept.sum() + loss_bytes(seq, kept))
    job = dict(model=seq, batch_size=8, device="h100-sxm", precision="amp-bf16")
    one = predict(TrainingJob(**job))
    assert not any(w.startswith("memory: the loss's fp32") for w in one.warnings)
    assert one.memory_parts["activations"] > 8 * scores / 1e9
    tp = predict(TrainingJob(**job, gpus=2, tp=2))
    said = [w for w in tp.warnings if w.startswith("memory: the loss's fp32")]
    assert len(said) == 1 and f"{scores // 2:,} scores" in said[0], tp.warnings
    assert "up to 0.206 GB" in loss_note(seq, 0.1, tp=4)  # a quarter of the vocabulary
    assert loss_note(seq, 100.0) is None  # under LOSS_SAID of the estimate
    cnn = convert(conv_bn_relu(training=True, size=64), batch_size=8, fuse=True)
    assert loss_note(cnn, 1e-6) is None


def test_a_predictions_memory_is_said_by_what_holds_it(tmp_path, capsys):
    """Weights, gradients and optimizer state; activations; working: summing to the total
    through every way a step is priced (sharded, bucketed, checkpointed, split in stages)."""
    pytest.importorskip("transformers")
    import json

    from mdot_jax import TrainingJob, predict
    from mdot_jax.cli import main
    from mdot_jax.serving.memory import MEMORY_PARTS

    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(
        model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)))
    base = dict(model=str(path), seq_len=64, batch_size=2, device="h100-sxm",
                precision="amp-bf16", optimizer="adamw")
    asked = dict(one={}, fsdp=dict(gpus=8, strategy="fsdp"), ddp=dict(gpus=8, strategy="ddp"),
                 full=dict(activation_checkpointing="full"),
                 stages=dict(gpus=8, tp=2, pp=2, grad_accum=4))
    got = {k: predict(TrainingJob(**base, **v)) for k, v in asked.items()}
    for p in got.values():
        assert tuple(p.memory_parts) == MEMORY_PARTS
        assert sum(p.memory_parts.values()) == pytest.approx(p.memory_gb, rel=1e-9)
    one = got["one"].memory_parts
    assert got["fsdp"].memory_parts["model_states"] == pytest.approx(one["model_states"] / 8)
    bucket = 4 * got["one"].parameters / 1e9  # DDP's buckets: a copy of the fp32 gradients
    assert got["ddp"].memory_parts["model_states"] == pytest.approx(one["model_states"] + bucket)
    assert got["full"].memory_parts["activations"] < one["activations"]
    assert got["full"].memory_parts["model_states"] == one["model_states"]
    assert got["stages"].memory_parts["model_states"] < one["model_states"]
    assert main(["predict", str(path), "--seq-len", "64", "--batch-size", "2", "--device",
                 "h100-sxm"]) == 0
    assert "\nmemory: weights, gradients and optimizer state " in capsys.readouterr().out
    # a CPU's estimate follows the step's live bytes: the moment of its peak is said (at the
    # update no activation is live, which "kept for the backward 1e-06 GB" left to guess)
    assert main(["predict", str(path), "--seq-len", "64", "--batch-size", "2", "--checkpoint",
                 "cpu-amd-epyc-f26m2-2t"]) == 0
    said = capsys.readouterr().out
    assert re.search(r"\nmemory at its peak \(in the (forward|backward|update)\): weights, "
                     r"gradients and optimizer state [\d.]+ GB, activations [\d.e+-]+ GB", said)


def test_autocast_keeps_a_half_copy_of_each_weight_but_fsdps_mixed_precision_does_not():
    """Under AMP autocast keeps a bf16 copy of every weight a GEMM reads through the forward
    (the H100's measured LLM steps); FSDP's mixed precision gathers half-type weights a unit at a
    time and frees them, so it keeps none; Megatron-LM's half model is counted as its own."""
    transformers = pytest.importorskip("transformers")
    import torch

    from converters import from_hf_config
    from mdot_jax import TrainingJob, predict

    seq = convert(from_hf_config(dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=2,
                                      vocab_size=512, n_positions=64), seq_len=64),
                  batch_size=4, seq_len=64, fuse=True)
    acts = {(precision, strategy): predict(TrainingJob(
        model=seq, batch_size=4, device="h100-sxm", precision=precision, gpus=8,
        strategy=strategy)).memory_parts["activations"] * 1e9
        for precision in ("fp32", "amp-bf16") for strategy in ("ddp", "fsdp")}
    with torch.device("meta"):  # the weights GEMMs read (the tied head's too), not the
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(  # embeddings' or norms'
            n_embd=64, n_layer=2, n_head=2, vocab_size=512, n_positions=64))
    copies = 2.0 * (sum(p.numel() for m in model.modules() if type(m).__name__ == "Conv1D"
                        for p in m.parameters()) + model.transformer.wte.weight.numel())
    assert copies < 2.0 * seq.params
    assert acts["amp-bf16", "ddp"] - acts["amp-bf16", "fsdp"] == pytest.approx(copies)
    assert acts["fp32", "ddp"] == pytest.approx(acts["fp32", "fsdp"])
    one = step_memory(seq, "amp-bf16")
    assert one.activations - step_memory(seq, "amp-bf16", framework="megatron"
                                         ).activations == pytest.approx(copies)
