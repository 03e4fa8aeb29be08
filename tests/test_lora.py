"""Fine-tuning with frozen parameters (LoRA adapters, a frozen backbone): the export records what
is frozen, and the step is priced without the frozen weights' gradients, their gradient
communication and their optimizer state; nothing before the first trained parameter runs a
backward."""

import json
import re

import numpy as np
import pytest

from converters import ConversionError, convert, from_hf_config, from_torch
from converters.sequence import FROZEN_KEY
from mdot_jax import TrainingJob, autograd, predict
from mdot_jax.errors import RequestError
from mdot_jax.gpu import catalog
from mdot_jax.gpu.spec_sheet import load_step_model, price
from mdot_jax.serving.memory import step_memory
from mdot_jax.serving.request import in_fields

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
             max_position_embeddings=256)
# per layer: q 128->128, k and v 128->64, o 128->128, gate and up 128->344, down 344->128
ADAPTED = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64),
           "o_proj": (128, 128), "gate_proj": (128, 344), "up_proj": (128, 344),
           "down_proj": (344, 128)}


def _lora_params(rank, targets, layers=4):
    return layers * sum(rank * (i + o) for name, (i, o) in ADAPTED.items() if name in targets)


@pytest.fixture(scope="module")
def llama():
    full = convert(from_hf_config(LLAMA, seq_len=64), batch_size=2)
    lora = convert(from_hf_config(LLAMA, seq_len=64, lora_rank=8), batch_size=2)
    return full, lora


def test_lora_adapters_are_counted_trained_and_every_other_parameter_frozen(llama):
    full, lora = llama
    assert autograd.trainable(full) == full.params  # nothing frozen: as before
    assert autograd.trainable(lora) == _lora_params(8, ADAPTED)  # every layer's, traced two
    assert lora.params == full.params + _lora_params(8, ADAPTED)
    qv = convert(from_hf_config(LLAMA, seq_len=64, lora_rank=4,
                                lora_targets=("q_proj", "v_proj")), batch_size=2)
    assert autograd.trainable(qv) == _lora_params(4, ("q_proj", "v_proj"))


def test_model_code_reading_an_adapted_layers_weight_still_runs():
    t5 = dict(model_type="t5", d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16,
              vocab_size=256)  # T5 reads its output projection's weight's dtype
    seq = convert(from_hf_config(t5, seq_len=16, lora_rank=4), batch_size=2)
    assert 0 < autograd.trainable(seq) < seq.params


def test_a_lora_target_that_names_no_linear_layer_says_which_there_are():
    with pytest.raises(ConversionError, match=r"^--lora-targets 'qproj'.*q_proj, up_proj, v_proj"
                       ) as bad:
        from_hf_config(LLAMA, seq_len=16, lora_rank=4, lora_targets=("qproj",))
    # the service answers it in its field (it answered with none)
    assert in_fields(str(bad.value))[1] == "lora_targets"
    with pytest.raises(ConversionError, match="^--lora-rank 0"):
        from_hf_config(LLAMA, seq_len=16, lora_rank=0)
    # a typo's extra digits: adapters larger than every layer they adapt (its widest 128 x 344)
    with pytest.raises(ConversionError, match=r"^--lora-rank 1,000: more than the smaller side "
                                              r"of every layer it adapts \(at most 128\)") as big:
        from_hf_config(LLAMA, seq_len=16, lora_rank=1000)
    assert in_fields(str(big.value))[1] == "lora_rank"
    from_hf_config(LLAMA, seq_len=16, lora_rank=128)  # as wide as a layer: taken


class _Distilled(torch.nn.Module):
    """A student trained against a teacher run under no_grad (or detached), in one module."""

    def __init__(self, detach: bool = False):
        super().__init__()
        self.student, self.teacher = torch.nn.Linear(32, 10), torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        self.detach = detach

    def forward(self, x):
        if self.detach:
            target = self.teacher(x).detach()
        else:
            with torch.no_grad():
                target = self.teacher(x)
        return torch.nn.functional.mse_loss(self.student(x), target)


@pytest.mark.parametrize("detach", [False, True])
def test_a_teacher_the_backward_never_reaches_is_frozen(detach):
    """The teacher's parameters require a gradient but get none: its backward and update were
    priced (11,348 parameters trained, not the student's 330)."""
    seq = convert(from_torch(_Distilled(detach), torch.randn(4, 32)), batch_size=4)
    assert autograd.trainable(seq) == 32 * 10 + 10 and seq.params == 330 + 32 * 256 + 256 + 2570
    teacher = [i for i, n in enumerate(seq.node_names) if "teacher" in n]
    assert teacher and not autograd.backward(seq).runs[teacher].any()


def test_what_the_gradient_probe_cannot_tell_leaves_every_parameter_trained():
    class Argmax(torch.nn.Module):  # an inference export: no output carries a gradient
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(x).argmax(-1)

    class Reads(Argmax):  # code that reads a value: no forward on the meta device
        def forward(self, x):
            return self.fc(x) * (2.0 if x.sum().item() > 0 else 1.0)

    for net in (Argmax(), Reads()):
        seq = convert(from_torch(net, torch.randn(4, 16)), batch_size=4)
        assert autograd.trainable(seq) == seq.params == 68, type(net).__name__


def test_parameters_the_step_never_reads_are_said_not_priced(tmp_path):
    """A vision-language config given tokens alone was priced as its language model with
    nothing said of the vision tower; so was a module's head its forward never calls."""
    import onnx

    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.aux = torch.nn.Linear(16, 4), torch.nn.Linear(16, 100)

        def forward(self, x):
            return self.fc(x)

    seq = convert(from_torch(Unused(), torch.randn(4, 16)), batch_size=4)
    assert seq.params == 68 and seq.meta["unread"] == {"params": 1700, "in": ["aux"]}
    assert "unread" not in convert(from_torch(torch.nn.Linear(16, 4), torch.randn(4, 16)),
                                   batch_size=4).meta

    class Masked(torch.nn.Module):  # DINOv2's mask token, beside a weight that is read
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)
            self.fc.mask = torch.nn.Parameter(torch.zeros(16))

        def forward(self, x):
            return self.fc(x)

    said = convert(from_torch(Masked(), torch.randn(4, 16)), batch_size=4).meta["unread"]
    assert said == {"params": 16, "in": ["fc.mask"]}  # named, not "in " nothing
    gemma3 = dict(model_type="gemma3", mm_tokens_per_image=4, text_config=dict(
        model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=300),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                           intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=56, patch_size=14))
    onnx.save(from_hf_config(gemma3, seq_len=32), tmp_path / "m.onnx")
    p = predict(TrainingJob(model=str(tmp_path / "m.onnx"), batch_size=1, device="h100-sxm"))
    said = [w for w in p.warnings if "more of the model's parameters" in w]
    assert said and "(in model.vision_tower, model.multi_modal_projector)" in said[0]
    unread = int(said[0].split(" more")[0].replace(",", ""))
    with torch.device("meta"):
        import transformers

        whole = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**gemma3))
    assert p.parameters + unread == sum(t.numel() for t in whole.parameters())


class Checkpointed(torch.nn.Module):
    """Two linear layers, the first under `torch.utils.checkpoint.checkpoint`."""

    def __init__(self, reentrant: bool = False):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
        self.reentrant = reentrant

    def forward(self, x):
        return self.fc2(torch.utils.checkpoint.checkpoint(self.fc1, x,
                                                          use_reentrant=self.reentrant))


def test_a_model_that_checkpoints_itself_says_so(tmp_path):
    """torch.utils.checkpoint in a module's code, or transformers' flag, was priced as a step
    that keeps every activation and runs no forward again, with nothing said."""
    import onnx
    import transformers

    class ByName(Checkpointed):  # `from torch.utils.checkpoint import checkpoint`, done before
        def forward(self, x):
            return self.fc2(imported(self.fc1, x, use_reentrant=True))

    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=64))
    llama.gradient_checkpointing_enable()
    imported = torch.utils.checkpoint.checkpoint
    for net, x in ((Checkpointed(), torch.randn(4, 16)), (ByName(), torch.randn(4, 16)),
                   (llama, torch.randint(0, 64, (2, 8)))):
        onnx.save(from_torch(net, x), tmp_path / "m.onnx")
        assert convert(onnx.load(tmp_path / "m.onnx"), batch_size=2).meta["checkpointed"]
        said = [w for w in predict(TrainingJob(model=str(tmp_path / "m.onnx"), batch_size=2,
                                               device="h100-sxm")).warnings
                if "checkpoints activations in its own code" in w]
        assert said and said[0].endswith("give activation_checkpointing full")
    given = predict(TrainingJob(model=str(tmp_path / "m.onnx"), batch_size=2, device="h100-sxm",
                                activation_checkpointing="full"))  # the Llama, as it trains
    assert not any("in its own code" in w for w in given.warnings)
    plain = convert(from_torch(torch.nn.Linear(16, 4), torch.randn(4, 16)), batch_size=2)
    assert "checkpointed" not in plain.meta


def test_every_export_runs_on_a_torch_without_the_inner_checkpoint_function(monkeypatch):
    """torch before 2.12 has no `torch.utils.checkpoint._checkpoint_impl`: every export failed
    on a lent GPU's torch 2.11 (an AttributeError), checkpointed or not."""
    monkeypatch.delattr(torch.utils.checkpoint, "_checkpoint_impl")
    assert convert(from_torch(Checkpointed(True), torch.randn(4, 16)), batch_size=2).meta[
        "checkpointed"]
    assert "checkpointed" not in convert(
        from_torch(torch.nn.Linear(16, 4), torch.randn(4, 16)), batch_size=2).meta
    assert not hasattr(torch.utils.checkpoint, "_checkpoint_impl")  # given back as it was

def test_a_frozen_backbone_exported_from_torch_runs_no_backward_before_its_head():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 3), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(16 * 12 * 12, 10))
    for p in net[:4].parameters():
        p.requires_grad_(False)
    proto = from_torch(net, torch.randn(2, 3, 16, 16))
    assert {p.key: p.value for p in proto.metadata_props}[FROZEN_KEY] == \
        "0.weight,0.bias,2.weight,2.bias"
    seq = convert(proto, batch_size=2)
    assert autograd.trainable(seq) == 16 * 12 * 12 * 10 + 10
    grads = autograd.backward(seq)
    head = int(np.flatnonzero(np.isin(seq.op_names, ["Gemm", "MatMul"]))[-1])
    assert not grads.runs[:head].any()  # the backbone: no backward at all
    assert grads.runs[head] and grads.weights[head] and not grads.data[head]
    gpu, model = catalog.find("h100-sxm"), load_step_model()
    frozen = price(seq, gpu, model, optimizer="adam")
    for p in net.parameters():
        p.requires_grad_(True)
    trained = price(convert(from_torch(net, torch.randn(2, 3, 16, 16)), batch_size=2), gpu,
                    model, optimizer="adam")
    assert frozen.phases["backward"] < 0.5 * trained.phases["backward"]
    assert frozen.phases["update"] < trained.phases["update"]
    assert any(f"over the {autograd.trainable(seq):,} trained parameters" in w
               for w in frozen.warnings)


def test_lora_keeps_the_forward_and_drops_the_frozen_weights_gradients(llama):
    full, lora = llama
    fwd, bwd = (lambda s: s.total("fwd_flops"), lambda s: autograd.backward_flops(s).sum())
    assert bwd(full) == pytest.approx(full.total("bwd_flops"))  # nothing frozen: as converted
    assert fwd(full) < fwd(lora) < 1.1 * fwd(full)  # the adapters: two thin GEMMs a layer
    assert bwd(lora) < 0.65 * bwd(full)  # the linear layers. data gradients alone
    grads = autograd.backward(lora)
    base = [i for i, n in enumerate(lora.node_names) if "q_proj/base_layer/MatMul" in n]
    assert len(base) == 4 and not grads.weights[base].any()
    assert not grads.runs[base[0]]  # the first layer reads the frozen embedding's output
    assert grads.data[base[1:]].all()  # the others, activations an adapter made


def test_lora_holds_no_gradient_or_state_for_frozen_weights_nor_their_inputs(llama):
    full, lora = llama
    a, b = step_memory(full, "amp-bf16", "adamw"), step_memory(lora, "amp-bf16", "adamw")
    assert b.gradients == 4.0 * autograd.trainable(lora)
    assert b.optimizer == 8.0 * autograd.trainable(lora)
    assert b.parameters == 4.0 * lora.params
    assert b.activations < a.activations  # frozen linear layers and norms keep no input


def test_lora_under_fsdp_reduces_only_the_adapters_gradients(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    job = dict(model=str(path), seq_len=64, batch_size=2, device="h100-sxm", gpus=8,
               precision="amp-bf16", optimizer="adamw")
    for strategy in ("ddp", "fsdp"):
        full = predict(TrainingJob(**job, strategy=strategy))
        lora = predict(TrainingJob(**job, strategy=strategy, lora_rank=8))
        comm = [next(w for w in p.warnings if w.startswith(f"{strategy}:")) for p in (full, lora)]
        ms = [float(re.search(r"\(([\d.e+-]+) ms,", c)[1]) for c in comm]
        assert ms[1] < ms[0] if strategy == "ddp" else ms[0] * 2 / 3 <= ms[1] < ms[0]
        assert lora.memory_gb < full.memory_gb


def test_lora_fields_are_checked_where_the_request_is_made(tmp_path):
    with pytest.raises(RequestError, match="lora_targets: the layers LoRA adapts; give lora_rank"):
        TrainingJob(model="m.onnx", batch_size=1, lora_targets=("q_proj",))
    with pytest.raises(RequestError, match="lora_rank 0"):
        TrainingJob(model="m.onnx", batch_size=1, lora_rank=0)
    with pytest.raises(RequestError, match="lora_targets 'q_proj'"):
        TrainingJob(model="m.onnx", batch_size=1, lora_rank=4, lora_targets="q_proj")
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(from_torch(torch.nn.Linear(4, 4), torch.randn(2, 4))
                          .SerializeToString())
    with pytest.raises(RequestError, match="lora_rank: adapters are added to a config.json"):
        predict(TrainingJob(model=str(onnx_file), batch_size=2, device="h100-sxm",
                            lora_rank=4))


def test_a_plan_prices_lora_on_every_gpu_it_tries(tmp_path):
    from mdot_jax.serving.plan import Plan, plan

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    job = dict(model=str(path), seq_len=64, batch_size=2, precision="amp-bf16",
               optimizer="adamw", train_tokens=10**9)
    full, lora = (plan(Plan(TrainingJob(**job, **extra), devices=("h100-sxm", "a100-sxm-80gb"),
                            gpus=(1, 8))) for extra in ({}, {"lora_rank": 8}))
    assert all(o.feasible for o in lora) and len(lora) == len(full) == 4
    held = {(o.device, o.gpus): o.prediction.memory_gb for o in full}
    assert all(o.prediction.memory_gb < held[o.device, o.gpus] for o in lora)


def test_the_cli_takes_lora_and_says_what_trains(tmp_path, capsys):
    from mdot_jax.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    args = ["predict", str(path), "--seq-len", "64", "--batch-size", "2", "--device",
            "h100-sxm", "--optimizer", "adamw"]
    assert main([*args, "--lora-rank", "4", "--lora-targets", "q_proj,v_proj"]) == 0
    trained = f"{_lora_params(4, ('q_proj', 'v_proj')):,} of the"
    assert trained in capsys.readouterr().err
    assert main([*args, "--lora-targets", "q_proj"]) == 2
    assert "--lora-targets: the layers LoRA adapts; give --lora-rank" in capsys.readouterr().err
    convert_args = ["convert", str(path), "--seq-len", "64", "--batch-size", "2", "--json",
                    "--lora-rank", "4", "--lora-targets"]
    assert main([*convert_args, "q_proj, v_proj"]) == 0  # spaced as people type lists
    summary = json.loads(capsys.readouterr().out)
    assert summary["trained_params"] == _lora_params(4, ("q_proj", "v_proj"))
    assert main([*convert_args, ","]) == 2
    assert "--lora-targets ',': expected layer names" in capsys.readouterr().err


def test_a_prediction_says_how_many_parameters_the_model_has_and_trains(tmp_path, capsys):
    import transformers

    from mdot_jax.cli import main
    from mdot_jax.readable import count

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**LLAMA))
    total = sum(p.numel() for p in model.parameters())  # tied weights once
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    job = dict(model=str(path), seq_len=64, batch_size=2, device="h100-sxm")
    p = predict(TrainingJob(**job))
    assert (p.parameters, p.trained_parameters) == (total, total)
    adapters = _lora_params(4, ("q_proj", "v_proj"))
    p = predict(TrainingJob(**job, lora_rank=4, lora_targets=("q_proj", "v_proj")))
    assert (p.parameters, p.trained_parameters) == (total + adapters, adapters)
    assert p.to_json()["trained_parameters"] == adapters
    assert main(["predict", str(path), "--seq-len", "64", "--batch-size", "2", "--device",
                 "h100-sxm", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"({count(total + adapters)} parameters, {count(adapters)} trained, " in header


def test_a_step_with_frozen_parameters_has_no_band_and_one_training_nothing_is_refused(
        tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def priced(name):
        path = tmp_path / name
        path.write_bytes(from_torch(net, torch.randn(2, 8)).SerializeToString())
        return predict(TrainingJob(model=str(path), batch_size=4, device="h100-sxm"))

    assert priced("trained.onnx").interval_ms is not None
    net[0].requires_grad_(False)
    head = priced("head.onnx")  # measured bands are of steps that train every parameter
    assert head.interval_ms is None and any("18 of the 90 parameters trained" in w
                                            for w in head.warnings)
    net[2].requires_grad_(False)
    with pytest.raises(RequestError, match="every one of its 90 parameters is frozen"):
        priced("frozen.onnx")


def test_frozen_weights_held_in_half_or_4_bits_hold_less_and_qlora_dequantises(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    job = dict(model=str(path), seq_len=64, batch_size=2, device="h100-sxm",
               precision="amp-bf16", optimizer="adamw", lora_rank=8)
    fp32, bf16, nf4 = (predict(TrainingJob(**job, frozen_weights=held))
                       for held in (None, "bf16", "nf4"))
    assert fp32.memory_gb > bf16.memory_gb > nf4.memory_gb
    # the frozen weights: 4 bytes, then 2, then the layers' at about half a byte
    lora = convert(from_hf_config(LLAMA, seq_len=64, lora_rank=8), batch_size=2)
    frozen = lora.params - autograd.trainable(lora)
    # and autocast's copies of the fp32 ones GEMMs read, kept for their input's gradient: every
    # linear layer's but the first layer's q, k and v (its input needs none), and the head's
    copies = 4 * sum(i * o for i, o in ADAPTED.values()) + 128 * 1000 - sum(
        i * o for name, (i, o) in ADAPTED.items() if name in ("q_proj", "k_proj", "v_proj"))
    assert fp32.memory_gb - bf16.memory_gb == pytest.approx(2 * (frozen + copies) / 1e9,
                                                            rel=1e-6)
    # checkpointed, no layer's copies are kept (the head's still are): QLoRA's 8B on 24 GB
    ckpt = [predict(TrainingJob(**job, frozen_weights=held, activation_checkpointing="full"))
            for held in (None, "bf16")]
    assert ckpt[0].memory_gb - ckpt[1].memory_gb == pytest.approx(
        2 * (frozen + 128 * 1000) / 1e9, rel=1e-6)
    layers = 4 * sum(i * o for i, o in ADAPTED.values())  # the head (and embedding) stay bf16
    assert bf16.memory_gb - nf4.memory_gb == pytest.approx(
        (2 - autograd.NF4_BYTES) * layers / 1e9, rel=1e-6)
    assert bf16.iteration_ms < fp32.iteration_ms  # no autocast cast of a frozen weight
    fp16 = predict(TrainingJob(**job, frozen_weights="fp16"))  # bf16 autocast casts fp16 ones
    assert bf16.phases["forward"] < fp16.phases["forward"] <= fp32.phases["forward"]
    assert fp16.memory_gb - bf16.memory_gb == pytest.approx(2 * copies / 1e9, rel=1e-6)
    assert nf4.phases["forward"] > bf16.phases["forward"]  # each 4-bit weight dequantised
    assert any("held in nf4" in w for w in nf4.warnings)
    assert any("frozen_weights bf16" in w for w in fp32.warnings)  # how to say the base's
    with pytest.raises(RequestError, match="frozen_weights bf16: the model has no frozen"):
        predict(TrainingJob(**dict(job, lora_rank=None), frozen_weights="bf16"))


def test_fsdp_shards_and_gathers_frozen_weights_as_they_are_held(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    job = dict(model=str(path), seq_len=64, batch_size=2, device="h100-sxm", gpus=8,
               strategy="fsdp", precision="amp-bf16", optimizer="adamw", lora_rank=8)
    one, fp32, bf16, nf4 = (predict(TrainingJob(**dict(job, gpus=gpus, strategy=strategy),
                                                frozen_weights=held))
                            for gpus, strategy, held in ((1, "ddp", "bf16"), (8, "fsdp", None),
                                                         (8, "fsdp", "bf16"), (8, "fsdp", "nf4")))
    assert 0 < nf4.memory_gb < bf16.memory_gb < fp32.memory_gb
    assert bf16.memory_gb < one.memory_gb  # sharded, never below nothing
    gathered = [float(re.search(r"\(([\d.e+-]+) ms,", next(
        w for w in p.warnings if w.startswith("fsdp:")))[1]) for p in (bf16, nf4)]
    assert gathered[1] < gathered[0]  # 4-bit weights gathered
