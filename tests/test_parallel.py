"""Data-parallel steps on N GPUs (`serving.parallel`, `mdot predict --gpus`): one GPU is the
single-GPU step, the all-reduce grows with bytes and GPUs, overlap never hides compute, the
links follow the hardware, and the CLI tables and refuses what it cannot price."""

import dataclasses
import json
import math
import re

import onnx
import pytest
from benches import bench
from onnx_builders import attention, conv_bn_relu, token_embedding

from mdot_jax.cli import main
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.parallel import (
    BUCKET_MB,
    NVLINK_EFFICIENCY,
    Link,
    all_to_all_ms,
    allreduce_ms,
    data_parallel,
    expert_exchange,
    ring_link,
)
from mdot_jax.serving.prediction import GAPS, Prediction


def _one(backward=10.0):
    return Prediction(iteration_ms=4.0 + backward, device="x", num_ops=1,
                      phases=dict(forward=4.0, backward=backward, update=0.0), memory_gb=1.0)


def test_one_gpu_is_the_single_gpu_step_and_more_never_less():
    h100 = gpus.find("h100-sxm")
    one = _one()
    assert data_parallel(one, 10 ** 8, h100, 1) is one
    for n, nodes in ((2, 1), (8, 1), (8, 4)):
        for params in (10 ** 6, 10 ** 8, 10 ** 10):
            p = data_parallel(one, params, h100, n, nodes)
            assert p.iteration_ms >= one.iteration_ms and p.interval_ms is None
            assert p.iteration_ms == pytest.approx(sum(p.phases.values()))
            assert p.memory_gb > one.memory_gb and "all-reduce" in p.warnings[-1]
            # sharded: less memory per GPU, more bytes moved, never less than the compute
            f = data_parallel(one, params, h100, n, nodes, strategy="fsdp")
            assert f.memory_gb < one.memory_gb + 0.03 and f.iteration_ms >= one.iteration_ms \
                - one.phases["update"]
            assert "reduce-scatter" in f.warnings[-1]
    with pytest.raises(ValueError, match="strategy 'tp': choose from"):
        data_parallel(one, 10 ** 8, h100, 4, strategy="tp")
    # a long backward hides all but the last bucket; a short one hides little
    big = 4.0 * 10 ** 9  # the fp32 gradients of 10^9 parameters
    buckets = math.ceil(big / (BUCKET_MB * 2 ** 20))
    link = ring_link(h100, 8, 1, None, 25.0)
    total = allreduce_ms(big, 8, link, buckets)
    hidden = data_parallel(_one(backward=1e4), 10 ** 9, h100, 8)
    assert hidden.phases["communication"] == pytest.approx(total / buckets)
    exposed = data_parallel(_one(backward=0.0), 10 ** 9, h100, 8)
    assert exposed.phases["communication"] == pytest.approx(total)
    # a launch-bound step's backward lasts its kernels and the host's gaps between them: the
    # buckets hide behind both, so that more work a GPU never makes the iteration shorter
    waiting = _one(backward=1.0)
    waiting = dataclasses.replace(waiting, phases={**waiting.phases, "launch gaps": 1e4})
    assert data_parallel(waiting, 10 ** 9, h100, 8).phases["communication"] == pytest.approx(
        total / buckets)


def test_the_allreduce_grows_with_bytes_and_gpus():
    link = ring_link(gpus.find("h100-sxm"), 8, 1, None, 25.0)
    assert allreduce_ms(1e9, 1, link, 1) == 0
    assert allreduce_ms(1e9, 2, link, 1) < allreduce_ms(1e9, 4, link, 1) \
        < allreduce_ms(1e9, 8, link, 1) < allreduce_ms(2e9, 8, link, 1)
    # the bandwidth term of a ring: 2 (N - 1) / N of the bytes at the share of 450 GB/s per
    # direction that rings achieve
    assert allreduce_ms(1e9, 2, link, 0) == pytest.approx(1e3 * 1e9 / (450e9 * NVLINK_EFFICIENCY))


def test_links_follow_the_hardware():
    h100, a100_pcie, l4 = gpus.find("h100-sxm"), gpus.find("a100-pcie-80gb"), gpus.find("l4")
    assert ring_link(h100, 8, 1, None, 25.0).name == "nvlink"
    assert ring_link(a100_pcie, 2, 1, None, 25.0).name == "nvlink"  # a bridged pair
    assert ring_link(a100_pcie, 4, 1, None, 25.0).name == "pcie"
    assert ring_link(h100, 8, 2, None, 25.0).name == "network"
    assert ring_link(h100, 8, 1, "pcie", 25.0).gbs == h100.pcie_gbs / 2
    with pytest.raises(ValueError, match="no NVLink that joins 4"):
        ring_link(l4, 4, 1, "nvlink", 25.0)


def test_predict_tables_gpus(capsys, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(attention(seq=64, dim=256), model)
    args = ["predict", model, "--batch-size", "8", "--device", "h100-sxm"]
    assert main([str(a) for a in args + ["--gpus", "1,2,8", "--json"]]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in rows] == [1, 2, 8]
    assert [r["global_batch"] for r in rows] == [8, 16, 64]
    assert rows[0]["scaling_efficiency"] == 1 >= rows[1]["scaling_efficiency"]
    assert main([str(a) for a in args + ["--json"]]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_ms"] == rows[0]["iteration_ms"]
    assert main([str(a) for a in args + ["--gpus", "4", "--nodes", "2"]]) == 0
    out = capsys.readouterr().out
    assert "scaling" in out and "communication" in out and "\nof which " in out
    assert "\neach of 8 data-parallel replicas: 1 micro-batch of 8, 64 samples an iteration; " \
        "memory per GPU\n" in out  # the batch a GPU, not the iteration's
    assert main([str(a) for a in args + ["--nodes", "2"]]) == 0  # a GPU each: 2, said so
    out = capsys.readouterr().out
    assert " GPUs " in out and re.search(r"\n +2 +[0-9.]+ ", out) and "scaling" in out
    assert main([str(a) for a in args + ["--gpus", "1,2,8"]]) == 0
    out = capsys.readouterr().out
    assert "\nat 8 GPUs, of which " in out  # the breakdown is the last row's
    assert "tok/s/GPU" not in out  # no tokens
    onnx.save(token_embedding(seq=32), tmp_path / "t.onnx")
    assert main([str(a) for a in ["predict", tmp_path / "t.onnx", *args[2:], "--gpus", "8"]]) == 0
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert header.split()[8:10] == ["tokens/s", "tok/s/GPU"]  # after "80% band ms", "memory GB"
    every, each = (float(v.replace(",", "")) for v in row.split()[5:7])
    assert each == pytest.approx(every / 8, rel=1e-3)
    for extra, needle in [(["--gpus", "2", "--device", "rtx3090", "--checkpoint", "timm-rtx3090"],
                           "--gpus 2: priced for a GPU from its spec sheet (--device NAME, no "
                           "checkpoint); checkpoint timm-rtx3090 predicts the one-GPU steps"),
                          (["--gpus", "2,4", "--batch-sizes", "2,4"], "give one"),
                          (["--gpus", "4", "--device", "l4", "--interconnect", "nvlink"],
                           "no NVLink"), (["--gpus", "4", "--strategy", "pp"], "invalid choice"),
                          (["--gpus", "4", "--tp", "3"], "--tp 3: --tp x --pp (3 x 1)"),
                          (["--gpus", "8", "--device", "h100"], "--device: GPU 'h100' is "
                           "ambiguous: nvidia-h100-pcie"),  # said first: the name is the fault
                          (["--device", "h100-sxm,l4"], "--device: GPU 'h100-sxm,l4': one GPU "
                           "here")]:
        assert main([str(a) for a in args + extra]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (extra, err)
    several = ["predict", model, "--batch-sizes", "2,4", "--gpus", "2,4", "--device", "h100-sxm"]
    assert main([str(a) for a in several]) == 2
    assert "--gpus: several GPU counts take one --batch-size" in capsys.readouterr().err


def test_gradient_accumulation_runs_k_micro_batches_and_one_update(tmp_path):
    """An iteration of K micro-batches: K forward and backward passes, one update; DDP
    all-reduces once (behind the last backward), FSDP gathers and reduce-scatters each time."""
    from mdot_jax import RequestError, TrainingJob, predict

    onnx.save(attention(seq=64, dim=256), tmp_path / "m.onnx")
    job = dict(model=str(tmp_path / "m.onnx"), batch_size=8, device="h100-sxm",
               precision="amp-bf16")
    one, four = (predict(TrainingJob(**job, grad_accum=k, operators=True)) for k in (1, 4))
    assert one.phases["launch gaps"] > 0  # each micro-batch's kernels issued by the host
    for phase in ("forward", "backward"):
        assert four.phases[phase] == pytest.approx(4 * one.phases[phase])
    once = one.gaps("update")  # what the update's kernels add: paid once
    assert four.phases["launch gaps"] == pytest.approx(4 * one.phases["launch gaps"] - 3 * once)
    assert four.phases["update"] == pytest.approx(one.phases["update"])
    assert four.global_batch == 4 * one.global_batch == 32
    assert four.memory_gb == one.memory_gb  # one micro-batch's activations at a time
    assert 0 < four.mfu <= 1 and four.mfu >= one.mfu  # the update is paid once
    assert four.tokens == 0 and four.tokens_per_s is None  # [N, 64, 256] floats: no tokens
    onnx.save(token_embedding(seq=32), tmp_path / "t.onnx")
    ids = predict(TrainingJob(**dict(job, model=str(tmp_path / "t.onnx")), grad_accum=4))
    assert ids.tokens == 32 and ids.tokens_per_s == pytest.approx(ids.samples_per_s * 32)
    assert ids.tokens_per_s_per_gpu == ids.tokens_per_s  # one GPU
    eight = predict(TrainingJob(**dict(job, model=str(tmp_path / "t.onnx")), gpus=8))
    assert eight.tokens_per_s_per_gpu == pytest.approx(eight.tokens_per_s / 8)
    for strategy, times in (("ddp", 1), ("fsdp", 4)):
        a, b = (predict(TrainingJob(**job, gpus=8, strategy=strategy, grad_accum=k))
                for k in (1, 4))
        assert b.phases["communication"] == pytest.approx(times * a.phases["communication"])
    with pytest.raises(RequestError, match=r"^grad_accum 2: priced for a GPU from its spec sheet "
                       r"\(name one: device=NAME, `mdot devices`\); the default checkpoint"):
        predict(TrainingJob(model=str(tmp_path / "m.onnx"), batch_size=8, grad_accum=2))


def test_the_host_issues_an_update_once_an_iteration_however_many_micro_batches():
    """The launch gaps an update's kernels add (Muon's many small ones) are paid once an
    iteration, each micro-batch paying its passes' own: so a faster GPU never takes longer
    (an H200 priced 2% slower than an H100 at 8 micro-batches when every micro-batch paid
    the update's gaps again)."""
    from mdot_jax import TrainingJob, predict

    job = dict(model="gpt2", seq_len=256, batch_size=4, optimizer="muon", operators=True)
    one, eight = (predict(TrainingJob(**job, device="h100-sxm", grad_accum=k)) for k in (1, 8))
    gaps = {o["name"]: o["ms"] for o in one.operators if o["type"] == "launch gaps"}
    once = gaps.pop(GAPS["update"])
    assert once > 0 and one.gaps("update") == once  # Muon's update waits on the host
    assert one.phases["launch gaps"] == pytest.approx(once + sum(gaps.values()))
    assert eight.phases["launch gaps"] == pytest.approx(once + 8 * sum(gaps.values()))
    assert eight.phases["update"] == one.phases["update"]
    h200 = predict(TrainingJob(**job, device="h200-sxm", grad_accum=8))
    assert h200.iteration_ms <= eight.iteration_ms


def test_communication_hides_behind_each_pass_as_long_as_it_lasts_on_the_timeline():
    """A pass lasts its kernels and the host's gaps that fall in it (`Prediction.gaps`), not
    its kernels' share of all the gaps: where the host sets the pace, a larger batch
    lengthens the kernels and not the backward (GPT-2 on 32 L4s under FSDP was priced 2%
    faster at batch 4 than at 2), and the update's gaps hide nothing."""
    from mdot_jax import TrainingJob, predict

    gaps = [dict(type="launch gaps", name=GAPS[part], ms=ms)
            for part, ms in (("forward", 6.0), ("backward", 1.0), ("update", 5.0))]
    p = dataclasses.replace(_one(), phases=dict(forward=4.0, backward=10.0, update=1.0,
                                                **{"launch gaps": 12.0}), operators=gaps)
    assert p.passes_ms() == (10.0, 11.0)  # the update's 5 ms in neither
    four = dataclasses.replace(p, phases=dict(p.phases, forward=16.0, backward=40.0,
                                               **{"launch gaps": 4 * 7.0 + 5.0}))
    assert four.passes_ms(4) == (10.0, 11.0)  # a micro-batch's, of four
    bare = dataclasses.replace(p, phases=dict(p.phases, **{"launch gaps": 7.0}), operators=None)
    assert bare.passes_ms() == pytest.approx((6.0, 15.0))  # unsaid: by the kernels' time
    job = dict(model="gpt2", device="l4", precision="amp-bf16", seq_len=32, gpus=8, nodes=4,
               strategy="fsdp", operators=True)
    two, four_ = (predict(TrainingJob(**job, batch_size=b)) for b in (2, 4))
    assert four_.iteration_ms >= two.iteration_ms
    one = predict(TrainingJob(**dict(job, gpus=1, nodes=1, strategy="ddp"), batch_size=2))
    said = {o["name"]: o["ms"] for o in one.operators if o["type"] == "launch gaps"}
    assert said[GAPS["forward"]] > 0 and said[GAPS["backward"]] > 0
    assert sum(said.values()) == pytest.approx(one.phases["launch gaps"])


def test_a_gpu_with_a_measured_checkpoint_prices_what_only_the_spec_sheet_can(tmp_path):
    """The RTX 3090 named with tp, pp or several GPUs: its spec sheet prices the job (said in a
    note); the checkpoint measured on it, named, still refuses them."""
    from mdot_jax import RequestError, TrainingJob, predict

    onnx.save(attention(seq=64, dim=256, heads=4), tmp_path / "m.onnx")
    onnx.save(conv_bn_relu(), tmp_path / "cnn.onnx")  # the image models it was trained on
    job = dict(model=str(tmp_path / "m.onnx"), batch_size=8, device="rtx3090",
               precision="amp-fp16")
    single = predict(TrainingJob(**dict(job, model=str(tmp_path / "cnn.onnx"))))
    assert "checkpoint" in single.source and not any("priced from" in w for w in single.warnings)
    for extra, field in ((dict(gpus=2), "gpus"), (dict(grad_accum=2), "grad_accum"),
                         (dict(gpus=2, tp=2), "gpus")):
        p = predict(TrainingJob(**job, **extra))
        assert "spec sheet" in p.source, extra
        assert any(w.startswith(f"{field}: priced from the nvidia-rtx-3090's spec sheet")
                   for w in p.warnings), (extra, p.warnings)
        with pytest.raises(RequestError, match=f"^{field} 2: priced for a GPU from its spec "
                           r"sheet \(device=NAME, no checkpoint\); checkpoint timm-rtx3090"):
            predict(TrainingJob(**job, **extra, checkpoint="timm-rtx3090"))


def _gpt2(path, tokens: int, **config) -> str:
    """A GPT-2 of `config` built on the meta device, exported at `tokens` to `path`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from converters import from_torch

    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    onnx.save(from_torch(model, torch.zeros(1, tokens, dtype=torch.long)), path)
    return str(path)


def test_activation_checkpointing_runs_the_forward_again_and_keeps_layer_inputs(tmp_path):
    from mdot_jax import RequestError, TrainingJob, predict

    _gpt2(tmp_path / "g.onnx", 512, n_layer=4, n_embd=256, n_head=4, n_positions=512)
    job = dict(model=str(tmp_path / "g.onnx"), batch_size=8, device="a100-sxm-80gb",
               precision="amp-bf16")
    plain = predict(TrainingJob(**job))
    ckpt = predict(TrainingJob(**job, activation_checkpointing="full"))
    # the layers' forward again, not the embedding's, the head's or the loss's
    again = ckpt.phases["recomputation"]
    assert 0 < again < plain.phases["forward"]
    # a launch-bound step: the host issues the recomputed kernels too, at most as slowly as
    # it issued the whole step's
    extra = ckpt.iteration_ms - plain.iteration_ms - again
    assert 0 < extra <= plain.phases["launch gaps"]
    assert ckpt.memory_gb < plain.memory_gb and ckpt.mfu < plain.mfu
    four = predict(TrainingJob(**job, activation_checkpointing="full", grad_accum=4))
    assert four.phases["recomputation"] == pytest.approx(4 * ckpt.phases["recomputation"])
    onnx.save(attention(seq=64, dim=64), tmp_path / "a.onnx")
    with pytest.raises(RequestError, match="activation_checkpointing 'full': priced for a GPU"):
        predict(TrainingJob(model=str(tmp_path / "a.onnx"), batch_size=8,
                            activation_checkpointing="full"))
    onnx.save(conv_bn_relu(training=True), tmp_path / "c.onnx")
    with pytest.raises(RequestError, match="no transformer layers"):
        predict(TrainingJob(**dict(job, model=str(tmp_path / "c.onnx")),
                            activation_checkpointing="full"))
    eager = dict(job, attention="eager")
    selective = predict(TrainingJob(**eager, activation_checkpointing="selective"))
    plain = predict(TrainingJob(**eager))
    full = predict(TrainingJob(**eager, activation_checkpointing="full"))
    assert plain.memory_gb > selective.memory_gb > full.memory_gb
    assert plain.iteration_ms < selective.iteration_ms < full.iteration_ms
    flash = predict(TrainingJob(**dict(job, attention="flash")))  # keeps no S x S anyway
    nothing = predict(TrainingJob(**dict(job, attention="flash"),
                                  activation_checkpointing="selective"))
    assert (nothing.iteration_ms, nothing.memory_gb) == (flash.iteration_ms, flash.memory_gb)
    assert any("selective activation checkpointing changes nothing" in w
               for w in nothing.warnings)  # said, not silently ignored


def test_full_checkpointing_runs_again_and_frees_only_the_layers():
    """Full checkpointing wraps the decoder layers (transformers' and Megatron-LM's): the
    embedding, the final norm, the head and the loss are neither run again nor freed; a graph
    whose exporter left no scopes is run again whole."""
    pytest.importorskip("transformers")
    from converters import convert, from_hf_config
    from converters.attention import attention_blocks, in_layers
    from mdot_jax import TrainingJob, predict
    from mdot_jax.gpu.recompute import rerun
    from mdot_jax.serving.memory import saved

    gpt2 = dict(model_type="gpt2", n_embd=64, n_layer=3, n_head=4, vocab_size=5000,
                n_positions=64, bos_token_id=0, eos_token_id=0)
    seq = convert(from_hf_config(gpt2, seq_len=64), batch_size=4, fuse=True)
    blocks = attention_blocks(seq)
    names = [str(n) for n in seq.node_names]
    assert rerun(seq, "full", blocks, blocks) == {i for i, n in enumerate(names)
                                                  if n.startswith("/transformer/h.")}
    plain, ckpt = (predict(TrainingJob(model=seq, batch_size=4, device="h100-sxm",
                                       precision="amp-bf16", activation_checkpointing=a))
                   for a in (None, "full"))
    each = saved(seq, blocks, 0.5)  # flash attention's blocks, as priced
    inside = float(each[in_layers(seq, blocks)].sum())
    assert 0 < (plain.memory_gb - ckpt.memory_gb) * 1e9 <= inside * (1 + 1e-9)
    bare = convert(attention(seq=8, dim=16), batch_size=2, fuse=True)
    assert rerun(bare, "full", attention_blocks(bare), []) == set(range(bare.num_ops))


def test_full_checkpointing_skips_a_frozen_layer_autograd_runs_no_backward_through():
    """A frozen first layer (its parameters and everything before it frozen) records nothing
    for a checkpoint to run again: only the trained layers are; their count in the note."""
    pytest.importorskip("transformers")
    from converters import convert, from_hf_config
    from converters.attention import attention_blocks
    from converters.sequence import FROZEN_KEY
    from mdot_jax import TrainingJob, predict
    from mdot_jax.gpu.recompute import rerun

    gpt2 = dict(model_type="gpt2", n_embd=64, n_layer=3, n_head=4, vocab_size=5000,
                n_positions=64, bos_token_id=0, eos_token_id=0)
    proto = from_hf_config(gpt2, seq_len=64, repeat=False)
    params = {p.key: p.value for p in proto.metadata_props}["mdot.params"].split(",")
    seqs = {}
    for frozen in (("transformer.wte", "transformer.wpe"),
                   ("transformer.wte", "transformer.wpe", "transformer.h.0.")):
        proto.metadata_props.add(key=FROZEN_KEY,
                                 value=",".join(p for p in params if p.startswith(frozen)))
        seqs[len(frozen)] = convert(proto, batch_size=4, fuse=True)
        del proto.metadata_props[-1]
    layers = {}
    for k, seq in seqs.items():
        blocks = attention_blocks(seq)
        names = [str(n) for n in seq.node_names]
        layers[k] = {names[i].split("/")[2] for i in rerun(seq, "full", blocks, blocks)}
    assert layers == {2: {"h.0", "h.1", "h.2"}, 3: {"h.1", "h.2"}}
    p = predict(TrainingJob(model=seqs[3], batch_size=4, device="h100-sxm",
                            precision="amp-bf16", activation_checkpointing="full"))
    assert any(w.startswith("activation checkpointing over 2 layers") for w in p.warnings)


def test_the_fit_is_judged_on_the_memory_as_finally_priced(tmp_path):
    """FSDP shards the state: a step that does not fit one GPU may fit each of eight, and the
    warning follows the memory in the table, not the one GPU's step it was priced from."""
    from mdot_jax import TrainingJob, predict

    _gpt2(tmp_path / "m.onnx", 64, n_layer=4, n_embd=512, n_head=8, n_positions=64)
    spec = dict(gpus.find("l4").to_json(), name="small", aliases=[], memory_gb=0.25)
    (tmp_path / "g.json").write_text(json.dumps(spec))
    one, eight = predict(TrainingJob(model=str(tmp_path / "m.onnx"), batch_size=1, gpus=(1, 8),
                                     device_spec=str(tmp_path / "g.json"), strategy="fsdp"))
    assert one.memory_gb > 2 * 0.25 > 0.25 > eight.memory_gb  # 0.53 and 0.22 GB (the loss's
    # fp32 logits of 50,257 classes, unsharded, among them)
    assert any("will not fit" in w for w in one.warnings)
    assert not any("not fit" in w for w in eight.warnings)


@pytest.mark.parametrize("links,extra", [(dict(pcie_gbs=0), {}),
                                         (dict(pcie_gbs=0), dict(nodes=2)),
                                         (dict(pcie_gbs=0, nvlink_gbs=600, nvswitch=True),
                                          dict(interconnect="pcie"))])
def test_a_spec_without_the_link_its_gpus_need_is_one_named_error(tmp_path, links, extra):
    """A --device-spec may leave out its links; data parallelism over them is refused by name
    (it divided by the missing bandwidth)."""
    from onnx_builders import attention

    from mdot_jax import RequestError, TrainingJob, predict

    onnx.save(attention(seq=16, dim=32), tmp_path / "m.onnx")
    spec = dict(gpus.find("l4").to_json(), name="mine", aliases=[], **links)
    (tmp_path / "g.json").write_text(json.dumps(spec))
    job = dict(model=str(tmp_path / "m.onnx"), batch_size=2, device_spec=str(tmp_path / "g.json"))
    assert predict(TrainingJob(**job)).iteration_ms > 0  # one GPU needs no link
    with pytest.raises(RequestError, match="^device_spec: the mine has no pcie_gbs") as e:
        predict(TrainingJob(**job, gpus=8, **extra))
    assert e.value.field == "device_spec"


def test_a_device_spec_from_python_is_the_object_its_file_holds(tmp_path):
    """`TrainingJob(device_spec=...)` takes the JSON object itself (the service's form) and
    prices it as the file; an empty or bad one is refused by the field, never ignored."""
    from onnx_builders import attention

    from mdot_jax import RequestError, TrainingJob, predict

    onnx.save(attention(seq=16, dim=32), tmp_path / "m.onnx")
    spec = dict(gpus.find("l4").to_json(), name="mine", aliases=[])
    (tmp_path / "g.json").write_text(json.dumps(spec))
    job = dict(model=str(tmp_path / "m.onnx"), batch_size=2)
    by_file = predict(TrainingJob(**job, device_spec=str(tmp_path / "g.json")))
    by_object = predict(TrainingJob(**job, device_spec=spec))
    assert by_object.device == "mine" and by_object.iteration_ms == by_file.iteration_ms
    for bad, needle in (({}, "missing field"), (dict(spec, sms=0), "'sms' is 0")):
        with pytest.raises(RequestError, match=f"^device_spec: .*{needle}") as e:
            predict(TrainingJob(**job, device_spec=bad))
        assert e.value.field == "device_spec"


def test_the_nvlink_constants_are_the_fit_of_xlas_measured_collectives(tmp_path):
    """`bench_collectives.py` fits them on XLA's H100 table; the shipped ones round the fit."""
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "xla-h100-tables"
    if not (data / "collectives.csv").exists():
        pytest.skip("XLA's H100 tables are not beside the checkout")
    module = bench("bench_collectives")
    assert module.main([str(data), "--out", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "results.json").read_text())
    assert got["fitted"]["efficiency"] == pytest.approx(NVLINK_EFFICIENCY, abs=0.005)
    assert got["fitted"]["latency_us"] == pytest.approx(3.5, abs=0.05)
    assert max(got["mape_shipped"].values()) < min(got["mape_datasheet"].values())


def test_a_ring_that_leaves_the_node_shares_its_network():
    """Eight rings of a node's eight GPUs (tensor parallel 8, data parallel across nodes) each
    get an eighth of the node's network; one ring over the nodes gets all of it."""
    from mdot_jax.gpu.parallel import group_link

    h100 = gpus.find("h100-sxm")
    one = group_link(h100, 8, 4, None, 100.0, 32, 1)
    eight = group_link(h100, 8, 4, None, 100.0, 4, 8)
    inside = group_link(h100, 8, 4, None, 100.0, 8, 1)
    assert (one.name, one.gbs) == ("network", 100.0)
    assert (eight.name, eight.gbs) == ("network", 12.5)
    assert inside.name == "nvlink"
    # a step's latency: the mean of the ring's hops (NCCL's rings cross a node once)
    from mdot_jax.gpu.parallel import LATENCY_US

    assert inside.latency_s == pytest.approx(LATENCY_US["nvlink"] * 1e-6)  # in one node
    assert one.latency_s == pytest.approx((7 * LATENCY_US["nvlink"] + LATENCY_US["network"])
                                          / 8 * 1e-6)
    assert eight.latency_s == pytest.approx(LATENCY_US["network"] * 1e-6)  # one GPU a node


def test_an_allreduce_across_many_nodes_is_nccls_tree_where_it_is_faster():
    """NCCL picks its ring or its tree per call: a group in one node has no tree (vTrain's
    single-node rows unchanged), a small bucket over 512 nodes is the tree's (latency
    2 (7 NVLink hops + log2 512 tree hops)), a large all-reduce over two nodes the ring's, and
    a gather or reduce-scatter (`tree=False`) is always the ring's."""
    from mdot_jax.gpu.parallel import LATENCY_US, TREE_HOP, TREE_SHARE, group_link

    h100 = gpus.find("h100-sxm")

    def ring(nbytes, n, link, buckets):
        return 1e3 * (2 * (n - 1) / n * nbytes / (link.gbs * 1e9)
                      + 2 * (n - 1) * link.latency_s * buckets)

    inside = group_link(h100, 8, 4, None, 400.0, 8, 1)
    assert inside.tree_latency_s is None
    assert allreduce_ms(1e9, 8, inside, 40) == pytest.approx(ring(1e9, 8, inside, 40))
    wide = group_link(h100, 8, 512, None, 400.0, 4096, 1)
    tree_s = 2 * (7 * LATENCY_US["nvlink"] + 9 * TREE_HOP * LATENCY_US["network"]) * 1e-6
    assert wide.tree_latency_s == pytest.approx(tree_s)
    bucket = BUCKET_MB * 2 ** 20
    assert allreduce_ms(bucket, 4096, wide, 1) == pytest.approx(
        1e3 * (2 * bucket / (TREE_SHARE * wide.gbs * 1e9) + tree_s))
    assert allreduce_ms(bucket, 4096, wide, 1) < ring(bucket, 4096, wide, 1) / 10
    assert allreduce_ms(bucket, 4096, wide, 1, tree=False) == pytest.approx(
        ring(bucket, 4096, wide, 1))
    two = group_link(h100, 8, 2, None, 400.0, 16, 1)
    assert allreduce_ms(4e9, 16, two, 1) == pytest.approx(ring(4e9, 16, two, 1))
    # DDP over 512 nodes: its buckets' all-reduces hide behind the backward again; FSDP's
    # gathers and reduce-scatters stay rings, latency-bound there
    one = _one(backward=50.0)
    ddp = data_parallel(one, 10 ** 8, h100, 8, 512, network_gbs=400.0)
    fsdp = data_parallel(one, 10 ** 8, h100, 8, 512, network_gbs=400.0, strategy="fsdp")
    assert ddp.iteration_ms < 1.1 * one.iteration_ms < fsdp.iteration_ms


def test_the_network_between_nodes_defaults_to_the_gpus_dgx_and_says_so():
    """Unless told, an H100's nodes are joined as a DGX H100's (eight 400 Gb/s NICs: 400 GB/s a
    node), a GPU of no DGX by one 200 Gb/s NIC (25 GB/s); a note says which; told, as told."""
    from mdot_jax import TrainingJob, predict

    model = attention(seq=64, dim=1024)
    job = dict(model=model, batch_size=8, gpus=8, nodes=4)
    notes = {}
    for device, told in (("h100-sxm", None), ("l4", None), ("h100-sxm", 25.0)):
        p = predict(TrainingJob(**job, device=device, network_gbs=told))
        notes[device, told] = ([w for w in p.warnings if w.startswith("network: ")],
                               p.phases["communication"])
    assert gpus.find("h100-sxm").network_gbs == 400 and gpus.find("l4").network_gbs == 0
    (h100, ms), (l4, _), (told, ms_told) = notes.values()
    assert len(h100) == 1 and "400 GB/s a node" in h100[0] and "DGX" in h100[0]
    assert len(l4) == 1 and "25 GB/s a node" in l4[0] and "one 200 Gb/s NIC" in l4[0]
    assert told == [] and ms_told > 2 * ms  # a sixteenth of the bandwidth
    one_node = predict(TrainingJob(**dict(job, nodes=1), device="h100-sxm"))
    assert not any(w.startswith("network: ") for w in one_node.warnings)


def test_a_network_no_system_has_is_priced_as_given_and_said():
    """`network_gbs 1e-9` (a unit slipped) prices a step of years: a note says the value lies
    outside what any system has; one inside it says nothing."""
    from mdot_jax import TrainingJob, predict

    job = dict(model=attention(seq=64, dim=1024), batch_size=8, gpus=8, nodes=4,
               device="h100-sxm")
    slipped, real = (predict(TrainingJob(**job, network_gbs=n)) for n in (1e-9, 50.0))
    said = [w for w in slipped.warnings if w.startswith("network_gbs 1e-09: outside")]
    assert len(said) == 1 and "400 Gb/s NIC is 50" in said[0]
    assert slipped.iteration_ms > 1e6 * real.iteration_ms  # priced as given
    assert not any(w.startswith("network_gbs") for w in real.warnings)


def test_more_gpus_than_any_cluster_holds_are_priced_as_given_and_said():
    """`nodes 100000000` (GPUs given as nodes, zeros too many) prices 800 million GPUs: a note
    says no cluster holds them; 8 x 16,384 nodes says nothing."""
    from mdot_jax import TrainingJob, predict

    job = dict(model=attention(seq=64, dim=1024), batch_size=8, gpus=8, device="h100-sxm")
    slipped, real = (predict(TrainingJob(**job, nodes=n)) for n in (10 ** 8, 16_384))
    said = [w for w in slipped.warnings if w.startswith("gpus x nodes 800,000,000: more GPUs")]
    assert len(said) == 1 and slipped.gpus == 8 * 10 ** 8
    assert not any(w.startswith("gpus x nodes") for w in real.warnings)


def test_zero_stages_shard_more_and_move_what_they_must():
    """DDP keeps everything on every GPU; ZeRO-1 shards the optimizer state, ZeRO-2 the
    gradients too, FSDP the weights too: memory falls stage by stage; ZeRO-1/2 move an
    all-reduce's bytes, FSDP half as much again; none is faster than its compute."""
    h100, params = gpus.find("h100-sxm"), 10 ** 9
    one = _one(backward=50.0)
    one = dataclasses.replace(one, memory_gb=30.0, phases=dict(one.phases, update=4.0))
    got = {s: data_parallel(one, params, h100, 8, strategy=s, optimizer="adamw")
           for s in ("ddp", "zero1", "zero2", "fsdp")}
    memory = [got[s].memory_gb for s in ("ddp", "zero1", "zero2", "fsdp")]
    assert memory == sorted(memory, reverse=True) and len(set(memory)) == 4
    # adamw: 2 state tensors of fp32; ZeRO-1 frees 7/8 of them on each of 8 GPUs
    assert got["ddp"].memory_gb - got["zero1"].memory_gb == pytest.approx(
        4.0 + 2 * 4.0 * 7 / 8 - BUCKET_MB * 2 ** 20 / 1e9)
    for s, p in got.items():
        assert p.iteration_ms >= one.iteration_ms - one.phases["update"]
        assert (p.phases["update"] < one.phases["update"]) == (s != "ddp")
        assert p.phases["communication"] > 0 and 0 < p.scaling_efficiency <= 1
    ms = {s: float(re.search(r"\(([\d.e+]+) ms,", got[s].warnings[-1])[1]) for s in got}
    assert ms["zero1"] == pytest.approx(ms["ddp"], rel=0.01)  # the warning's 3 figures
    assert ms["fsdp"] == pytest.approx(1.5 * ms["ddp"], rel=0.01)
    # ZeRO-2 reduce-scatters every micro-batch, ZeRO-1 once an iteration
    four = _one(backward=200.0)
    z1, z2 = (data_parallel(four, params, h100, 8, strategy=s, grad_accum=4) for s in
              ("zero1", "zero2"))
    assert z2.phases["communication"] > z1.phases["communication"]


def test_a_zero_bucket_holds_no_more_than_the_trained_parameters():
    """ZeRO's reduce and gather buffers fill with the trained parameters: a LoRA fine-tune's
    few (0.1% of 10^8 here) never need a whole 25 MB bucket, so ZeRO-1 holds no more than
    DDP (it held 26 MB more, the state it frees being smaller than a bucket)."""
    h100, params, trained = gpus.find("h100-sxm"), 10 ** 8, 1e-3
    one = dataclasses.replace(_one(backward=50.0), memory_gb=3.0)
    ddp, zero1 = (data_parallel(one, params, h100, 8, strategy=s, optimizer="sgd",
                                trained=trained) for s in ("ddp", "zero1"))
    assert zero1.memory_gb <= ddp.memory_gb
    assert zero1.memory_parts["working"] - one.memory_parts.get("working", 0.0) \
        == pytest.approx(trained * 4 * params / 1e9)


def test_fsdp_at_amp_moves_the_half_types_bytes():
    """FSDP's mixed-precision policy gathers the weights in the half type (the casts priced by
    `price(half_weights=True)`) and reduces the gradients so: half the bytes of fp32."""
    from mdot_jax.gpu.parallel import LATENCY_US

    h100, one = gpus.find("h100-sxm"), _one(backward=50.0)
    ms = {}
    for precision in ("fp32", "amp-bf16"):
        p = data_parallel(one, 10 ** 9, h100, 8, strategy="fsdp", precision=precision,
                          units=12)
        ms[precision] = float(re.search(r"\(([\d.e+]+) ms,", p.warnings[-1])[1])
    latency = 3 * 12 * 7 * LATENCY_US["nvlink"] * 1e-3  # ms: three rings a unit, not halved
    assert ms["amp-bf16"] - latency == pytest.approx((ms["fp32"] - latency) / 2, rel=0.01)
    assert "in the half type" in p.warnings[-1]


def test_fsdp_pays_a_rings_latency_per_collective_of_a_unit_not_per_ddp_bucket():
    """A 70B model's FSDP over 64 GPUs on 8 nodes: each unit's all-gathers and reduce-scatter
    are one ring collective each (N - 1 steps of the network's latency); DDP's 25 MB buckets
    (11,200 of a 70B model's fp32 gradients) are not FSDP's: they doubled the price."""
    from mdot_jax.gpu.parallel import LATENCY_US

    h100, params, units, n, gbs = gpus.find("h100-sxm"), 70 * 10 ** 9, 81, 64, 50.0
    p = data_parallel(_one(backward=2000.0), params, h100, 8, 8, network_gbs=gbs,
                      strategy="fsdp", precision="amp-bf16", units=units)
    total = float(re.search(r"\(([\d.e+]+) ms,", p.warnings[-1])[1])
    hop = (7 * LATENCY_US["nvlink"] + LATENCY_US["network"]) / 8 * 1e-6  # 8 GPUs a node
    ring = 3 * (n - 1) / n * 2 * params / (gbs * 1e9) + 3 * units * (n - 1) * hop
    assert 1e3 * ring == pytest.approx(total, rel=0.01)


def test_fsdp_gathers_unit_by_unit_and_holds_three_units():
    """FSDP wraps each layer (and the root) as a unit: the first unit's gather and the last
    reduce-scatter show however long the compute; it holds a unit's weights, the next one's and
    the unit's gradients in flight. Without layers, DDP's buckets as before."""
    h100, params = gpus.find("h100-sxm"), 10 ** 10
    one = dataclasses.replace(_one(backward=2000.0), phases=dict(forward=1000.0, backward=2000.0))
    buckets = data_parallel(one, params, h100, 8, strategy="fsdp", precision="amp-bf16")
    units = data_parallel(one, params, h100, 8, strategy="fsdp", precision="amp-bf16", units=11)
    total = float(re.search(r"\(([\d.e+]+) ms,", units.warnings[-1])[1])
    assert units.phases["communication"] == pytest.approx(total / 11, rel=0.01)  # a unit
    assert units.phases["communication"] > 10 * buckets.phases["communication"]
    assert "11 units (its layers and the root)" in units.warnings[-1]
    assert units.memory_gb - buckets.memory_gb == pytest.approx(
        3 * 2 * params / 11 / 1e9 - BUCKET_MB * 2 ** 20 / 1e9)


def test_hsdp_shards_within_a_node_and_all_reduces_the_shards_across_nodes():
    """HSDP (FSDP's HYBRID_SHARD): FSDP over a node's 8 GPUs, each reduced gradient shard
    all-reduced over the 4 nodes (8 rings through a node's network at once); on one node it is
    FSDP; against FSDP over all 32 it holds more and moves less over a slow network."""
    h100, params, units, gbs = gpus.find("h100-sxm"), 7 * 10 ** 9, 33, 25.0
    one = dataclasses.replace(_one(backward=0.0), memory_gb=60.0,
                              phases=dict(forward=0.0, backward=0.0, update=8.0))
    kw = dict(network_gbs=gbs, precision="amp-bf16", optimizer="adamw", units=units)
    hsdp, fsdp = (data_parallel(one, params, h100, 8, 4, strategy=s, **kw)
                  for s in ("hsdp", "fsdp"))
    node = [data_parallel(one, params, h100, 8, 1, strategy=s, **kw) for s in ("hsdp", "fsdp")]
    assert node[0].iteration_ms == node[1].iteration_ms and node[0].memory_gb == \
        node[1].memory_gb
    assert hsdp.warnings[-1].startswith("hsdp: weight all-gathers (forward and backward) and "
                                        "gradient reduce-scatter in the half type within a "
                                        "node's 8 replicas, each reduced shard all-reduced "
                                        "over the 4 nodes, 32 GPUs in all (")
    # nothing hidden (no compute): the gathers and reduce-scatter in the node, plus the shards'
    inside = allreduce_ms(2.0 * params, 8, ring_link(h100, 8, 1, None), units) / 2
    across = allreduce_ms(2.0 * params / 8, 4, Link("network", gbs / 8, 10e-6), units)
    assert hsdp.phases["communication"] == pytest.approx(3 * inside + across, rel=1e-6)
    assert hsdp.phases["communication"] < fsdp.phases["communication"] / 1.5
    # sharded 8 ways, not 32: the update over an eighth, more memory
    assert hsdp.phases["update"] == pytest.approx(1.0) and fsdp.phases["update"] == \
        pytest.approx(0.25)
    assert hsdp.memory_gb > fsdp.memory_gb + 16 * params * (1 / 8 - 1 / 32) / 1e9 * 0.99
    from mdot_jax import TrainingJob
    from mdot_jax.errors import RequestError
    with pytest.raises(RequestError, match="^ep 2: expert parallelism is priced with strategy"):
        TrainingJob(model="m.onnx", batch_size=2, gpus=8, nodes=2, ep=2, strategy="hsdp")


def test_experts_split_over_ep_replicas_reduce_over_the_replicas_sharing_them():
    """Expert parallelism: a GPU's experts (1/ep of the model's, as its step was priced) are
    reduced over the n / ep replicas holding the same ones, the rest over all n; ZeRO-1 shards
    their optimizer state over those replicas only. ep 1: the model as it is, whatever share
    its experts are."""
    h100, params, held = gpus.find("h100-sxm"), 3 * 10 ** 9, 10 ** 9  # a GPU's; its experts'
    one = dataclasses.replace(_one(backward=500.0), memory_gb=100.0,
                              phases=dict(forward=250.0, backward=500.0, update=40.0))
    for strategy in ("ddp", "zero1"):
        plain = data_parallel(one, params, h100, 8, strategy=strategy, optimizer="adamw")
        assert data_parallel(one, params, h100, 8, strategy=strategy, optimizer="adamw",
                             experts=held) == plain
        split = [data_parallel(one, params, h100, 8, strategy=strategy, optimizer="adamw",
                               experts=held, ep=ep) for ep in (2, 8)]
        ms = [float(re.search(r"\(([\d.e+]+) ms,", p.warnings[-1])[1]) for p in (plain, *split)]
        assert ms[0] > ms[1] > ms[2]  # the experts' bytes over 4 replicas, then over none
        assert ms[2] == pytest.approx(ms[0] * (params - held) / params, rel=0.01)
    # ZeRO-1 over 8 replicas: AdamW's 2 states of the experts sharded over 1 (ep 8), not 8;
    # each GPU updates its shard: an eighth of the rest, all of its experts
    assert split[1].memory_gb - plain.memory_gb == pytest.approx(2 * 4 * held / 1e9 * 7 / 8)
    assert split[1].phases["update"] == pytest.approx(40.0 * ((params - held) / 8 + held) / params)
    assert plain.phases["update"] == pytest.approx(40.0 / 8)


def test_expert_parallel_exchanges_each_layers_tokens_all_to_all():
    link = Link("nvlink", 100.0, 0.0)
    assert all_to_all_ms(8e8, 8, link) == pytest.approx(7 / 8 * 8e8 / 1e11 * 1e3)
    one = dataclasses.replace(_one(), grad_accum=4)
    moe = dict(experts=8, top_k=2, layers=6, params=1)
    p = expert_exchange(one, moe, 4, tokens=1024, width=512, act_bytes=2, stage_layers=3,
                        passes=3, link=link, inside=4, network=None)
    count = 2 * 3 * 3 * 4  # dispatch + combine, 3 passes, 3 layers, 4 micro-batches
    assert f"{count} all-to-alls of {1024 * 2 * 512 * 2 / 1e6:.3g} MB" in p.warnings[-1]
    assert p.phases["communication"] == pytest.approx(
        count * all_to_all_ms(1024 * 2 * 512 * 2, 4, link))
    assert p.iteration_ms == pytest.approx(one.iteration_ms + p.phases["communication"])
    # 16 GPUs over 2 nodes: 8/16 of the bytes leave the node, over a GPU's share of its NIC
    net = Link("network", 400.0 / 8, 0.0)
    assert all_to_all_ms(8e8, 16, link, 8, net) == pytest.approx(8 / 16 * 8e8 / 5e10 * 1e3)
