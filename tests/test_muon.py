"""torch.optim.Muon's update (`mdot_jax.gpu.muon`): the hidden weight matrices orthogonalised by
Newton-Schulz GEMMs, one matrix after another, AdamW over the rest; a momentum buffer for
each matrix parameter where AdamW keeps two."""

import json

import pytest

from converters import convert, from_hf_config
from mdot_jax import TrainingJob, autograd, predict
from mdot_jax.errors import RequestError
from mdot_jax.gpu import muon

pytest.importorskip("transformers")

GPT2 = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=128,
            bos_token_id=0, eos_token_id=0)
LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
             max_position_embeddings=256)


def test_muon_takes_the_weight_matrices_not_the_embeddings_or_the_head():
    gpt2 = convert(from_hf_config(GPT2, seq_len=32), batch_size=2)  # a head tied to wte
    assert sorted(muon.matrices(gpt2)) == sorted([(64, 192), (64, 64), (64, 256), (64, 256)] * 2)
    llama = convert(from_hf_config(LLAMA, seq_len=32), batch_size=2)  # an untied head
    per_layer = [(128, 128), (64, 128), (64, 128), (128, 128), (128, 344), (128, 344),
                 (128, 344)]  # q, k, v, o, gate, up, down
    assert sorted(muon.matrices(llama)) == sorted(per_layer * 2)
    lora = convert(from_hf_config(LLAMA, seq_len=32, lora_rank=4), batch_size=2)
    # LoRA: the adapters' A and B are the trained matrices, every one of them
    assert sum(a * b for a, b in muon.matrices(lora)) == autograd.trainable(lora)


def test_a_muon_step_pays_its_gemms_and_launches_and_holds_less_state(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    job = dict(model=str(config), seq_len=64, batch_size=2, device="h100-sxm",
               precision="amp-bf16")
    adamw, mu = (predict(TrainingJob(**job, optimizer=o)) for o in ("adamw", "muon"))
    assert mu.phases["update"] > adamw.phases["update"] and mu.iteration_ms > adamw.iteration_ms
    assert {k: v for k, v in mu.phases.items() if k not in ("update", "launch gaps")} == \
        {k: v for k, v in adamw.phases.items() if k not in ("update", "launch gaps")}
    seq = convert(from_hf_config(LLAMA, seq_len=64), batch_size=2)
    matrix = sum(a * b for a, b in muon.matrices(seq))
    assert adamw.memory_gb - mu.memory_gb == pytest.approx(4 * matrix / 1e9, rel=1e-6)
    assert any(w.startswith("the muon update priced as torch.optim.Muon's over 14 weight "
                            "matrices") for w in mu.warnings)
    lora = predict(TrainingJob(**job, optimizer="muon", lora_rank=4))  # nothing left to AdamW
    said = next(w for w in lora.warnings if w.startswith("the muon update"))
    assert lora.phases["update"] > 0 and "AdamW" not in said


def test_muon_is_refused_where_its_matrices_are_sharded_or_not_priced(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    job = dict(model=str(config), seq_len=64, batch_size=2, device="h100-sxm",
               precision="amp-bf16", optimizer="muon")
    assert predict(TrainingJob(**job, gpus=4)).iteration_ms > 0  # DDP
    for bad in (dict(gpus=4, strategy="fsdp"), dict(gpus=4, tp=2), dict(gpus=4, pp=2),
                dict(framework="megatron")):
        field = next(f for f in bad if f != "gpus")  # what a plan's search varies, skipped
        with pytest.raises(RequestError, match=f"^{field} .*: optimizer muon ") as e:
            TrainingJob(**job, **bad)
        assert e.value.field == field
    with pytest.raises(RequestError, match="^optimizer 'muon': priced for a GPU"):
        predict(TrainingJob(**dict(job, device=None)))  # a CPU's checkpoint


def test_muon_over_a_model_without_hidden_matrices_is_adamw_and_says_so(tmp_path):
    import onnx
    import torch

    from converters import from_torch
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 10))  # the one linear is the head
    onnx.save(from_torch(cnn, torch.randn(2, 3, 8, 8)), tmp_path / "cnn.onnx")
    job = dict(model=str(tmp_path / "cnn.onnx"), batch_size=4, device="h100-sxm",
               precision="amp-bf16")
    mu, adamw = (predict(TrainingJob(**job, optimizer=o)) for o in ("muon", "adamw"))
    assert (mu.iteration_ms, mu.memory_gb) == (adamw.iteration_ms, adamw.memory_gb)
    assert any(w.startswith("optimizer muon: no trained hidden weight matrix") for w in mu.warnings)
