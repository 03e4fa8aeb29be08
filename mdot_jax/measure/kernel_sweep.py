"""The kit's precision sweep: single kernels at every precision the GPU has, on shapes this
module generates (no model needed), so that every lease brings tensor-core operator data.

    python -m mdot_jax.measure.kernel_sweep OUT.jsonl [--seconds 120] [--dry-run]

The kernels:
- `gemm`: `torch.matmul` of [b, m, k] x [k, n] (a linear layer's) and `bmm` [b, m, k] x
  [b, k, n], shapes drawn log-uniformly (`numpy.random.default_rng(0)`) from 64 to 16,384 per
  dim, so that they span tiles and waves, at fp32 (TF32 off), tf32, fp16, bf16, and fp8
  (`torch._scaled_mm`, where the GPU has it);
- `sdpa`: `scaled_dot_product_attention` forward and backward, causal, with the flash and the
  memory-efficient backends, at fp16 and bf16; and `sdpa-masked`: the memory-efficient backend
  given a boolean sliding-window mask of half the keys ([b, 1, s, s], as transformers builds
  one for a window the sequence reaches), over every key;
- `elementwise` (add, mul, gelu), `layer_norm` and `softmax` over [rows, cols] at fp32 and
  bf16; and binary kernels with a broadcast operand, which PyTorch runs without its vectorized
  path: `add-bcast` (eager attention's mask: scores [b, h, s, s] plus an fp32 mask
  [b, 1, 1, s], the sum promoted to fp32) and `mul-bcast` (rotary positions: [b, s, h, d]
  times [1, s, 1, d]);
- a CNN's kernels at fp32 (cuDNN's default: TF32 convolutions) and bf16, in NCHW and
  channels-last (`layout`): `conv` (`F.conv2d` of [n, c, h, h] by [k, c, r, r] at a stride,
  padding r // 2), `dwconv` (a depthwise one, MobileNet's and EfficientNet's: [n, c, h, h] by
  [c, 1, r, r], groups c) and `batch_norm` (training mode, fp32 weights and statistics), each
  forward alone and forward with backward (`-train`);
- a language model's: `cross_entropy-train` (logits [tokens, vocab], forward and backward),
  and `adamw` (`torch.optim.AdamW.step`, its default foreach kernels, over `tensors` fp32
  parameters of `numel` each), `adamw-fused` (its fused kernel, `fused=True`);
- `linear-train` over vocabularies as models have them (`F.linear` of x [tokens, d] by w
  [vocab, d], forward and both gradients: the three GEMMs of a language model's head) at fp32,
  tf32, fp16 and bf16, each vocabulary that is not a multiple of 64 (GPT-2's 50,257, BERT's
  30,522, a Llama's 32,000 plus a padding token) beside its twin rounded up to one
  (`ALIGN_TWIN`): the rows of logits then start at addresses no vector load can use, and the
  pairs say what that costs each arithmetic (`tensor_cores.fit_unaligned`); the loss over the
  same logits too (`cross_entropy-train`, fp32 and bf16); and `bmm-unaligned`, eager
  attention's two batched products at token counts not a multiple of 8 (`WINDOWS`: Swin's
  7 x 7 windows, a ViT-B/16's 197 tokens), each beside its twin at the next multiple of 8;
- whole layers one library call runs, priced by their structure until measured:
  `lstm-train` (`nn.LSTM` of `layers` x `hidden` units over [steps, batch, hidden], forward and
  every gradient: cuDNN's steps in turn) at fp32 (cuDNN's default, TF32), fp16 and bf16; and
  `sdpa-biased` (the memory-efficient backend given a learned float bias [1, h, s, s], BEiT's
  relative positions or T5's, expanded over the batch, every key, its gradient too) at fp16
  and bf16, BEiT's shapes among them (197 and 577 tokens).
Each row: the kernel, its precision and dims, the FLOPs and bytes it must do, the median of
`REPEATS` timed bursts after a warm-up (CUDA events on a GPU; a burst is as many back-to-back
launches as fill about `BURST_MS`, so small kernels are timed as a step's stream runs them,
not behind the host's issue time, which `ms_alone` keeps), or why it could not run. The kinds
are interleaved, so a run cut short by `--seconds` (no kernel starts after it) has some of
each; a second run skips the keys already there. `--dry-run`: a few small shapes on the CPU.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from mdot_jax.measure import resumable
from mdot_jax.options import ARITHMETIC, LAYOUTS

REPEATS = 10
BURST_MS = 1.0  # back-to-back launches per timed repeat fill about this much GPU time
MAX_LAUNCHES = 100
GEMM_PRECISIONS = ARITHMETIC
HALF = ARITHMETIC[2:4]  # fp16, bf16
ROWWISE = (ARITHMETIC[0], HALF[1])  # fp32, bf16
MAX_FLOPS = 2e12  # per GEMM: a few ms on any GPU we price
MAX_BYTES = 2e9  # per fp32 operand
ALIGN_TWIN = 64  # an unaligned vocabulary's twin: rounded up to a multiple of this
HEADS = ((8192, 50257, 768), (8192, 30522, 1024), (4096, 32001, 4096))  # tokens, vocab, d
# (b, m, n, k) of Q K^T and P V at batch 32: Swin-T's first stage (64 windows x 3 heads), ViT-B/16
WINDOWS = ((6144, 49, 49, 32), (6144, 49, 32, 49), (384, 197, 197, 64), (384, 197, 64, 197))


def plan(dry: bool, n_gemm: int = 120) -> list[dict]:
    """The kernels to time, kinds interleaved, as rows of `kind`, `precision` and `dims`."""
    rng = np.random.default_rng(0)
    if dry:
        gemms = [("gemm", (2, 64, 64, 64)), ("bmm", (2, 64, 32, 64))]
        sdpa = [(1, 2, 64, 32)]
        rowwise = [(256, 256)]
        precisions, halves = ("fp32",), ("fp32",)
    else:
        gemms = []
        while len(gemms) < n_gemm:
            b = int(rng.choice([1, 1, 2, 8, 32]))
            m, n, k = (int(2 ** rng.uniform(6, 14)) // 16 * 16 for _ in range(3))
            if 2.0 * b * m * n * k <= MAX_FLOPS and min(m, n, k) >= 64 \
                    and 4.0 * b * max(m * k, k * n, m * n) <= MAX_BYTES:
                gemms.append((str(rng.choice(["gemm", "bmm"])), (b, m, n, k)))
        sdpa = [(b, h, s, d) for s in (512, 1024, 2048, 4096) for d in (64, 128)
                for b, h in ((4, 16),)]
        rowwise = [(int(2 ** rng.uniform(8, 16)), int(2 ** rng.uniform(6, 14)) // 16 * 16)
                   for _ in range(24)]
        precisions, halves = GEMM_PRECISIONS, HALF
    rows: list[list[dict]] = [[], [], [], _network_kernels(dry), _heads(dry), _depthwise(dry),
                              _layers(dry), _broadcast(dry)]
    for kind, dims in gemms:
        rows[0] += [dict(kind=kind, precision=p, dims=dims) for p in precisions]
    for dims in sdpa:
        rows[1] += [dict(kind=f"sdpa-{backend}", precision=p, dims=dims)
                    for backend in ("flash", "efficient", "masked") for p in halves]
    for dims in rowwise:
        rows[2] += [dict(kind=kind, precision=p, dims=dims) for kind in
                    ("add", "mul", "gelu", "layer_norm", "softmax")
                    for p in (ROWWISE if not dry else ROWWISE[:1])]
    out, queues = [], [list(q) for q in rows]
    while any(queues):  # round-robin: every kind early
        for q in queues:
            if q:
                out.append(q.pop(0))
    for r in out:
        layout = f"{r['layout']}/" if "layout" in r else ""
        r["key"] = f"{r['kind']}/{r['precision']}/{layout}{'x'.join(map(str, r['dims']))}"
    return list({r["key"]: r for r in out}.values())


def _network_kernels(dry: bool) -> list[dict]:
    """The CNN and language-model kernels of the plan (their own generator, so that adding them
    left the other kinds' shapes as they were)."""
    rng = np.random.default_rng(1)
    if dry:
        convs, norms = [(2, 8, 16, 8, 3, 1)], [(2, 8, 16)]
        logits, updates, precisions = [(64, 512)], [(4, 1024)], ("fp32",)
    else:
        convs, norms = [], []
        while len(convs) < 16:  # ResNet-like: channels against resolution, 1x1 and 3x3
            h = int(rng.choice([7, 14, 28, 56, 112]))
            c = int(rng.choice([16, 32, 64, 128, 256, 512, 1024]))
            n = int(rng.choice([16, 32, 64, 128]))
            r, stride = int(rng.choice([1, 3])), int(rng.choice([1, 1, 1, 2]))
            k = int(c * rng.choice([0.25, 1, 1, 2, 4]))
            conv = (n, c, h, k, r, stride)
            if 2.0 * n * k * c * r * r * (h // stride) ** 2 <= MAX_FLOPS / 3 \
                    and 4.0 * n * max(c, k) * h * h <= MAX_BYTES / 4:
                convs.append(conv)
                norms.append((n, k, h // stride))
        logits = [(8192, 50304), (4096, 32000), (16384, 50304), (2048, 128256)]
        updates = [(50, 2_500_000), (150, 2_400_000), (300, 1_000_000)]
        precisions = ROWWISE
    rows = [dict(kind=kind, precision=p, layout=layout, dims=d)
            for conv, norm in zip(convs, norms) for p in precisions
            for layout in LAYOUTS
            for kind, d in (("conv", conv), ("conv-train", conv),
                            ("batch_norm", norm), ("batch_norm-train", norm))]
    rows += [dict(kind="cross_entropy-train", precision=p, dims=d)
             for d in logits for p in precisions]
    return rows + [dict(kind=kind, precision="fp32", dims=d) for d in updates
                   for kind in ("adamw", "adamw-fused")]


def _depthwise(dry: bool) -> list[dict]:
    """Depthwise convolutions (n, c, h, r, stride) as MobileNets and EfficientNets have them, at
    fp32 (TF32 where cuDNN uses it) and bf16, both layouts (their own generator and queue)."""
    rng = np.random.default_rng(2)
    if dry:
        convs, precisions = [(2, 8, 16, 3, 1)], ("fp32",)
    else:
        convs, precisions = [], ROWWISE
        while len(convs) < 12:
            h = int(rng.choice([7, 14, 28, 56, 112]))
            c = int(rng.choice([16, 32, 96, 144, 240, 480, 672, 1152]))
            n = int(rng.choice([32, 64, 128]))
            conv = (n, c, h, int(rng.choice([3, 5])), int(rng.choice([1, 1, 2])))
            if 4.0 * n * c * h * h <= MAX_BYTES / 4 and conv not in convs:
                convs.append(conv)
    return [dict(kind=kind, precision=p, layout=layout, dims=d) for d in convs
            for p in precisions for layout in LAYOUTS for kind in ("dwconv", "dwconv-train")]


def _layers(dry: bool) -> list[dict]:
    """Whole layers run as one library call (their own queue): an LSTM (steps, batch, hidden,
    layers), SDPA given a learned bias (batch, heads, tokens, head dim) and deformable
    attention's sampling of one feature level (images x heads, head width, the level's side,
    queries, points a query: `grid_sample-train`)."""
    if dry:
        lstms, biased, precisions, halves = [(4, 2, 16, 1)], [(1, 2, 16, 8)], ("fp32",), ("fp32",)
        sampled, rowwise = [(2, 4, 8, 16, 2)], ("fp32",)
    else:
        lstms = [(64, 64, 1024, 2), (256, 64, 1024, 2), (128, 32, 512, 1), (512, 16, 256, 2)]
        biased = [(64, 12, 197, 64), (32, 16, 577, 64), (16, 8, 512, 64), (4, 16, 1024, 64),
                  (4, 16, 2048, 64), (4, 16, 1024, 128)]
        # Deformable DETR's encoder at 800 px (2 images, 8 heads of 32; every token of four
        # levels a query) on its first two levels; RT-DETR's decoder at 640 px (8 images, 300
        # queries) on its three
        sampled = [(16, 32, 100, 13294, 4), (16, 32, 50, 13294, 4), (64, 32, 80, 300, 4),
                   (64, 32, 40, 300, 4), (64, 32, 20, 300, 4), (128, 32, 80, 300, 4)]
        precisions, halves, rowwise = (ARITHMETIC[0], *HALF), HALF, ROWWISE
    return [dict(kind="lstm-train", precision=p, dims=d) for d in lstms for p in precisions] + [
        dict(kind="sdpa-biased", precision=p, dims=d) for d in biased for p in halves] + [
        dict(kind="grid_sample-train", precision=p, dims=d) for d in sampled for p in rowwise]


def _broadcast(dry: bool) -> list[dict]:
    """Binary kernels with a broadcast operand (their own queue): `add-bcast` (b, h, s), an
    attention mask's add (GPT-2's eager attention at 8 x 1,024 tokens among them), and
    `mul-bcast` (b, s, h, d), rotary positions' multiply (a Llama's heads of 128)."""
    if dry:
        masks, ropes, precisions = [(2, 2, 16)], [(2, 16, 2, 8)], ("fp32",)
    else:
        masks = [(8, 12, 1024), (16, 12, 512), (4, 16, 2048), (1, 16, 4096), (32, 12, 256)]
        ropes = [(1, 4096, 32, 128), (8, 2048, 32, 128), (16, 2048, 8, 128), (8, 1024, 12, 64)]
        precisions = ROWWISE
    return [dict(kind="add-bcast", precision=p, dims=d) for d in masks for p in precisions] + [
        dict(kind="mul-bcast", precision=p, dims=d) for d in ropes for p in precisions]


def twin(vocab: int) -> int:
    """The aligned twin of a vocabulary (`ALIGN_TWIN`)."""
    return -(-vocab // ALIGN_TWIN) * ALIGN_TWIN


def aligned_twin(kind: str, dims) -> tuple | None:
    """The dims of an unaligned kernel's aligned twin (`linear-train`: the vocabulary `twin`;
    `bmm-unaligned`: m, n and k at the next multiple of 8, the batch kept), or None where
    `dims` are aligned."""
    if kind == "linear-train":
        t, v, d = dims
        return (t, twin(v), d) if v % ALIGN_TWIN else None
    b, *mnk = dims
    return (b, *(-(-x // 8) * 8 for x in mnk)) if any(x % 8 for x in mnk) else None


def _heads(dry: bool) -> list[dict]:
    """Language-model heads at unaligned vocabularies, each beside its aligned twin, the loss
    over their logits (`cross_entropy-train`, the same pairs), and attention's batched GEMMs
    at unaligned token counts beside twins at the next multiple of 8 (`bmm-unaligned`)."""
    heads, precisions = (((64, 1001, 32),), ("fp32",)) if dry else (HEADS, GEMM_PRECISIONS[:4])
    windows = ((2, 9, 9, 8),) if dry else WINDOWS
    return [dict(kind="linear-train", precision=p, dims=(t, v, d))
            for t, vocab, d in heads for v in (vocab, twin(vocab)) for p in precisions] + [
        dict(kind="bmm-unaligned", precision=p, dims=d) for w in windows
        for d in (w, aligned_twin("bmm-unaligned", w)) for p in precisions] + [
        dict(kind="cross_entropy-train", precision=p, dims=(t, v))
        for t, vocab, _ in heads for v in (vocab, twin(vocab))
        for p in (ROWWISE if not dry else ROWWISE[:1])]


def _work(row: dict) -> tuple[float, float]:
    """(FLOPs, bytes) the kernel must do at least."""
    dims, kind = row["dims"], row["kind"]
    width = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[row["precision"]]
    if kind in ("gemm", "bmm", "bmm-unaligned"):
        b, m, n, k = dims
        weights = (1 if kind == "gemm" else b) * k * n
        return 2.0 * b * m * n * k, width * (b * m * k + weights + b * m * n)
    if kind == "linear-train":  # y = x w^T, dx = dy w, dw = dy^T x
        t, v, d = dims
        return 6.0 * t * v * d, width * 3.0 * (t * d + v * d + t * v)
    if kind == "lstm-train":  # 4 gates' GEMMs of the input and the state, fwd + 2 grads
        t, b, h, layers = dims
        return 3 * layers * 16.0 * t * b * h * h, width * layers * (12.0 * t * b * h + 8 * h * h)
    if kind.startswith("sdpa"):  # fwd + bwd; causal: half the keys; a mask or a bias: every key
        b, h, s, d = dims
        every = kind in ("sdpa-masked", "sdpa-biased")
        bias = 2.0 * b * h * s * s if kind == "sdpa-biased" else 0.0  # read, its gradient written
        return 3.5 * 4.0 * b * h * s * s * d / (1 if every else 2), width * (8.0 * b * h * s * d
                                                                             + bias)
    if kind == "grid_sample-train":  # 4 taps an output, fwd; bwd scatters into the level
        bh, c, side, q, points = dims
        out, level, grid = bh * c * q * points, bh * c * side * side, bh * q * points * 2
        return 3 * 8.0 * out, width * (3.0 * out + 2 * level + 3 * grid)
    if kind.startswith("dwconv"):  # c filters of r x r, one per channel
        n, c, h, r, stride = dims
        out = n * c * (-(-h // stride)) ** 2  # padding r // 2: ceil(h / stride) a side
        flops, nbytes = 2.0 * out * r * r, width * (n * c * h * h + c * r * r + out)
        return (3 * flops, 3 * nbytes) if kind.endswith("train") else (flops, nbytes)
    if kind.startswith("conv"):
        n, c, h, k, r, stride = dims
        out = n * k * (h // stride) ** 2
        flops, nbytes = 2.0 * out * c * r * r, width * (n * c * h * h + k * c * r * r + out)
        return (3 * flops, 3 * nbytes) if kind.endswith("train") else (flops, nbytes)
    if kind.startswith("batch_norm"):  # read and write x; with the backward x, dy and dx too
        n, c, h = dims
        x = n * c * h * h
        return (8.0 if kind.endswith("train") else 3.0) * x, width * x * (
            5.0 if kind.endswith("train") else 2.0)
    if kind.startswith("adamw"):  # read p, g, m, v; write p, m, v
        tensors, numel = dims
        return 12.0 * tensors * numel, 4.0 * 7 * tensors * numel
    if kind == "add-bcast":  # read the scores and the mask, write the fp32 sum
        b, h, s = dims
        return float(b * h * s * s), (width + 4.0) * b * h * s * s + 4.0 * b * s
    if kind == "mul-bcast":  # read x and the table, write the product
        b, s, h, d = dims
        return float(b * s * h * d), width * (2.0 * b * s * h * d + s * d)
    rows, cols = dims
    if kind == "cross_entropy-train":  # read the logits, write their gradient
        return 8.0 * rows * cols, width * 2.0 * rows * cols
    return float(rows * cols), width * (3.0 if kind in ("add", "mul") else 2.0) * rows * cols


def _kernel(row: dict, device: str):
    """A closure running the kernel once."""
    import torch
    import torch.nn.functional as F

    dims, kind, p = row["dims"], row["kind"], row["precision"]
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(p, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = p == "tf32"

    def new(*shape: int, grad: bool = False):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    if kind in ("gemm", "bmm") and p == "fp8":
        b, m, n, k = dims
        f8 = torch.float8_e4m3fn
        a = new(b * m, k).to(f8)
        w = new(n, k).to(f8).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, w, scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16)
    if kind == "gemm":
        b, m, n, k = dims
        a, w = new(b, m, k), new(k, n)
        return lambda: torch.matmul(a, w)
    if kind in ("bmm", "bmm-unaligned"):
        b, m, n, k = dims
        a, w = new(b, m, k), new(b, k, n)
        return lambda: torch.bmm(a, w)
    if kind == "linear-train":
        t, v, d = dims
        x, w = new(t, d, grad=True), new(v, d, grad=True)
        dy = new(t, v)
        return lambda: torch.autograd.grad(F.linear(x, w), (x, w), dy)
    if kind.startswith("sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b, h, s, d = dims
        q, kk, v = (new(b, h, s, d, grad=True) for _ in range(3))
        backend = SDPBackend.FLASH_ATTENTION if kind.endswith("flash") else \
            SDPBackend.EFFICIENT_ATTENTION
        mask = None
        if kind == "sdpa-biased":  # a parameter of the block, the same for every sample
            bias = new(1, h, s, s, grad=True)
        elif kind == "sdpa-masked":  # a sliding window of s / 2 keys, causal within it
            i = torch.arange(s, device=device)
            near = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < max(s // 2, 1))
            mask = near.expand(b, 1, s, s).contiguous()

        def run():
            m = bias.expand(b, h, s, s) if kind == "sdpa-biased" else mask
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kk, v, attn_mask=m,
                                               is_causal=kind.endswith(("flash", "efficient"))
                                               ).sum().backward()
        return run
    if kind == "lstm-train":
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: cuDNN's fp32 in TF32
        t, b, h, layers = dims
        lstm = torch.nn.LSTM(h, h, layers).to(device, dtype)
        x, dy = new(t, b, h, grad=True), new(t, b, h)
        inputs = (x, *lstm.parameters())
        return lambda: torch.autograd.grad(lstm(x)[0], inputs, dy)
    if kind == "grid_sample-train":
        bh, c, side, q, points = dims
        level = new(bh, c, side, side, grad=True)
        grid = (torch.rand(bh, q, points, 2, device=device, dtype=dtype) * 2 - 1
                ).requires_grad_(True)  # in [-1, 1], as a sigmoid's offsets place them
        dy = new(bh, c, q, points)
        return lambda: torch.autograd.grad(F.grid_sample(
            level, grid, mode="bilinear", padding_mode="zeros", align_corners=False),
            (level, grid), dy)
    if kind.startswith(("conv", "dwconv", "batch_norm")):
        return _cnn_kernel(row, device, dtype)
    if kind.startswith("adamw"):
        tensors, numel = dims
        params = [torch.nn.Parameter(torch.randn(numel, device=device)) for _ in range(tensors)]
        for q in params:
            q.grad = torch.randn_like(q)
        opt = torch.optim.AdamW(params, lr=1e-4, fused=kind == "adamw-fused")
        return opt.step
    if kind == "add-bcast":
        b, h, s = dims
        scores, mask = new(b, h, s, s), torch.zeros(b, 1, 1, s, device=device)
        return lambda: scores + mask
    if kind == "mul-bcast":
        b, s, h, d = dims
        x, table = new(b, s, h, d), new(1, s, 1, d)
        return lambda: x * table
    rows, cols = dims
    if kind == "cross_entropy-train":
        logits = new(rows, cols, grad=True)
        target = torch.randint(cols, (rows,), device=device)
        return lambda: F.cross_entropy(logits.float(), target).backward()
    x, y = new(rows, cols), new(rows, cols)
    return {"add": lambda: x + y, "mul": lambda: x * y, "gelu": lambda: F.gelu(x),
            "layer_norm": lambda: F.layer_norm(x, (cols,)),
            "softmax": lambda: torch.softmax(x, -1)}[kind]


def _cnn_kernel(row: dict, device: str, dtype):
    """A closure running a convolution or batch norm (forward, or forward and backward)."""
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: fp32 convolutions in TF32
    fmt = torch.channels_last if row["layout"] == "nhwc" else torch.contiguous_format
    train = row["kind"].endswith("train")

    def new(*shape: int, dt=dtype):
        t = torch.randn(*shape, device=device, dtype=dt)
        return (t.to(memory_format=fmt) if len(shape) == 4 else t).requires_grad_(train)

    if row["kind"].startswith(("conv", "dwconv")):
        n, c, h, k, r, stride, groups = conv_shape(row)
        inputs = x, w = new(n, c, h, h), new(k, c // groups, r, r)

        def conv():
            return F.conv2d(x, w, stride=stride, padding=r // 2, groups=groups)
        run = conv
    else:
        n, c, h = row["dims"]
        inputs = x, weight, bias = (new(n, c, h, h), new(c, dt=torch.float32),
                                    new(c, dt=torch.float32))
        mean, var = torch.zeros(c, device=device), torch.ones(c, device=device)

        def norm():
            return F.batch_norm(x, mean, var, weight, bias, training=True)
        run = norm
    if not train:
        return run
    grad = run().detach().clone()  # the output's gradient, in its layout
    return lambda: torch.autograd.grad(run(), inputs, grad)  # no accumulation into .grad


def conv_shape(row: dict) -> tuple[int, int, int, int, int, int, int]:
    """(batch, in channels, side, out channels, kernel side, stride, groups) of a `conv` or
    `dwconv` row (padding: kernel side // 2)."""
    if row["kind"].startswith("dwconv"):
        n, c, h, r, stride = row["dims"]
        return n, c, h, c, r, stride, c
    n, c, h, k, r, stride = row["dims"]
    return n, c, h, k, r, stride, 1


def _timed(run, device: str, launches: int = 1) -> float:
    """ms per launch of `launches` back-to-back launches (CUDA events on a GPU)."""
    import torch

    if device != "cuda":
        t = time.perf_counter()
        for _ in range(launches):
            run()
        return 1e3 * (time.perf_counter() - t) / launches
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(launches):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / launches


def measure(row: dict, device: str) -> dict:
    """The row with `ms` (median of `REPEATS`, each the mean of `launches` back-to-back
    launches filling about `BURST_MS`: the kernel as a step's stream runs it, the host's issue
    time hidden) and `ms_all`; `ms_alone` (one launch on an idle GPU: the host's issue time
    included). Or `error`."""
    flops, nbytes = _work(row)
    try:
        run = _kernel(row, device)
        run()  # warm-up: the library picks its kernel
        alone = statistics.median(_timed(run, device) for _ in range(3))
        launches = 1 if device != "cuda" else min(MAX_LAUNCHES,
                                                  math.ceil(BURST_MS / max(alone, 1e-3)))
        times = [_timed(run, device, launches) for _ in range(REPEATS)]
        return dict(row, flops=flops, bytes=nbytes, ms=statistics.median(times), ms_all=times,
                    ms_alone=alone, launches=launches)
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:  # no such kernel here
        return dict(row, flops=flops, bytes=nbytes,
                    error=(str(e).strip().splitlines() or [type(e).__name__])[0][:200])


def read(path: str | Path) -> list[dict]:
    """A sweep's rows, from its `kernels.jsonl` or the packed form the repository keeps."""
    from mdot_jax.data.dataset import PACKED, read_jsonl_bytes

    path = Path(path)
    text = read_jsonl_bytes(path.with_name(path.name.removesuffix(PACKED)))
    if text is None:
        raise FileNotFoundError(f"{path}: no kernel sweep (kernels.jsonl, or packed)")
    return [json.loads(line) for line in text.decode().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    return resumable.main(argv, __doc__.splitlines()[0], plan, measure)


if __name__ == "__main__":
    resumable.finish(main())
