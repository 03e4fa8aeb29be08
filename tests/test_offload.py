"""An optimizer (or the parameters too) kept in the host's memory (`mdot_jax.gpu.offload`):
what leaves the GPU, the update at the host's memory bandwidth, the copies over PCIe, and the
one-line refusals where it is not priced."""

import json

import pytest

from converters import convert, from_hf_config
from mdot_jax import TrainingJob, predict
from mdot_jax.cli import main
from mdot_jax.errors import RequestError
from mdot_jax.gpu import catalog
from mdot_jax.gpu.offload import HOST_PASS
from mdot_jax.serving.plan import Plan, plan

pytest.importorskip("transformers")

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
             max_position_embeddings=256)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("offload") / "config.json"
    path.write_text(json.dumps(LLAMA))
    return str(path)


@pytest.fixture(scope="module")
def params():
    return convert(from_hf_config(LLAMA, seq_len=64), batch_size=2).params


def _job(config, **fields):
    return TrainingJob(**{**dict(model=config, seq_len=64, batch_size=2, device="h100-sxm",
                                 precision="amp-bf16", optimizer="adamw"), **fields})


def test_an_offloaded_optimizer_leaves_the_gpu_and_updates_at_the_hosts_bandwidth(config,
                                                                                  params):
    plain = predict(_job(config))
    off = predict(_job(config, offload="optimizer", host_gbs=100.0))
    # AdamW under autocast holds 16 bytes a parameter; offloaded, the half-type model alone
    assert plain.memory_parts["model_states"] == pytest.approx(16 * params / 1e9, rel=1e-6)
    assert off.memory_parts["model_states"] == pytest.approx(2 * params / 1e9, rel=1e-6)
    moved = 2 * 8 + HOST_PASS + 2  # the state read and written, the pass, the copy written
    assert off.phases["update"] == pytest.approx(moved * params / 100e9 * 1e3, rel=1e-6)
    back = 2 * params / 64e9 * 1e3  # the updated weights in over PCIe gen5 (64 GB/s a way)
    assert off.phases["host copies"] >= back * (1 - 1e-9)
    assert off.iteration_ms == pytest.approx(sum(off.phases.values()))
    # the host: the state, fp32 master weights and gradients (with `params`, the weights too)
    assert plain.host_memory_gb is None and "host_memory_gb" not in plain.to_json()
    assert off.to_json()["host_memory_gb"] == pytest.approx(16 * params / 1e9, rel=1e-6)
    said = next(w for w in off.warnings if w.startswith("offload optimizer"))
    assert "100 GB/s (as given" in said and "not measured" in said
    assert f"at 64 GB/s a direction ({2 * back:.3g} ms" in said  # the gradients out, weights in
    assert not any(w.startswith("the adamw update priced") for w in off.warnings)
    # in flight: the gradients going out, a unit's (its 2 layers and the root)
    assert off.memory_parts["working"] - plain.memory_parts["working"] == pytest.approx(
        2 * params / 3 / 1e9, rel=1e-6)
    update = [o for o in off.operators or [] if o["type"] == "optimizer"]
    assert all("on the host" in o["name"] for o in update)
    whole = predict(_job(config, offload="params", host_gbs=100.0))
    assert whole.memory_parts["model_states"] == 0.0  # the weights too, but in flight
    assert whole.memory_parts["working"] > off.memory_parts["working"]
    assert whole.host_memory_gb == pytest.approx(18 * params / 1e9, rel=1e-6)


def test_a_nodes_cpus_update_every_shard_of_it(config):
    """Eight GPUs of a node under ZeRO-2 each own an eighth of the state, all on one host:
    the update takes as long as one GPU's whole; over two nodes, half of it."""
    one = predict(_job(config, offload="optimizer"))
    node = predict(_job(config, offload="optimizer", gpus=8, strategy="zero2"))
    two = predict(_job(config, offload="optimizer", gpus=8, nodes=2, strategy="zero2"))
    assert node.phases["update"] == pytest.approx(one.phases["update"], rel=1e-6)
    assert two.phases["update"] == pytest.approx(one.phases["update"] / 2, rel=1e-6)
    assert "614.4 GB/s (its reference system's host" in next(
        w for w in one.warnings if w.startswith("offload optimizer"))
    assert catalog.find("h100-sxm").host_gbs == 614.4 and catalog.find("rtx-4090").host_gbs == 0


@pytest.mark.parametrize("fields,field", [
    (dict(optimizer="sgd"), "offload"),
    (dict(optimizer="muon"), "offload"),
    (dict(gpus=8, tp=2, strategy="zero2"), "tp"),
    (dict(framework="megatron"), "framework"),
    (dict(step="fwd-bwd"), "step"),
    (dict(fused_optimizer=True), "fused_optimizer"),
    (dict(gpus=8), "strategy"),  # DDP: nothing sharded to offload
    (dict(gpus=8, strategy="zero2", offload="params"), "strategy"),  # ZeRO-3's alone
    (dict(device="rtx-4090"), "host_gbs"),  # no reference system's host
    (dict(device="gb200"), "offload"),  # a Grace CPU over NVLink-C2C
    (dict(device="gb200", host_gbs=500.0), "offload"),
    (dict(offload=None, host_gbs=500.0), "host_gbs"),
    (dict(host_gbs=-1.0), "host_gbs"),
    (dict(offload="cpu"), "offload")])
def test_an_offload_not_priced_is_one_named_error(config, fields, field):
    with pytest.raises(RequestError) as e:
        predict(_job(config, **{"offload": "optimizer", **fields}))
    assert e.value.field == field and "\n" not in str(e.value)


def test_the_cli_and_a_plan_offload(config, capsys):
    assert main(["predict", config, "--seq-len", "64", "--batch-size", "2", "--device",
                 "a100-sxm-80gb", "--precision", "amp-bf16", "--optimizer", "adamw",
                 "--offload", "optimizer"]) == 0
    out, err = capsys.readouterr()
    assert "host copies" in out and "offload optimizer: adamw's state" in err
    assert "; the host's, a node: " in out
    # a count a plan cannot offload (DDP over 8) is its own row; the one GPU is still priced
    options = plan(Plan(_job(config, offload="optimizer", train_tokens=10 ** 8), gpus=(1, 8),
                        devices=("h100-sxm",)))
    rows = {o.gpus: o for o in options}
    assert rows[1].prediction is not None and rows[8].prediction is None
    assert "strategy 'ddp': offload optimizer over 8 GPUs" in rows[8].reasons[0]


def test_a_model_without_layers_offloads_a_bucket_or_all_its_gradients_where_fewer(tmp_path):
    """No layers to go unit by unit: a 25 MB bucket of gradients in flight, no more than all
    of them (a small CNN held 100 MB, four buckets' worth at fp32, where it had 0.1 MB)."""
    import onnx
    from onnx_builders import conv_bn_relu

    onnx.save(conv_bn_relu(), tmp_path / "c.onnx")
    job = dict(model=str(tmp_path / "c.onnx"), batch_size=2, device="h100-sxm",
               optimizer="adamw")
    plain, off = (predict(TrainingJob(**job, **extra))
                  for extra in ({}, dict(offload="optimizer")))
    grads = 4 * convert(str(tmp_path / "c.onnx"), batch_size=2).params  # fp32
    assert grads < 25 * 2 ** 20
    assert off.memory_parts["working"] - plain.memory_parts["working"] == pytest.approx(
        grads / 1e9, rel=1e-6)
