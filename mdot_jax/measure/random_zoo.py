"""The `random` zoo: PyTorch models drawn from a grammar of blocks, so that a predictor meets
architectures no zoo family shares (`mdot profile --zoo random --n N --seed S`).

A model is named `rnd<version>-s<seed>-<index>`; the name alone rebuilds it (`spec(name)` draws
its architecture from `random.Random` seeded by the name, `build(spec)` makes the module), so
a sample's model can always be exported again. `GENERATOR_VERSION` changes whenever a name
would draw another architecture.

The grammar (`spec`): an input kind (image [B, 3, S, S], 1000 classes; tokens [B, S] of a
1000-word vocabulary, 2 classes; audio [B, 1, S], 10 classes), its size (resolution or
length), a normalisation and an activation for the whole model, a stem, 2-4 stages of 1-3
blocks each, a width growing by stage, and a head (global pooling, a linear classifier).
Image blocks: dense, grouped, depthwise-separable, dilated convolutions, residual and
bottleneck paths, dense (concatenating) blocks, inception branches, squeeze-excite, a
transposed-convolution and an upsampling round trip, self-attention over pixels, token-mixing
MLPs, a 3-D convolution over a stacked copy; sequence blocks (tokens after an embedding, audio
after a strided 1-D stem): 1-D convolutions (dense, dilated, depthwise-separable, residual),
self-attention, transformer MLPs, LSTM and GRU layers. Stages are joined by max or average
pooling or strided convolutions.
"""

from __future__ import annotations

import random
import re

GENERATOR_VERSION = 1
NAME = re.compile(rf"rnd{GENERATOR_VERSION}-s(\d+)-(\d+)")
KINDS = {"image": 1000, "text": 2, "audio": 10}  # input kind -> classes
IMAGE_BLOCKS = ("conv", "grouped", "separable", "dilated", "residual", "bottleneck", "dense",
                "inception", "se", "transposed", "upsample", "attention", "mixer", "conv3d")
SEQUENCE_BLOCKS = ("conv", "dilated", "separable", "residual", "attention", "mlp", "lstm",
                   "gru")
NORMS = ("batch", "group", "instance", "layer", "none")
ACTS = ("relu", "gelu", "silu", "hardswish", "leaky_relu", "tanh", "mish")
MAX_TOKENS = 1024


def name_of(seed: int, index: int) -> str:
    return f"rnd{GENERATOR_VERSION}-s{seed}-{index:05d}"


def spec(name: str) -> dict:
    """The architecture the name draws (JSON-able); a ValueError for a name of no version of
    this generator."""
    if NAME.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not a random-zoo model of generator version "
                         f"{GENERATOR_VERSION} (rnd{GENERATOR_VERSION}-s<seed>-<index>)")
    r = random.Random(name)
    kind = r.choices(list(KINDS), weights=(6, 2.5, 1.5))[0]
    n_stages = r.randint(2, 4)
    size = dict(image=r.choice((32, 48, 64, 96, 128)), text=r.choice((16, 32, 64, 128, 256)),
                audio=r.choice((2000, 4000, 8000, 16000)))[kind]
    width = r.choice((8, 16, 24, 32, 48, 64))
    stages = []
    for positions in _positions(kind, size, n_stages):
        # attention and token mixing only over at most MAX_TOKENS positions
        allowed = [b for b in (IMAGE_BLOCKS if kind == "image" else SEQUENCE_BLOCKS)
                   if positions <= MAX_TOKENS or b not in ("attention", "mixer")]
        stages.append([r.choice(allowed) for _ in range(r.randint(1, 3))])
    return dict(kind=kind, size=size, norm=r.choice(NORMS), act=r.choice(ACTS), width=width,
                growth=r.choice((1, 1.5, 2)), down=r.choice(("max", "avg", "conv")),
                stages=stages)


def _positions(kind: str, size: int, n_stages: int) -> list[int]:
    """Positions (pixels or time steps) each stage works on: the stem halves an image's side
    and strides audio by 16; every later stage halves each side."""
    first = dict(image=(size // 2) ** 2, text=size, audio=size // 16)[kind]
    return [max(first // ((4 if kind == "image" else 2) ** i), 1) for i in range(n_stages)]


def build(s: dict):
    """The `torch.nn.Module` of spec `s`: forward(x) -> logits [B, classes]."""
    import torch
    from torch import nn

    image = s["kind"] == "image"
    conv_t = nn.Conv2d if image else nn.Conv1d
    act_t = dict(relu=nn.ReLU, gelu=nn.GELU, silu=nn.SiLU, hardswish=nn.Hardswish,
                 leaky_relu=nn.LeakyReLU, tanh=nn.Tanh, mish=nn.Mish)[s["act"]]

    def norm(c):
        return dict(batch=(nn.BatchNorm2d if image else nn.BatchNorm1d)(c),
                    group=nn.GroupNorm(_divisor(c, 4), c), layer=nn.GroupNorm(1, c),
                    instance=(nn.InstanceNorm2d if image else nn.InstanceNorm1d)(c, affine=True),
                    none=nn.Identity())[s["norm"]]

    def cna(cin, cout, k=3, stride=1, groups=1, dilation=1):
        return nn.Sequential(conv_t(cin, cout, k, stride, padding=dilation * (k // 2),
                                    groups=groups, dilation=dilation, bias=False),
                             norm(cout), act_t())

    class Residual(nn.Module):
        def __init__(self, body, skip=None):
            super().__init__()
            self.body, self.skip = body, skip or nn.Identity()

        def forward(self, x):
            return self.skip(x) + self.body(x)

    class Concat(nn.Module):
        def __init__(self, *branches):
            super().__init__()
            self.branches = nn.ModuleList(branches)

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], dim=1)

    class SqueezeExcite(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc = nn.Sequential(nn.Linear(c, max(c // 4, 4)), nn.ReLU(),
                                    nn.Linear(max(c // 4, 4), c), nn.Sigmoid())

        def forward(self, x):
            w = self.fc(x.mean(dim=tuple(range(2, x.dim()))))
            return x * w.reshape(*w.shape, *([1] * (x.dim() - 2)))

    class Attention(nn.Module):  # over positions: [B, C, *P] -> [B, C, *P]
        def __init__(self, c):
            super().__init__()
            self.heads = _divisor(c, 4)
            self.qkv, self.out = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.norm = nn.LayerNorm(c)

        def forward(self, x):
            b, c = x.shape[:2]
            t = x.flatten(2).transpose(1, 2)  # [B, T, C]
            q, k, v = self.qkv(self.norm(t)).chunk(3, dim=-1)

            def split(z):
                return z.reshape(b, -1, self.heads, c // self.heads).transpose(1, 2)

            a = torch.softmax(split(q) @ split(k).transpose(-1, -2) / (c // self.heads) ** 0.5,
                              dim=-1)
            y = (a @ split(v)).transpose(1, 2).reshape(b, -1, c)
            return x + self.out(y).transpose(1, 2).reshape(x.shape)

    class Mlp(nn.Module):  # channel MLP at every position (a transformer's, or a mixer's)
        def __init__(self, c, tokens=0):
            super().__init__()
            self.norm = nn.LayerNorm(c)
            self.fc = nn.Sequential(nn.Linear(c, 2 * c), act_t(), nn.Linear(2 * c, c))
            self.mix = nn.Linear(tokens, tokens) if tokens else None

        def forward(self, x):
            t = x.flatten(2).transpose(1, 2)  # [B, T, C]
            if self.mix is not None:  # token mixing first
                t = t + self.mix(self.norm(t).transpose(1, 2)).transpose(1, 2)
            return (t + self.fc(self.norm(t))).transpose(1, 2).reshape(x.shape)

    class Recurrent(nn.Module):
        def __init__(self, c, cell):
            super().__init__()
            self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(c, c, batch_first=True)

        def forward(self, x):
            y, _ = self.rnn(x.transpose(1, 2))
            return x + y.transpose(1, 2)

    class Tokens(nn.Module):  # token ids [B, T] -> features [B, C, T]
        def __init__(self, c):
            super().__init__()
            self.embedding = nn.Embedding(1000, c)

        def forward(self, ids):
            return self.embedding(ids).transpose(1, 2)

    class Volume(nn.Module):  # a 3-D convolution over [B, 1, C, H, W]
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv3d(1, 2, 3, padding=1)
            self.proj = nn.Conv2d(2 * c, c, 1)

        def forward(self, x):
            y = self.conv(x.unsqueeze(1))
            return x + self.proj(y.flatten(1, 2))

    def block(kind, c, positions):
        """(module, channels out) of one block on `c` channels."""
        if kind == "conv":
            return cna(c, c), c
        if kind == "grouped":
            return cna(c, c, groups=_divisor(c, 8)), c
        if kind == "separable":
            return nn.Sequential(cna(c, c, k=5 if image else 7, groups=c), cna(c, c, k=1)), c
        if kind == "dilated":
            return cna(c, c, dilation=2), c
        if kind == "residual":
            return Residual(nn.Sequential(cna(c, c), cna(c, c))), c
        if kind == "bottleneck":
            m = max(c // 4, 4)
            return Residual(nn.Sequential(cna(c, m, k=1), cna(m, m), cna(m, c, k=1))), c
        if kind == "dense":
            return Concat(nn.Identity(), cna(c, c // 2 + 1)), c + c // 2 + 1
        if kind == "inception":
            q = max(c // 4, 2)
            return Concat(cna(c, q, k=1), cna(c, q, k=3), cna(c, q, k=5),
                          nn.Sequential(nn.MaxPool2d(3, 1, 1), cna(c, q, k=1))), 4 * q
        if kind == "se":
            return nn.Sequential(cna(c, c), SqueezeExcite(c)), c
        if kind == "transposed":  # up by a transposed convolution, down by a strided one
            return nn.Sequential(nn.ConvTranspose2d(c, c, 2, 2), norm(c), act_t(),
                                 cna(c, c, stride=2)), c
        if kind == "upsample":
            return nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), cna(c, c),
                                 nn.AvgPool2d(2)), c
        if kind == "attention":
            return Attention(c), c
        if kind in ("mixer", "mlp"):
            return Mlp(c, positions if kind == "mixer" else 0), c
        if kind in ("lstm", "gru"):
            return Recurrent(c, kind), c
        if kind == "conv3d":
            return Volume(c), c
        raise ValueError(f"no block {kind!r}")

    def down(c, cout):
        if s["down"] == "conv":
            return cna(c, cout, stride=2)
        pool = (nn.MaxPool2d if image else nn.MaxPool1d) if s["down"] == "max" else \
            (nn.AvgPool2d if image else nn.AvgPool1d)
        return nn.Sequential(pool(2), cna(c, cout, k=1))

    c, layers = s["width"], []
    if s["kind"] == "text":
        layers.append(Tokens(c))
    elif s["kind"] == "audio":
        layers += [nn.Conv1d(1, c, 16, 16), norm(c), act_t()]
    else:
        layers.append(cna(3, c, stride=2))
    positions = _positions(s["kind"], s["size"], len(s["stages"]))
    for i, stage in enumerate(s["stages"]):
        if i:
            cout = int(c * s["growth"])
            layers.append(down(c, cout))
            c = cout
        for kind in stage:
            module, c = block(kind, c, positions[i])
            layers.append(module)
    pool = nn.AdaptiveAvgPool2d(1) if image else nn.AdaptiveAvgPool1d(1)
    layers += [pool, nn.Flatten(), nn.Linear(c, KINDS[s["kind"]])]
    return nn.Sequential(*layers)


def _divisor(c: int, at_most: int) -> int:
    """The largest divisor of `c` not above `at_most`."""
    return max(g for g in range(1, at_most + 1) if c % g == 0)
