"""The model zoos `mdot profile` measures: torchvision, timm (a fixed selection), Hugging Face
text models (random weights from configs, nothing from a hub), the novel architectures, and
random ones by name; each model exported as its training graph for the operator sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from converters import from_torch, inference_export
from mdot_jax.data import resequence as copies
from mdot_jax.data.dataset import Dataset, Sample


@dataclass(frozen=True)
class ZooModel:
    """A model the profiler can build: `build(size)` returns an nn.Module for that input size."""

    name: str
    kind: str  # "image" (size = image side), "text" (sequence length), "audio" (samples)
    build: Callable[[int], object]
    vocab_size: int = 0  # text models: token ids are drawn below this
    sizes: tuple[int, ...] = ()  # the sizes it is measured at, whatever the profile's sizes


# ---------------------------------------------------------------------------- zoos
TIMM_SELECTION = (
    "resnet18", "resnet50d", "resnext26ts", "seresnext26d_32x4d", "res2net50_26w_4s",
    "resnest14d", "efficientnet_b0", "efficientnet_lite0", "mobilenetv3_large_100",
    "mobilenetv2_100", "mnasnet_100", "ghostnet_100", "lcnet_050", "tinynet_a", "mixnet_s",
    "fbnetc_100", "rexnet_100", "regnetx_004", "regnety_008", "densenet121", "dla34", "dpn68",
    "cspresnet50", "darknet53", "repvgg_a2", "vovnet39a", "gernet_s", "selecsls42b",
    "hrnet_w18_small", "convnext_atto", "convnextv2_atto", "edgenext_xx_small",
    "poolformer_s12", "vit_tiny_patch16_224", "deit_tiny_patch16_224", "mixer_s16_224",
    "resmlp_12_224", "levit_128s", "mobilevit_xs", "efficientformer_l1", "pvt_v2_b0",
    "xcit_nano_12_p16_224", "cait_xxs24_224", "mobileone_s0", "fastvit_t8", "efficientvit_b0",
    # a small model of each timm family the first list lacked, since held-out error falls
    # with the number of training families (the learning curve in docs/evaluation.md)
    "bat_resnext26ts", "beit_base_patch16_224", "caformer_s18", "coat_lite_tiny",
    "coatnet_nano_rw_224", "convformer_s18", "convit_tiny", "convmixer_768_32",
    "crossvit_tiny_240", "cs3darknet_s", "cspdarknet53", "cspresnext50", "darknetaa53",
    "davit_tiny", "densenetblur121d", "dm_nfnet_f0", "eca_resnext26ts", "ecaresnet26t",
    "ecaresnext26t_32x4d", "ecaresnetlight", "efficientformerv2_s0", "efficientvim_m1",
    "ese_vovnet19b_dw", "eva02_tiny_patch14_224", "fasternet_t0", "fbnetv3_b", "flexivit_small",
    "focalnet_tiny_srf", "gc_efficientnetv2_rw_t", "gcresnet33ts", "gcresnext26ts",
    "gcvit_xxtiny", "gmixer_12_224", "gmlp_ti16_224", "hardcorenas_a", "hgnet_tiny",
    "hgnetv2_b0", "hiera_tiny_224", "iformer_t", "lambda_resnet26t", "lowformer_b0",
    "mambaout_femto", "maxvit_nano_rw_256", "maxxvit_rmlp_nano_rw_256", "mvitv2_tiny",
    "nest_tiny", "nextvit_small", "nf_resnet26", "nfnet_l0", "pit_ti_224", "rdnet_tiny",
    "regnetz_005", "repghostnet_050", "repvit_m0_9", "resnetaa34d", "resnetblur18",
    "resnetrs50", "rexnetr_100", "sedarknet21", "semnasnet_050", "sequencer2d_s", "seresnet18",
    "seresnetaa50d", "shvit_s1", "skresnet18", "skresnext50_32x4d", "spnasnet_100",
    "starnet_s1", "swiftformer_xs", "tiny_vit_5m_224", "tnt_s_patch16_224", "tresnet_m",
    "twins_svt_small", "visformer_tiny", "volo_d1_224", "xception41", "csatv2",
    "cpubone_b0_bfrobust", "cspnext_s",
    # timm families still missing after those (the HaloNets and HieraDet do not export at
    # 64 px)
    "botnet26t_256", "sebotnet33ts_256", "coatnext_nano_rw_224", "vitamin_small_224",
)
_SMALL_TEXT = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                   intermediate_size=1024)
HF_CONFIGS = {  # name -> (config class, kwargs); random weights, nothing from a hub
    "bert-tiny": ("BertConfig", dict(num_hidden_layers=2, hidden_size=128,
                                     num_attention_heads=2, intermediate_size=512)),
    "bert-mini": ("BertConfig", dict(num_hidden_layers=4, hidden_size=256,
                                     num_attention_heads=4, intermediate_size=1024)),
    "bert-small": ("BertConfig", dict(num_hidden_layers=4, hidden_size=512,
                                      num_attention_heads=8, intermediate_size=2048)),
    "bert-base": ("BertConfig", dict()),
    "distilbert-base": ("DistilBertConfig", dict()),
    "roberta-small": ("RobertaConfig", dict(num_hidden_layers=6, hidden_size=512,
                                            num_attention_heads=8, intermediate_size=2048)),
    "albert-base": ("AlbertConfig", dict(hidden_size=768, num_attention_heads=12,
                                         intermediate_size=3072)),
    "electra-small": ("ElectraConfig", dict(embedding_size=128, hidden_size=256,
                                            num_attention_heads=4, intermediate_size=1024)),
    "gpt2-tiny": ("GPT2Config", dict(n_layer=2, n_embd=128, n_head=2)),
    "gpt2-mini": ("GPT2Config", dict(n_layer=6, n_embd=384, n_head=6)),
    "gpt2-small": ("GPT2Config", dict()),
    # text families unlike the four above, each at the size of bert-mini
    **{name: (cls, dict(_SMALL_TEXT, **kw)) for name, (cls, kw) in {
        "deberta-small": ("DebertaConfig", {}),
        "mpnet-small": ("MPNetConfig", {}),
        "convbert-small": ("ConvBertConfig", {}),
        "squeezebert-small": ("SqueezeBertConfig", dict(embedding_size=256)),
        "phi-small": ("PhiConfig", {}),
        "gptneox-small": ("GPTNeoXConfig", {}),
        "biogpt-small": ("BioGptConfig", {}),
        "llama-small": ("LlamaConfig", dict(intermediate_size=688)),
        "gemma-small": ("GemmaConfig", dict(num_key_value_heads=1, head_dim=64)),
        "falcon-small": ("FalconConfig", {}),
    }.items()},
    "funnel-small": ("FunnelConfig", dict(block_sizes=[2, 2, 2], d_model=256, n_head=4,
                                          d_head=64, d_inner=1024)),
    "mobilebert-small": ("MobileBertConfig", dict(num_hidden_layers=6)),
    "gptneo-small": ("GPTNeoConfig", dict(num_layers=4, hidden_size=256, num_heads=4,
                                          attention_types=[[["global", "local"], 2]],
                                          window_size=16)),
    "gptj-small": ("GPTJConfig", dict(n_layer=4, n_embd=256, n_head=4, rotary_dim=32)),
    "opt-small": ("OPTConfig", dict(num_hidden_layers=4, hidden_size=256, ffn_dim=1024,
                                    num_attention_heads=4, word_embed_proj_dim=256)),
    "bloom-small": ("BloomConfig", dict(n_layer=4, hidden_size=256, n_head=4)),
    "ctrl-small": ("CTRLConfig", dict(n_layer=4, n_embd=256, n_head=4, dff=1024)),
}


def _torchvision_zoo() -> list[ZooModel]:
    import torchvision

    def make(name):
        def build(size):
            kwargs = dict(aux_logits=False, init_weights=False) \
                if name in ("googlenet", "inception_v3") else {}
            if name.startswith("vit_"):
                kwargs["image_size"] = size
            elif name.startswith("maxvit"):
                kwargs["input_size"] = (size, size)
            return torchvision.models.get_model(name, **kwargs)
        return build

    return [ZooModel(n, "image", make(n))
            for n in torchvision.models.list_models(module=torchvision.models)]


def _timm_zoo() -> list[ZooModel]:
    import timm

    timm.layers.set_fused_attn(False)  # explicit attention: what runs is what is exported

    def make(name):
        def build(size):
            # a 1000-class head even where the default has none (eva02_tiny: features only)
            kw = dict(pretrained=False, num_classes=1000)
            try:  # transformers fix their image size at construction
                return timm.create_model(name, img_size=size, **kw)
            except TypeError:
                return timm.create_model(name, **kw)
        return build

    return [ZooModel(n, "image", make(n)) for n in TIMM_SELECTION]


def _hf_zoo() -> list[ZooModel]:
    import torch
    import transformers

    class Wrapped(torch.nn.Module):  # forward(ids) -> logits [B, 2]
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids).logits

    def make(name):
        cls_name, kwargs = HF_CONFIGS[name]

        def build(size):
            config = getattr(transformers, cls_name)(**kwargs, num_labels=2, pad_token_id=0)
            config.max_position_embeddings = max(getattr(config, "max_position_embeddings",
                                                         512), size)
            if hasattr(config, "n_positions"):
                config.n_positions = max(config.n_positions, size)
            # eager attention: the measured model is the exported one (no fused SDPA kernel)
            return Wrapped(transformers.AutoModelForSequenceClassification.from_config(
                config, attn_implementation="eager"))
        return build

    return [ZooModel(n, "text", make(n), vocab_size=1000) for n in HF_CONFIGS]


def _novel_zoo() -> list[ZooModel]:
    from mdot_jax.measure import novel_zoo

    return [ZooModel(n, kind, lambda _, n=n: novel_zoo.build(n), vocab_size=1000, sizes=(size,))
            for n, (kind, size) in novel_zoo.MODELS.items()]


ZOOS = {"torchvision": _torchvision_zoo, "timm": _timm_zoo, "hf": _hf_zoo, "novel": _novel_zoo}


def random_model(name: str) -> ZooModel:
    """The random-zoo model its name draws (`measure.random_zoo`), at the size it draws."""
    from mdot_jax.measure import random_zoo

    s = random_zoo.spec(name)
    return ZooModel(name, s["kind"], lambda size: random_zoo.build(s), vocab_size=1000,
                    sizes=(s["size"],))


def zoo_models(names: list[str]) -> list[ZooModel]:
    """The models of the named zoos; a name in two zoos (timm's resnet18 is torchvision's)
    is taken from the first, since a sample's key is the model name. `random:N:S` is the
    random zoo's first N models of seed S."""
    from mdot_jax.measure import random_zoo

    out: dict[str, ZooModel] = {}
    for name in names:
        if name.startswith("random:"):
            n, seed = (int(v) for v in name.split(":")[1:])
            for i in range(n):
                out.setdefault(random_zoo.name_of(seed, i), random_model(
                    random_zoo.name_of(seed, i)))
            continue
        if name not in ZOOS:
            raise ValueError(f"unknown zoo {name!r}: choose from {sorted(ZOOS)} or random")
        for m in ZOOS[name]():
            out.setdefault(m.name, m)
    return list(out.values())


def find_model(name: str) -> ZooModel:
    """The zoo model called `name`, of any zoo (a random one by its name alone)."""
    from mdot_jax.measure import random_zoo

    if random_zoo.NAME.fullmatch(name):
        return random_model(name)
    models = {m.name: m for m in zoo_models(list(ZOOS))}
    if name not in models:
        raise ValueError(f"no zoo model {name!r}")
    return models[name]


def sample_exporter(view: str = "training") -> Callable[[Sample], onnx.ModelProto]:
    """`export(sample)`: the ONNX ModelProto of a profiled sample's model at its input size,
    rebuilt from its zoo with random weights (the graph is what matters), as a `view`
    (`training`, or an inference export of `converters.INFERENCE_EXPORTERS`), once per graph
    (`data.per_graph`)."""
    import torch

    def export(arch: str, size: int):
        m = find_model(arch)
        return _export(m, m.build(size), size, torch, "cpu", view)

    return copies.per_graph(export)


def resequence(src: str | Path, out: str | Path, *, fuse: bool | int = True,
               view: str = "training", progress: bool = True) -> Dataset:
    """`data.resequence` of a profiled dataset with `sample_exporter`; nothing measured (the
    training view of an older fusion version reuses what the newer one would not change)."""
    return copies.resequence(src, out, sample_exporter(view), fuse=fuse,
                           partial=view != "training", reuse=view == "training",
                           progress=progress)


def _inputs(m: ZooModel, size: int, b: int, device: str, torch):
    g = torch.Generator().manual_seed(0)
    if m.kind == "text":
        x = torch.randint(0, m.vocab_size, (b, size), generator=g)
        target = torch.randint(0, 2, (b,), generator=g)
    elif m.kind == "audio":
        x = torch.randn(b, 1, size, generator=g)
        target = torch.randint(0, 10, (b,), generator=g)
    else:
        x = torch.randn(b, 3, size, size, generator=g)
        target = torch.randint(0, 1000, (b,), generator=g)
    return x.to(device), target.to(device)


def _export(m: ZooModel, model, size: int, torch, device: str, view: str = "training"):
    x, _ = _inputs(m, size, 2, device, torch)
    names = ["input_ids" if m.kind == "text" else "x"]
    if view == "training":
        return from_torch(model, x, input_names=names)
    return inference_export(model, x, exporter=view, input_names=names)
