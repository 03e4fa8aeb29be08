"""A step compiled with torch.compile (`mdot_jax.gpu.compiled`): the memory-bound operators
between GEMMs fused into generated kernels that move only what enters and leaves them; GEMMs,
attention and embeddings as eager runs them; never more memory kept than eager keeps."""

import dataclasses
import json

import numpy as np
import pytest

from converters import convert, from_hf_config
from converters.attention import attention_blocks
from converters.sequence import CONFIG_FIELDS
from mdot_jax import TrainingJob, predict
from mdot_jax.cli import main
from mdot_jax.errors import RequestError
from mdot_jax.gpu import catalog, compiled
from mdot_jax.gpu.classify import classified
from mdot_jax.gpu.spec_sheet import load_step_model, price

pytest.importorskip("transformers")

GPT2 = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=128,
            activation_function="gelu_new")  # tanh's GELU: eight operators between GEMMs


@pytest.fixture(scope="module")
def gpt2():
    seq = convert(from_hf_config(GPT2, seq_len=64), batch_size=2)
    return seq, dataclasses.replace(seq, meta=dict(seq.meta, **{compiled.KEY: True}))


def test_the_operators_between_gemms_are_fused_where_one_kernel_can_hold_them(gpt2):
    eager, seq = gpt2
    assert compiled.fusing(eager, []) == []  # not compiled: no group
    groups = compiled.fusing(seq, [])
    names, kinds = seq.op_names, [k for k, _, _ in classified(seq)]
    preds, _ = seq.neighbours()

    def sources(i):  # the operators `i` reads, through views
        out = []
        for j in preds.get(i, []):
            out += sources(j) if kinds[j] == "free" else [j]
        return out

    members = {i: n for n, g in enumerate(groups) for i in g.members}
    for n, g in enumerate(groups):  # nothing read from outside that ran after the group began
        assert all(j < g.members[0] for i in g.members for j in sources(i)
                   if members.get(j) != n)
        assert all(kinds[i] in compiled.FUSIBLE or names[i] in compiled.ROW_MEANS
                   for i in g.members)
    gelu = [members[i] for i in np.flatnonzero(np.isin(names, ["Pow", "Tanh"]))]
    assert len(gelu) == 4 and len(set(gelu)) == 2  # each layer's GELU in one kernel
    tanh = int(np.flatnonzero(names == "Tanh")[0])
    assert len(groups[members[tanh]].members) == 8
    # each LayerNorm with the residual Add before it (the stream's only store between GEMMs)
    for ln in np.flatnonzero(names == "LayerNormalization")[1:]:
        assert any(names[j] == "Add" and members.get(j) == members[ln] for j in sources(ln))
    assert not any(kinds[i] in ("linear", "bmm", "embedding") for i in members)


def test_a_norm_written_out_in_code_is_one_reduction_kernel():
    """A Llama's RMSNorm (the upcast, square, mean, root, scaling, weight) fuses whole, its
    mean the one reduction, over a row a token."""
    llama = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                 max_position_embeddings=128)
    seq = convert(from_hf_config(llama, seq_len=64), batch_size=2, fuse=True)
    seq = dataclasses.replace(seq, meta=dict(seq.meta, **{compiled.KEY: True}))
    groups = [g for g in compiled.fusing(seq, []) if "ReduceMean" in seq.op_names[list(g.members)]]
    assert len(groups) == 5
    for g in groups:
        assert {"Pow", "Sqrt", "Div", "Cast"} <= set(seq.op_names[list(g.members)])
        assert g.reductions == 1 and g.rows == 2 * 64


def test_a_compiled_step_runs_fewer_kernels_that_move_fewer_bytes(gpt2):
    eager, seq = gpt2
    model, gpu = load_step_model(), catalog.find("h100-sxm")
    blocks = attention_blocks(seq)
    runs = {}
    for name, s in (("eager", eager), ("compiled", seq)):
        kernels: list[float] = []
        p = price(s, gpu, model, precision="amp-bf16", optimizer="adamw", attention="flash",
                  blocks=blocks, kernels=kernels)
        runs[name] = (p, len(kernels))
    (pe, ke), (pc, kc) = runs["eager"], runs["compiled"]
    assert kc < 0.8 * ke and pc.iteration_ms < pe.iteration_ms
    assert pc.memory_gb <= pe.memory_gb
    assert any(w.startswith("torch.compile: ") for w in pc.warnings)
    assert not any("torch.compile" in w for w in pe.warnings)

    def of(p, *types):
        return sum(o["ms"] for o in p.operators if o["type"] in types)
    # the libraries' kernels are eager's; autocast's casts of softmax's and the norms' outputs
    # are stores of fused kernels now: fewer casts
    gemms = ("Gemm", "MatMul", "attention (fused)")
    assert of(pc, *gemms) == pytest.approx(of(pe, *gemms))
    assert 0 < of(pc, "casts") < of(pe, "casts")
    # the tanh-GELU's kernel reads the GEMM's output once and writes one tensor (eager: eight
    # kernels, each reading one or two tensors and writing one)
    group = next(g for g in compiled.fusing(seq, blocks) if len(g.members) == 8)
    out = float(seq.config[group.last, CONFIG_FIELDS.index("out_numel")])
    assert group.reductions == 0 and group.activations == group.left == out


def test_a_compiled_step_has_no_band_where_eagers_has_one(gpt2):
    """The bands were measured on eager steps: a compiled one's price is not banded."""
    model, gpu = load_step_model(), catalog.find("v100-sxm2-32gb")
    eager, fused = (price(s, gpu, model, attention="eager") for s in gpt2)
    assert eager.interval_ms is not None and fused.interval_ms is None


def test_memory_a_compiled_step_keeps_is_at_most_eagers(gpt2):
    from mdot_jax.serving.memory import saved

    eager, seq = gpt2
    for blocks in ([], attention_blocks(seq)):
        kept, before = saved(seq, blocks, 0.5), saved(eager, blocks, 0.5)
        assert kept.sum() < before.sum()
        groups = compiled.fusing(seq, blocks)
        for g in groups:  # a group keeps at most its inputs from outside it
            assert kept[list(g.members)].sum() <= 2.0 * g.activations + 1e-9


def test_a_group_keeps_the_fewest_tensors_its_backward_can_recompute_from(tmp_path):
    """AOTAutograd's partitioner saves the least cut, not every input: where a LoRA adapter's
    output is added to its frozen layer's before the GELU, the group keeps the sum, one
    tensor, not both addends (LoRA under compile was priced to keep 31% more activations than
    the full fine-tune: GPT-2, 2 x 512 tokens)."""
    g = compiled.Group(members=(2, 3, 4), reductions=0, rows=1, read=0.0, activations=2.0,
                       left=1.0, params=0, keeping=True, reads=((0, 1), (2,), (3,)),
                       numel=((0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)))
    assert compiled.least_cut(g, frozenset({3, 4})) == 1.0  # the sum, node 2
    assert compiled.least_cut(g, frozenset({2})) == 1.0
    wide = dataclasses.replace(g, numel=((0, 1.0), (1, 1.0), (2, 4.0), (3, 4.0), (4, 4.0)))
    assert compiled.least_cut(wide, frozenset({4})) == 2.0  # broadcast: the inputs are fewer
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2))
    job = dict(model=str(config), seq_len=64, batch_size=2, device="h100-sxm",
               precision="amp-bf16", compile=True)
    full, lora = (predict(TrainingJob(**job, lora_rank=r)).memory_parts["activations"]
                  for r in (None, 4))
    adapters = 2 * 4 * 64 * 4 * 2 * 4 / 1e9  # [2 x 64, 4] in and out of each of 4 a layer
    assert lora <= full + adapters


def test_compile_is_a_request_the_front_door_prices_or_refuses_in_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2))
    job = dict(model=str(config), seq_len=64, batch_size=2, device="h100-sxm",
               precision="amp-bf16", optimizer="adamw")
    eager, fused = predict(TrainingJob(**job)), predict(TrainingJob(**job, compile=True))
    assert fused.iteration_ms < eager.iteration_ms
    for bad, field in ((dict(compile="yes"), "compile"),
                       (dict(compile=True, framework="megatron"), "compile")):
        with pytest.raises(RequestError) as e:
            TrainingJob(**dict(job, **bad))
        assert e.value.field == field and "\n" not in str(e.value)
    with pytest.raises(RequestError, match="^compile: .*spec sheet"):  # a CPU's checkpoint
        predict(TrainingJob(**dict(job, device=None), compile=True))
    code = main(["predict", str(config), "--seq-len", "64", "--batch-size", "2", "--device",
                 "h100-sxm", "--precision", "amp-bf16", "--compile"])
    assert code == 0 and "torch.compile: " in capsys.readouterr().err


def test_measured_compiled_steps_are_rows_a_gpu_step_model_adapts_to(tmp_path):
    """`mdot adapt --from-measurements`: a `compile` column (true or false) says how each
    row's step ran; anything else is one named error."""
    from mdot_jax.errors import UsageError
    from mdot_jax.serving.measurements import read_measurements

    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "mine.csv").write_text("model,batch_size,seq_len,ms,compile\n"
                                       "m.onnx,8,64,10,TRUE\nm.onnx,8,64,14,false\n")
    rows = read_measurements(tmp_path / "mine.csv")
    assert [r.job for r in rows] == [(("compile", "true"),), (("compile", "false"),)]
    (tmp_path / "bad.csv").write_text("model,batch_size,seq_len,ms,compile\nm.onnx,8,64,10,yes\n")
    with pytest.raises(UsageError, match=r"line 2: column 'compile' is 'yes'; one of "
                                         r"\['true', 'false'\]"):
        read_measurements(tmp_path / "bad.csv")
