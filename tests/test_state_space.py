"""Mamba's state space layers exported as mamba_ssm's fused kernels (`converters.state_space`):
the same output as transformers' eager path, Mamba-2's C B^T once a group, Mamba-1's scan one
node of the kernel's FLOPs; said in the prediction."""

import numpy as np
import pytest

from converters import convert, from_hf_config
from converters.sequence import CONFIG_FIELDS
from converters.state_space import FUNCTION, SCAN, combined, selective_scan
from converters.substitutes import substituted

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")

MAMBA = dict(model_type="mamba", hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
             vocab_size=100, conv_kernel=4)
MAMBA2 = dict(model_type="mamba2", hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
              state_size=8, expand=2, n_groups=1, vocab_size=100, conv_kernel=4, chunk_size=16)


@pytest.mark.parametrize("groups, tokens", [(1, 64), (2, 50)])  # whole chunks; a padded one
def test_the_fused_scan_gives_what_transformers_eager_mixer_gives(groups, tokens):
    torch.manual_seed(0)
    fields = {k: v for k, v in MAMBA2.items() if k != "model_type"}
    model = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        **dict(fields, n_groups=groups))).train()
    mixer = model.backbone.layers[0].mixer
    with torch.no_grad():  # not the initial ones (D = 1, a norm of ones)
        for t in (mixer.dt_bias, mixer.A_log, mixer.D, mixer.norm.weight):
            t.normal_()
    x = torch.randn(2, tokens, 64)
    eager = mixer(x)  # no mamba_ssm here: transformers' eager path
    with substituted(model):
        assert getattr(mamba2, FUNCTION) is combined
        fused = mixer(x)
    assert getattr(mamba2, FUNCTION) is not combined  # restored
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-4)
    z = torch.zeros(1, 16, mixer.in_proj.out_features)  # a carried state: the caller's own path
    assert combined(z, mixer.conv1d.weight.squeeze(1), None, mixer.dt_bias, -mixer.A_log.exp(),
                    mixer.D, 16, return_final_states=True, headdim=16) is None


def test_the_scan_exports_as_one_node_of_the_fused_kernels_flops():
    """One ChunkScan a layer, its output shaped as its input: a chunk of Q tokens' C B^T once a
    group (2 Q^2 N) and a head's 2 Q^2 P + 4 Q N P, the states passed between the chunks
    (2 nc^2 P N a head), the skip; then the output projection. Transformers' eager path
    computes C B^T once a head, and its intermediates are no tensors of the step's."""
    seq_len, batch, q, n, p, heads, groups = 64, 2, 16, 8, 16, 8, 1
    seq = convert(from_hf_config(MAMBA2, seq_len=seq_len), batch_size=batch, fuse=True)
    assert seq.meta["linear_attention"] == FUNCTION and not seq.unknown_ops
    chunks = seq_len // q
    scan = batch * chunks * (groups * 2 * q * q * n + heads * (2 * q * q * p + 4 * q * n * p)) \
        + batch * heads * 2 * chunks * chunks * p * n + 2 * batch * seq_len * heads * p
    names = np.asarray(seq.op_names)
    np.testing.assert_allclose(seq.column("fwd_flops")[names == "ChunkScan"], [scan] * 2)
    assert "CumSum" not in names and sum(names == "Exp") == 2  # A = -exp(A_log) a layer: the
    # decays stay inside the kernel
    out = seq.config[names == "ChunkScan"][:, CONFIG_FIELDS.index("out_numel")]
    np.testing.assert_array_equal(out, batch * seq_len * heads * p)
    flops = [f for name, t, f in zip(seq.node_names, seq.op_names, seq.column("fwd_flops"))
             if t == "MatMul" and "/mixer/MatMul" in name]
    np.testing.assert_allclose(flops, [2 * batch * seq_len * heads * p * 64] * 2)  # out


def test_the_conv1d_and_the_gated_norm_are_one_kernel_each_reading_the_splits_in_place():
    """mamba_ssm's causal conv1d (with its silu) and gated RMSNorm: one node each a layer, one
    pass over their tensors; the pieces of the projected input they and the scan read are
    views (no copy priced), where the eager export copied them and ran a dozen kernels."""
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.fused import read_in_place
    from mdot_jax.gpu.spec_sheet import load_step_model, price

    seq = convert(from_hf_config(MAMBA2, seq_len=64), batch_size=2, fuse=True)
    names = np.asarray(seq.op_names)
    assert sum(names == "CausalConv1d") == sum(names == "GatedRMSNorm") == 2
    assert "Conv" not in names and sum(names == "ReduceMean") == 3  # the three block norms
    views = read_in_place(seq)
    assert {str(names[i]) for i in views} == {"Slice"}
    assert len(views) == 2 * 5  # z, xBC, x, B, C
    dt = [i for i in range(seq.num_ops) if names[i] == "Slice" and i not in views
          and "/mixer/" in seq.node_names[i]]
    assert len(dt) == 2  # dt's piece, read by eager kernels: a copy
    ops = price(seq, catalog.find("h100-sxm"), load_step_model(), precision="amp-bf16",
                optimizer="adamw").operators
    priced = {o["index"] for o in ops if "index" in o}
    assert not views & priced and set(dt) <= priced
    conv = next(o for o in ops if o["type"] == "CausalConv1d")
    c = seq.config[conv["index"]]
    assert c[CONFIG_FIELDS.index("out_numel")] == 2 * 64 * (128 + 2 * 8)  # x B C of a token


def test_a_mamba2_is_said_in_the_prediction(monkeypatch):
    from mdot_jax.gpu import spec_sheet
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seq = convert(from_hf_config(MAMBA2, seq_len=64), batch_size=2, seq_len=64, fuse=True)
    p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16"))
    assert any(w.startswith("Mamba-2 state space layers: priced as the work of mamba_ssm's fused")
               for w in p.warnings)
    assert any(w.startswith("2 chunked scans priced as fused kernels") for w in p.warnings)

    def scan_ms():
        return [o["ms"] for o in predict(TrainingJob(
            model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16",
            operators=True)).operators if o["type"] == "ChunkScan"]

    fused = scan_ms()
    monkeypatch.setattr(spec_sheet, "ON_CHIP_SCANS", {})  # priced as a stream of its bytes
    assert len(fused) == 2 and all(t > 0 for t in fused) and fused != scan_ms()


def test_a_model_without_attention_is_split_and_checkpointed_by_its_layer_stack():
    """Mamba-2 has no attention blocks: its layers are its stack's (`/backbone/layers.k/`), so
    FSDP shards it layer by layer, a pipeline cuts it, full checkpointing keeps a layer's
    input; tensor parallelism and selective checkpointing (attention cores) are one-line
    refusals."""
    from converters.attention import attention_blocks, layer_starts
    from mdot_jax import RequestError
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seq = convert(from_hf_config(dict(MAMBA2, num_hidden_layers=4), seq_len=64), batch_size=2,
                  seq_len=64, fuse=True)
    starts = layer_starts(seq, attention_blocks(seq))
    assert len(starts) == 4 and starts == sorted(starts)
    assert all(f"/layers.{k}/" in seq.node_names[i] for k, i in enumerate(starts))

    def priced(**job):
        return predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm",
                                   precision="amp-bf16", **job))

    assert any("in 5 units (its layers" in w for w in priced(gpus=8, strategy="fsdp").warnings)
    assert any(w.startswith("2 pipeline stages") and "2 layers on the slowest stage" in w
               for w in priced(gpus=2, pp=2, grad_accum=4).warnings)
    plain, full = priced(), priced(activation_checkpointing="full")
    assert 0 < full.phases["recomputation"] < plain.phases["forward"]  # not the head's
    assert full.memory_gb < plain.memory_gb
    for job, needle in ((dict(gpus=2, tp=2), "tp 2: does not divide the model's 1 state space "
                                             "groups"),
                        (dict(activation_checkpointing="selective"), "has none")):
        with pytest.raises(RequestError, match=needle):
            priced(**job)


def test_tensor_parallel_splits_a_mamba2s_heads_and_groups():
    """The graph says its mixers' heads and groups (what Megatron-LM's tensor parallelism must
    divide); split two ways, a GPU runs half of every matrix product and holds half the
    parameters."""
    from mdot_jax import RequestError
    from mdot_jax.gpu.model_parallel import shard
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seq = convert(from_hf_config(dict(MAMBA2, n_groups=2), seq_len=64), batch_size=2, fuse=True)
    assert seq.meta["state_space"] == dict(heads=8, groups=2)
    half = shard(seq, 2)
    assert half.flops_by_type()["MatMul"] == pytest.approx(seq.flops_by_type()["MatMul"] / 2)
    assert half.params == pytest.approx(seq.params / 2, rel=0.01)
    p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", gpus=2, tp=2,
                            precision="amp-bf16"))
    assert any("2-way tensor parallel" in w for w in p.warnings)
    with pytest.raises(RequestError, match="tp 4: does not divide the model's 2 state space"):
        predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", gpus=4, tp=4))


NEMOTRON_H = dict(model_type="nemotron_h", hidden_size=256, num_hidden_layers=4,
                  hybrid_override_pattern="M-M*", num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, vocab_size=1000, mamba_num_heads=8, mamba_head_dim=32, n_groups=2,
                  ssm_state_size=16, chunk_size=64, intermediate_size=512)


def test_tensor_parallel_all_reduces_once_a_sublayer(monkeypatch):
    """Megatron-LM all-reduces after each row-parallel sublayer: twice in a transformer's layer
    (attention, MLP), once in each of Nemotron-H's single-mixer layers (Mamba, MLP,
    attention); the embedding's forward and the head's backward once each either way."""
    import re

    import mdot_jax.gpu.model_parallel as model_parallel
    from converters.attention import attention_blocks, layer_starts, sublayers
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    gpt2 = convert(from_hf_config(dict(model_type="gpt2", n_layer=4, n_embd=256, n_head=4,
                                       vocab_size=1000, n_positions=64), seq_len=64),
                   batch_size=2, fuse=True)
    hybrid = convert(from_hf_config(NEMOTRON_H, seq_len=64), batch_size=2, fuse=True)
    for seq, each in ((gpt2, 2), (hybrid, 1)):
        assert sublayers(seq, layer_starts(seq, attention_blocks(seq))) == [each] * 4

    def all_reduces_ms():
        p = predict(TrainingJob(model=hybrid, batch_size=2, device="h100-sxm", gpus=2, tp=2,
                                precision="amp-bf16"))
        return float(re.search(r"tensor-parallel all-reduces ([\d.e+-]+) ms",
                               " ".join(p.warnings))[1])

    once = all_reduces_ms()
    monkeypatch.setattr(model_parallel, "sublayers", lambda seq, starts: [2] * len(starts))
    assert all_reduces_ms() == pytest.approx(once * (2 * 4 * 2 + 2) / (1 * 4 * 2 + 2), rel=0.02)


@pytest.mark.parametrize("name", ["mamba", "falcon_mamba", "jamba"])
def test_mamba1s_scan_gives_what_transformers_loop_gives(name):
    """Mamba, Falcon-Mamba and Jamba's mixers with the scan substituted: the same output as
    their token loop (random A, D and dt bias, not the initial ones)."""
    torch.manual_seed(0)
    module = pytest.importorskip(f"transformers.models.{name}.modeling_{name}")
    fields = dict(hidden_size=32, num_hidden_layers=2, vocab_size=100, expand=2)
    fields |= dict(mamba_d_state=8, mamba_expand=2, num_attention_heads=4, attn_layer_period=8,
                   attn_layer_offset=4, intermediate_size=64) if name == "jamba" else \
        dict(state_size=8)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(name, **fields)).train()
    mixer = next(m for m in model.modules() if hasattr(m, "A_log"))
    with torch.no_grad():
        for t in (mixer.A_log, mixer.D, mixer.dt_proj.bias):
            t.normal_()
    x = torch.randn(2, 24, 32)
    eager = mixer(x)
    with substituted(model) as names:
        assert names == [SCAN] and getattr(module, SCAN) is selective_scan
        fused = mixer(x)
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-4)


def test_mamba1_exports_one_scan_node_a_layer_and_is_priced():
    """No token loop: one SelectiveScan a layer whatever the tokens, 9 B L D N FLOPs each (plus
    the skip and the gate), its output shaped as its input; priced, and said."""
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    seqs = {t: convert(from_hf_config(MAMBA, seq_len=t), batch_size=2, fuse=True) for t in (32, 64)}
    assert seqs[32].num_ops == seqs[64].num_ops
    seq = seqs[64]
    assert seq.meta["linear_attention"] == SCAN and not seq.unknown_ops
    scans = seq.column("fwd_flops")[np.asarray(seq.op_names) == "SelectiveScan"]
    width = 2 * 32  # expand x hidden
    np.testing.assert_allclose(scans, 9 * 2 * 64 * width * 8 + 2 * 2 * 64 * width)
    assert len(scans) == 2
    p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", precision="amp-bf16",
                            gpus=2, pp=2, grad_accum=2))
    assert p.iteration_ms > 0
    assert any(w.startswith("Mamba-1 state space layers: priced as the work of mamba_ssm's "
                            "selective scan")
               for w in p.warnings)
