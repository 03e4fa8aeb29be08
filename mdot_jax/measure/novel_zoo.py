"""The `novel` zoo: architectures written by hand to be unlike every zoo family and unlike the
random zoo's grammar, kept out of all training and tuning (`mdot profile --zoo novel`; the
`novel` evaluation scores them).

Each is built for one input (`MODELS`: name -> (kind, size)) with the profiler's conventions:
image [B, 3, S, S] -> 1000 classes, tokens [B, S] of a 1000-word vocabulary -> 2, audio
[B, 1, S] -> 10. What makes each one unlike the zoo:
- `nv-unet`: a U-Net encoder-decoder (skip concatenations, transposed convolutions) with a
  classifier on its full-resolution output.
- `nv-capsnet`: primary capsules and three iterations of routing by agreement (batched
  matmuls, softmax over capsules, squashing).
- `nv-perceiver`: cross-attention from a learned latent array to every pixel, then latent
  self-attention.
- `nv-neural-ode`: one convolutional block applied six times with shared weights (Euler
  steps of an ODE).
- `nv-octave`: two resolutions side by side, exchanging features by pooling and upsampling.
- `nv-highway`: a deep highway MLP on the flattened image (learned gates between carry and
  transform).
- `nv-video3d`: the image as a 3-frame clip: (2+1)-D convolutions.
- `nv-wavenet`: gated (tanh x sigmoid) dilated causal 1-D convolutions with residual and
  summed skip paths, on raw audio.
- `nv-conformer`: audio: a strided convolutional front end, then blocks of half-step
  feed-forward, attention and a depthwise convolution module.
- `nv-gmlp`: tokens: gated MLPs with a spatial gating unit (a linear map across positions).
- `nv-moe`: tokens: transformer blocks whose MLP is a softly gated mixture of four experts
  (every expert computed, weighted by a softmax).
- `nv-bilstm-attn`: tokens: a two-layer bidirectional LSTM with additive attention pooling.
- `nv-tcn`: tokens: a temporal convolutional network (causal dilated convolutions, weight-
  free residual paths).
- `nv-hypermix`: tokens: a convolution whose kernel is generated per sample from the sequence
  summary (a dynamic, input-conditioned filter) followed by a mixing MLP.
"""

from __future__ import annotations

MODELS = {  # name -> (input kind, size)
    "nv-unet": ("image", 64), "nv-capsnet": ("image", 32), "nv-perceiver": ("image", 64),
    "nv-neural-ode": ("image", 64), "nv-octave": ("image", 96), "nv-highway": ("image", 32),
    "nv-video3d": ("image", 64), "nv-wavenet": ("audio", 4000), "nv-conformer": ("audio", 8000),
    "nv-gmlp": ("text", 128), "nv-moe": ("text", 64), "nv-bilstm-attn": ("text", 64),
    "nv-tcn": ("text", 256), "nv-hypermix": ("text", 128),
}


def build(name: str):
    """The `torch.nn.Module` of the named model: forward(x) -> logits [B, classes]."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    kind, size = MODELS[name]

    def cbr(cin, cout, k=3, stride=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU())

    class Head(nn.Module):  # [B, C, *P] -> [B, classes]
        def __init__(self, c, classes):
            super().__init__()
            self.fc = nn.Linear(c, classes)

        def forward(self, x):
            return self.fc(x.flatten(2).mean(-1))

    class UNet(nn.Module):
        def __init__(self, w=16):
            super().__init__()
            self.d1, self.d2, self.d3 = cbr(3, w), cbr(w, 2 * w, stride=2), cbr(2 * w, 4 * w,
                                                                              stride=2)
            self.u2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, 2)
            self.m2 = cbr(4 * w, 2 * w)
            self.u1 = nn.ConvTranspose2d(2 * w, w, 2, 2)
            self.m1 = cbr(2 * w, w)
            self.head = Head(w, 1000)

        def forward(self, x):
            a = self.d1(x)
            b = self.d2(a)
            c = self.d3(b)
            b = self.m2(torch.cat([self.u2(c), b], 1))
            return self.head(self.m1(torch.cat([self.u1(b), a], 1)))

    def squash(s, dim=-1):
        n2 = (s * s).sum(dim, keepdim=True)
        return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)

    class CapsNet(nn.Module):
        def __init__(self, caps=8, dim=8, classes=1000, out_dim=4):
            super().__init__()
            self.stem = cbr(3, 64, 5, 2)
            self.primary = nn.Conv2d(64, caps * dim, 3, 2, 1)
            self.caps, self.dim, self.out_dim = caps, dim, out_dim
            n_in = caps * (size // 4) ** 2
            self.w = nn.Parameter(torch.randn(1, n_in, 10, out_dim, dim) * 0.05)
            self.fc = nn.Linear(10 * out_dim, classes)

        def forward(self, x):
            u = self.primary(self.stem(x))  # [B, caps*dim, H, W]
            b_ = u.shape[0]
            u = squash(u.reshape(b_, self.caps, self.dim, -1).permute(0, 1, 3, 2)
                       .reshape(b_, -1, self.dim))  # [B, N, dim]
            u_hat = (self.w @ u[:, :, None, :, None]).squeeze(-1)  # [B, N, 10, out]
            logits = torch.zeros(u_hat.shape[:3], device=x.device)
            for _ in range(3):  # routing by agreement
                c = torch.softmax(logits, dim=2)
                v = squash((c[..., None] * u_hat).sum(1))  # [B, 10, out]
                logits = logits + (u_hat * v[:, None]).sum(-1)
            return self.fc(v.flatten(1))

    class Perceiver(nn.Module):
        def __init__(self, latents=32, d=64):
            super().__init__()
            self.embed = nn.Conv2d(3, d, 4, 4)
            self.latent = nn.Parameter(torch.randn(latents, d) * 0.02)
            self.cross = nn.MultiheadAttention(d, 4, batch_first=True)
            self.selfs = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 2 * d, 0.0,
                                                                  batch_first=True)
                                       for _ in range(2))
            self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, 1000)

        def forward(self, x):
            kv = self.embed(x).flatten(2).transpose(1, 2)  # [B, P, d]
            q = self.latent.expand(x.shape[0], -1, -1)
            z = q + self.cross(q, kv, kv, need_weights=False)[0]
            for layer in self.selfs:
                z = layer(z)
            return self.fc(self.norm(z).mean(1))

    class NeuralOde(nn.Module):
        def __init__(self, w=32, steps=6):
            super().__init__()
            self.stem, self.steps = cbr(3, w, 3, 2), steps
            self.f = nn.Sequential(nn.Conv2d(w, w, 3, 1, 1), nn.GroupNorm(4, w), nn.Tanh(),
                                   nn.Conv2d(w, w, 3, 1, 1))
            self.head = Head(w, 1000)

        def forward(self, x):
            h = self.stem(x)
            for _ in range(self.steps):  # Euler steps, the same weights each time
                h = h + self.f(h) / self.steps
            return self.head(h)

    class Octave(nn.Module):
        def __init__(self, w=24, blocks=3):
            super().__init__()
            self.hi0, self.lo0 = cbr(3, w, 3, 2), cbr(3, w, 3, 4)
            self.hh = nn.ModuleList(cbr(w, w) for _ in range(blocks))
            self.ll = nn.ModuleList(cbr(w, w) for _ in range(blocks))
            self.hl = nn.ModuleList(nn.Conv2d(w, w, 1) for _ in range(blocks))
            self.lh = nn.ModuleList(nn.Conv2d(w, w, 1) for _ in range(blocks))
            self.head = Head(2 * w, 1000)

        def forward(self, x):
            hi, lo = self.hi0(x), self.lo0(x)
            for hh, ll, hl, lh in zip(self.hh, self.ll, self.hl, self.lh):
                hi, lo = (hh(hi) + F.interpolate(lh(lo), scale_factor=2.0),
                          ll(lo) + hl(F.avg_pool2d(hi, 2)))
            return self.head(torch.cat([F.avg_pool2d(hi, 2), lo], 1))

    class Highway(nn.Module):
        def __init__(self, d=512, layers=8):
            super().__init__()
            self.inp = nn.Linear(3 * size * size, d)
            self.h = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.t = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.fc = nn.Linear(d, 1000)

        def forward(self, x):
            z = F.relu(self.inp(x.flatten(1)))
            for h, t in zip(self.h, self.t):
                g = torch.sigmoid(t(z))
                z = g * F.relu(h(z)) + (1 - g) * z
            return self.fc(z)

    class Video3d(nn.Module):  # (2+1)-D: spatial then temporal convolutions over 3 frames
        def __init__(self, w=24):
            super().__init__()
            layers, cin = [], 1
            for cout in (w, 2 * w, 4 * w):
                layers += [nn.Conv3d(cin, cout, (1, 3, 3), (1, 2, 2), (0, 1, 1)),
                           nn.BatchNorm3d(cout), nn.ReLU(),
                           nn.Conv3d(cout, cout, (3, 1, 1), 1, (1, 0, 0)), nn.ReLU()]
                cin = cout
            self.body, self.head = nn.Sequential(*layers), Head(4 * w, 1000)

        def forward(self, x):
            return self.head(self.body(x[:, None]))  # [B, 1, 3 frames, H, W]

    class WaveNet(nn.Module):
        def __init__(self, w=32, layers=10):
            super().__init__()
            self.inp = nn.Conv1d(1, w, 2, 2)
            self.dil = [2 ** (i % 5) for i in range(layers)]
            self.filt = nn.ModuleList(nn.Conv1d(w, w, 2, dilation=d) for d in self.dil)
            self.gate = nn.ModuleList(nn.Conv1d(w, w, 2, dilation=d) for d in self.dil)
            self.res = nn.ModuleList(nn.Conv1d(w, w, 1) for _ in self.dil)
            self.skip = nn.ModuleList(nn.Conv1d(w, w, 1) for _ in self.dil)
            self.head = Head(w, 10)

        def forward(self, x):
            h, out = self.inp(x), 0
            for d, f, g, r, s in zip(self.dil, self.filt, self.gate, self.res, self.skip):
                p = F.pad(h, (d, 0))  # causal
                z = torch.tanh(f(p)) * torch.sigmoid(g(p))
                h, out = h + r(z), out + s(z)
            return self.head(F.relu(out) + h)

    class Conformer(nn.Module):
        def __init__(self, d=64, blocks=2):
            super().__init__()
            self.front = nn.Sequential(nn.Conv1d(1, d, 10, 5), nn.GELU(),
                                       nn.Conv1d(d, d, 8, 4), nn.GELU(),
                                       nn.Conv1d(d, d, 4, 4), nn.GELU())
            self.blocks = nn.ModuleList(nn.ModuleDict(dict(
                ff1=nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(),
                                  nn.Linear(4 * d, d)),
                attn_norm=nn.LayerNorm(d), attn=nn.MultiheadAttention(d, 4, batch_first=True),
                conv_norm=nn.LayerNorm(d), pw1=nn.Conv1d(d, 2 * d, 1),
                dw=nn.Conv1d(d, d, 15, 1, 7, groups=d), bn=nn.BatchNorm1d(d),
                pw2=nn.Conv1d(d, d, 1),
                ff2=nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(),
                                  nn.Linear(4 * d, d)), out=nn.LayerNorm(d)))
                for _ in range(blocks))
            self.fc = nn.Linear(d, 10)

        def forward(self, x):
            t = self.front(x).transpose(1, 2)  # [B, T, d]
            for b in self.blocks:
                t = t + 0.5 * b["ff1"](t)
                a = b["attn_norm"](t)
                t = t + b["attn"](a, a, a, need_weights=False)[0]
                c = F.glu(b["pw1"](b["conv_norm"](t).transpose(1, 2)), dim=1)
                t = t + b["pw2"](F.silu(b["bn"](b["dw"](c)))).transpose(1, 2)
                t = b["out"](t + 0.5 * b["ff2"](t))
            return self.fc(t.mean(1))

    class GMlp(nn.Module):
        def __init__(self, d=128, blocks=4):
            super().__init__()
            self.emb = nn.Embedding(1000, d)
            self.norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
            self.up = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(blocks))
            self.gnorm = nn.ModuleList(nn.LayerNorm(2 * d) for _ in range(blocks))
            self.spatial = nn.ModuleList(nn.Linear(size, size) for _ in range(blocks))
            self.down = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(blocks))
            self.fc = nn.Linear(d, 2)

        def forward(self, ids):
            t = self.emb(ids)
            for n, up, gn, sp, down in zip(self.norm, self.up, self.gnorm, self.spatial,
                                           self.down):
                u, v = F.gelu(up(n(t))).chunk(2, dim=-1)
                v = sp(gn(v).transpose(1, 2)).transpose(1, 2)  # across positions
                t = t + down(u * v)
            return self.fc(t.mean(1))

    class Moe(nn.Module):
        def __init__(self, d=128, experts=4, blocks=2):
            super().__init__()
            self.emb = nn.Embedding(1000, d)
            self.attn = nn.ModuleList(nn.MultiheadAttention(d, 4, batch_first=True)
                                      for _ in range(blocks))
            self.n1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
            self.n2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
            self.gate = nn.ModuleList(nn.Linear(d, experts) for _ in range(blocks))
            self.experts = nn.ModuleList(nn.ModuleList(
                nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                for _ in range(experts)) for _ in range(blocks))
            self.fc = nn.Linear(d, 2)

        def forward(self, ids):
            t = self.emb(ids)
            for attn, n1, n2, gate, experts in zip(self.attn, self.n1, self.n2, self.gate,
                                                   self.experts):
                a = n1(t)
                t = t + attn(a, a, a, need_weights=False)[0]
                h = n2(t)
                w = torch.softmax(gate(h), dim=-1)  # [B, T, E]
                t = t + sum(w[..., i:i + 1] * e(h) for i, e in enumerate(experts))
            return self.fc(t.mean(1))

    class BiLstmAttn(nn.Module):
        def __init__(self, d=96):
            super().__init__()
            self.emb = nn.Embedding(1000, d)
            self.lstm = nn.LSTM(d, d, num_layers=2, batch_first=True, bidirectional=True)
            self.score = nn.Sequential(nn.Linear(2 * d, d), nn.Tanh(), nn.Linear(d, 1))
            self.fc = nn.Linear(2 * d, 2)

        def forward(self, ids):
            h = self.lstm(self.emb(ids))[0]  # [B, T, 2d]
            a = torch.softmax(self.score(h), dim=1)
            return self.fc((a * h).sum(1))

    class Tcn(nn.Module):
        def __init__(self, d=96, levels=6):
            super().__init__()
            self.emb = nn.Embedding(1000, d)
            self.c1 = nn.ModuleList(nn.Conv1d(d, d, 3, dilation=2 ** i) for i in range(levels))
            self.c2 = nn.ModuleList(nn.Conv1d(d, d, 3, dilation=2 ** i) for i in range(levels))
            self.fc = nn.Linear(d, 2)

        def forward(self, ids):
            h = self.emb(ids).transpose(1, 2)
            for i, (c1, c2) in enumerate(zip(self.c1, self.c2)):
                p = 2 * 2 ** i
                z = F.relu(c1(F.pad(h, (p, 0))))
                h = F.relu(h + c2(F.pad(z, (p, 0))))
            return self.fc(h.mean(-1))

    class HyperMix(nn.Module):  # a per-sample depthwise kernel generated from the sequence
        def __init__(self, d=96, k=7, blocks=3):
            super().__init__()
            self.emb, self.d, self.k = nn.Embedding(1000, d), d, k
            self.gen = nn.ModuleList(nn.Linear(d, d * k) for _ in range(blocks))
            self.mix = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d),
                                                   nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(blocks))
            self.fc = nn.Linear(d, 2)

        def forward(self, ids):
            t = self.emb(ids)  # [B, T, d]
            n = t.shape[1]
            for gen, mix in zip(self.gen, self.mix):
                kern = gen(t.mean(1)).reshape(-1, 1, self.d, self.k)  # [B, 1, d, k]
                p = F.pad(t, (0, 0, self.k - 1, 0))  # causal, along T
                shifted = torch.stack([p[:, i:i + n] for i in range(self.k)], -1)
                t = t + (shifted * kern).sum(-1)  # [B, T, d]
                t = t + mix(t)
            return self.fc(t.mean(1))

    return dict(UNet=UNet, CapsNet=CapsNet, Perceiver=Perceiver, NeuralOde=NeuralOde,
                Octave=Octave, Highway=Highway, Video3d=Video3d, WaveNet=WaveNet,
                Conformer=Conformer, GMlp=GMlp, Moe=Moe, BiLstmAttn=BiLstmAttn, Tcn=Tcn,
                HyperMix=HyperMix)[_CLASS[name]]()


_CLASS = {"nv-unet": "UNet", "nv-capsnet": "CapsNet", "nv-perceiver": "Perceiver",
          "nv-neural-ode": "NeuralOde", "nv-octave": "Octave", "nv-highway": "Highway",
          "nv-video3d": "Video3d", "nv-wavenet": "WaveNet", "nv-conformer": "Conformer",
          "nv-gmlp": "GMlp", "nv-moe": "Moe", "nv-bilstm-attn": "BiLstmAttn", "nv-tcn": "Tcn",
          "nv-hypermix": "HyperMix"}
