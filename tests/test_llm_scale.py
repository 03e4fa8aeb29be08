"""LLMs at their real sizes (slow tier): a 7B GPT-style decoder trained with FSDP on 8 H100s
fits, moves the bytes FSDP must move and updates every parameter; a 70B Llama exports from
its config alone and is priced on 64 GPUs in 3-D parallelism."""

import json
import re
import time

import pytest

from mdot_jax import TrainingJob, predict
from mdot_jax.gpu import catalog as gpus

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

MPT_7B = dict(model_type="mpt", d_model=4096, n_layers=32, n_heads=32, max_seq_len=2048,
              vocab_size=50432, expansion_ratio=4)
LLAMA_70B = dict(model_type="llama", hidden_size=8192, intermediate_size=28672,
                 num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                 vocab_size=32000, max_position_embeddings=4096)


def test_a_7b_decoder_on_8_h100s_with_fsdp(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MPT_7B))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=2048, batch_size=6,
                            device="h100-sxm", gpus=8, strategy="fsdp", precision="amp-bf16",
                            optimizer="adamw"))
    update = next(w for w in p.warnings if w.startswith("the adamw update"))
    params = int(re.search(r"over the ([\d,]+) parameters", update)[1].replace(",", ""))
    assert params > 6.6e9  # every layer's weights, not one layer's
    fsdp = next(w for w in p.warnings if w.startswith("fsdp:"))
    comm_ms = float(re.search(r"\(([\d.e+]+) ms,", fsdp)[1])
    nvlink = gpus.find("h100-sxm").nvlink_gbs / 2 * 1e9  # per direction
    assert comm_ms / 1e3 >= 3 * 7 / 8 * 2 * params / nvlink  # three passes of bf16 weights
    assert p.memory_gb < 80 and 0 < p.scaling_efficiency <= 1
    assert 0.25 <= p.mfu <= 0.65
    assert any(w.startswith("attention: flash (") for w in p.warnings)


def test_a_70b_llama_in_3d_parallel_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    t = time.perf_counter()
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=2048, batch_size=1,
                            device="h100-sxm", gpus=8, nodes=8, tp=8, pp=8, grad_accum=32,
                            precision="amp-bf16", optimizer="adamw"))
    assert time.perf_counter() - t < 120  # export and pricing; about 23 s on 2 cores
    assert p.gpus == 64 and p.replicas == 1 and p.tokens_per_s > 0 and 0 < p.mfu < 1
    # what LLM runs report: 32 x 2,048 tokens an iteration over its time, a GPU's share
    assert p.tokens_per_s_per_gpu == pytest.approx(32 * 2048 / (p.iteration_ms / 1e3) / 64)
    assert p.to_json()["tokens_per_s_per_gpu"] == p.tokens_per_s_per_gpu
    assert p.memory_gb < 80 and p.phases["bubble"] > 0
    assert p.fits and p.memory_limit_gb == 80 and not any("not fit" in w for w in p.warnings)


def test_a_7b_llama_fine_tuned_with_lora_and_qlora_on_one_h100(tmp_path):
    llama_7b = dict(LLAMA_70B, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32)
    (tmp_path / "config.json").write_text(json.dumps(llama_7b))
    job = dict(model=str(tmp_path / "config.json"), seq_len=2048, batch_size=4,
               device="h100-sxm", precision="amp-bf16", optimizer="adamw", lora_rank=16)
    full = predict(TrainingJob(**dict(job, lora_rank=None)))
    lora, qlora = (predict(TrainingJob(**job, frozen_weights=held)) for held in ("bf16", "nf4"))
    update = next(w for w in lora.warnings if w.startswith("the adamw update"))
    trained = int(re.search(r"over the ([\d,]+) trained", update)[1].replace(",", ""))
    assert trained == 32 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008))  # every linear layer's
    assert full.memory_gb > 80 > lora.memory_gb > qlora.memory_gb  # full fine-tuning: no fit
    assert qlora.memory_gb < lora.memory_gb - 8  # 6.5 billion weights at 0.52 bytes, not 2
    assert lora.iteration_ms < full.iteration_ms  # no weight gradient of a frozen layer
    assert lora.phases["update"] < full.phases["update"] / 100
    assert 0.25 <= lora.mfu <= 0.65
