"""The exporter's symbolics we add or replace (`converters.symbolics`): each exported graph,
run by ONNX's reference evaluator, computes what PyTorch does (noise: its shape)."""

import numpy as np
import pytest
import torch

from converters import from_torch


def _run(module, *inputs):
    from onnx.reference import ReferenceEvaluator

    graph = from_torch(module, tuple(torch.as_tensor(x) for x in inputs))
    feeds = {f"input{i}": np.asarray(x) for i, x in enumerate(inputs)}
    return ReferenceEvaluator(graph).run(None, feeds)[0]


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _masked(x):
    m = x > 0
    m &= x < 1
    m |= x < -1
    m ^= x > 0.5
    return m


X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize("fn", [
    lambda x: torch.expm1(x),  # xIELU (Apertus)
    lambda x: x.permute(0, -2, -1, 1),  # negative axes (Mamba-2's chunked scan)
    lambda x: torch.repeat_interleave(x, 2, dim=-1).flatten(-2),
    lambda x: x * _masked(x),  # a mask's in-place &=, |=, ^= (torchvision's FCOS)
    lambda x: x @ x.mT + x.adjoint().mT @ x.mH,  # attention written with .mT
    lambda x: torch.logaddexp(x, 2 * x) + torch.hypot(x, x) + torch.xlogy(x.relu(), x.abs())
    + torch.copysign(x, -x) + torch.trunc(3 * x) + torch.frac(3 * x) + torch.sinc(x)
    + torch.addcdiv(x, x, x.abs() + 1, value=0.5),
    lambda x: torch.isin(x.round(), torch.tensor([0.0, 1.0])) ^ torch.isin(
        x.round(), torch.tensor([-1.0]), invert=True),  # token masks (Grounding DINO's)
    lambda x: torch.take_along_dim(x, x.argsort(-1), -1),  # ESMFold's
    lambda x: x.cumprod(-1) + torch.logcumsumexp(x, 1) + (x * 3).long().cumprod(2),
])
def test_a_symbolic_computes_what_torch_does(fn):
    np.testing.assert_allclose(_run(Fn(fn), X), fn(torch.from_numpy(X)).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_a_full_without_a_dtype_has_its_fills_type():
    """torch's symbolic made `torch.full(size, 1)` float: SmolVLM's position ids indexed its
    table by floats ("Gather ... indices ... unsupported type: tensor(float)")."""
    out = _run(Fn(lambda x: torch.full(x.shape[:2], 7)), X)
    assert out.dtype == np.int64 and out.shape == X.shape[:2] and (out == 7).all()


def test_sizes_read_after_an_unflatten_follow_the_batch():
    """torch's unflatten computes a negative dim in the graph, where the exporter lost the
    output's rank and froze every size read after it at the traced example's (Qwen4's
    hyper-connections): exported at batch 1, the graph must run at batch 3."""
    from onnx.reference import ReferenceEvaluator

    def mix(x):  # [B, T, 4 x 5] -> [B, T, 5]
        y = x.unflatten(-1, (4, 5)).mean(-2)
        b, t, _ = y.shape
        return y.reshape(b, t, -1)

    x = np.random.default_rng(3).standard_normal((3, 6, 20)).astype(np.float32)
    graph = from_torch(Fn(mix), torch.from_numpy(x[:1]))
    got = ReferenceEvaluator(graph).run(None, {"input0": x})[0]
    np.testing.assert_allclose(got, mix(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(7, 5), (20, 24)])
def test_an_antialiased_resize_computes_what_torch_does(mode, size):
    """`interpolate(..., antialias=True)` (DINOv2-with-registers' and SigLIP2's position
    tables) had no ONNX form: ONNX's antialiased Resize, exported at opset 18, down and up."""
    def resize(x):
        return torch.nn.functional.interpolate(x, size=size, mode=mode, antialias=True)

    x = np.random.default_rng(4).standard_normal((2, 3, 13, 11)).astype(np.float32)
    np.testing.assert_allclose(_run(Fn(resize), x), resize(torch.from_numpy(x)).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_grouped_query_attention_repeats_the_key_and_value_heads():
    q = np.random.default_rng(1).standard_normal((2, 4, 6, 8)).astype(np.float32)
    kv = np.random.default_rng(2).standard_normal((2, 2, 6, 8)).astype(np.float32)

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True)

    want = attend(*(torch.from_numpy(t) for t in (q, kv, kv))).numpy()
    np.testing.assert_allclose(_run(Fn(attend), q, kv, kv), want, rtol=1e-4, atol=1e-5)


def test_exponential_noise_has_the_shape_of_what_it_fills():
    def jitter(x):  # a router's sampling (PhiMoE)
        return x * torch.empty_like(x).exponential_()

    out = _run(Fn(jitter), X)
    assert out.shape == X.shape and np.isfinite(out).all()


def test_a_complex_rotary_computes_what_torch_does():
    """Llama 4's and DeepSeek-V2's rotary embeddings multiply complex numbers (polar,
    view_as_complex, view_as_real): exported as real pairs."""
    class ComplexRotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.rand(4))

        def forward(self, x):  # x [B, S, H, 8]
            freqs = torch.arange(x.shape[1]).float()[:, None] * self.inv_freq  # [S, 4]
            cis = (torch.polar(torch.ones_like(freqs), freqs) * 0.5).to(x.device)
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(xc * cis[None, :, None, :]).flatten(3)

    from onnx.reference import ReferenceEvaluator

    module = ComplexRotary()
    x = np.random.default_rng(3).standard_normal((2, 5, 3, 8)).astype(np.float32)
    got = ReferenceEvaluator(from_torch(module, torch.from_numpy(x))).run(
        None, {"input0": x, "inv_freq": module.inv_freq.numpy()})[0]
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)



def test_a_complex_buffer_exports_as_pairs_and_computes_what_torch_does():
    """Llama 4's vision rotary is a complex buffer, viewed and multiplied: the exporter took no
    complex input ("ScalarType ComplexFloat is an unexpected tensor scalar type"). It is a graph
    input of real pairs during the export; the module keeps its own buffers."""
    class BufferedRotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            angles = torch.rand(5, 1, 4)  # [S, 1, 4]
            self.register_buffer("cis", torch.polar(torch.ones_like(angles), angles),
                                 persistent=False)

        def forward(self, x):  # x [B, S, H, 8]
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(xc * self.cis.view(1, 5, 1, 4)).flatten(3)

    from onnx.reference import ReferenceEvaluator

    module = BufferedRotary()
    cis = module.cis
    x = np.random.default_rng(4).standard_normal((2, 5, 3, 8)).astype(np.float32)
    graph = from_torch(module, torch.from_numpy(x))
    assert module.cis is cis and list(module.state_dict()) == [] and \
        type(module) is BufferedRotary
    got = ReferenceEvaluator(graph).run(
        None, {"input0": x, "cis_pairs": torch.view_as_real(cis).numpy()})[0]
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fill", [False, 0.5, 3])
def test_a_scatter_of_a_python_scalar_exports_and_computes_what_torch_does(fill):
    """DeepSeek-V3.2's sparse attention mask, `ones.scatter(-1, topk, False)`, failed the
    tracer's alias analysis ("We don't have an op for aten::scatter ... bool")."""
    def mask(x):
        top = x.topk(2, dim=-1).indices
        dtype = torch.bool if fill is False else x.dtype
        return top.new_ones(x.shape, dtype=dtype).scatter(-1, top, fill).to(x.dtype) * x

    np.testing.assert_allclose(_run(Fn(mask), X), mask(torch.from_numpy(X)).numpy())
    assert torch.Tensor.scatter.__name__ == "scatter"  # restored after the export


class _Attending(torch.nn.Module):
    """Attention the module computes itself and through PyTorch's SDPA, in the order `kinds`
    gives ("own", "sdpa")."""

    def __init__(self, kinds=("own", "sdpa")):
        super().__init__()
        self.qkv, self.kinds = torch.nn.Linear(16, 48), kinds

    def forward(self, x):  # x [B, S, 16]
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = 0
        for kind in self.kinds:
            q = q + 1  # each its own
            out = out + ((q @ k.transpose(-2, -1) * 8 ** -0.5).softmax(-1) @ v if kind == "own"
                         else torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                              is_causal=True))
        return out


@pytest.mark.parametrize("kinds", [("own", "sdpa"), ("sdpa", "own", "sdpa", "sdpa", "own")])
def test_the_export_says_which_softmax_each_sdpa_call_made(kinds):
    """A model's code decides whether its attention is fused (SDPA) or computed as the graph
    shows it; both export as MatMul, Softmax, MatMul: the export records the SDPA calls'
    (counted from where the last call's count ended; a second export counts afresh)."""
    from converters import convert

    for _ in range(2):
        seq = convert(from_torch(_Attending(kinds), torch.randn(2, 6, 16)), batch_size=2,
                      fuse=True)
        softmax = [i for i, n in enumerate(seq.op_names) if n == "Softmax"]
        assert len(softmax) == len(kinds)
        assert seq.meta["sdpa_softmax"] == [i for i, k in zip(softmax, kinds) if k == "sdpa"]


def test_integers_drawn_in_the_shape_of_a_mask_are_integers_in_range():
    """RT-DETR's noised labels draw new classes shaped as a mask (`randint_like(mask, 0, C,
    dtype=long)`): torch's symbolic drew a bool tensor's uniform noise, which shape inference
    refused ("output has unsupported type tensor(bool)")."""
    from converters import convert

    def noised(labels):
        mask = torch.rand_like(labels, dtype=torch.float) < 0.5
        drawn = torch.randint_like(mask, 0, 5, dtype=labels.dtype)
        return torch.where(mask, drawn, labels) + torch.randint_like(labels, 10, 12)

    labels = np.zeros((4, 8), np.int64)
    got = _run(Fn(noised), labels)
    assert got.dtype == np.int64 and got.shape == (4, 8)
    assert set(np.unique(got)) <= set(range(10, 17)) and len(np.unique(got)) > 2
    convert(from_torch(Fn(noised), (torch.as_tensor(labels),)), batch_size=8)
