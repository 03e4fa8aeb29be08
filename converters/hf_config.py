"""A Hugging Face language model from its config.json alone: built on the meta device (no
weights allocated, nothing fetched), exported as its training step (`converters.export
.from_torch`), a stack of identical layers traced with two and repeated in the graph
(`converters.repeat`)."""

from __future__ import annotations

import contextlib
import copy
import json
import numbers
import os
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import onnx

from converters.audio_language import audio_text_model, audio_text_step
from converters.ctc import ctc_loss
from converters.detection import OBJECTS
from converters.dims import check_dims, drop_metadata
from converters.errors import ConversionError
from converters.experts import ROUTED, adapted, balanced, describe
from converters.export import from_torch
from converters.gradients import unread
from converters.hf_fields import (
    check_names,
    check_shape,
    defaulted,
    holding,
    known_as,
    per_layer,
    suspects,
)
from converters.hf_heads import (
    AUDIO_MAPPINGS,
    CLIPS,
    CTC_HEAD,
    DETECT_HEAD,
    HEAD_MODULES,
    IMAGES,
    MATCHED,
    PICTURED,
    SELF_SUPERVISED,
    TUBES_MASKED,
    choices,
    contrastive_model,
    contrastive_step,
    every_layer,
    image,
    language_model,
    recognised,
    recogniser,
    sound,
    task_head,
    transcript,
    unsized,
)
from converters.lora import ALL_LINEAR, add_adapters
from converters.repeat import layer_stack, repeat_layer, template
from converters.sequence import (
    DEFAULTED_KEY,
    EAGER_KEY,
    EXPERTS_KEY,
    FROZEN_KEY,
    HEAD_KEY,
    NO_FLASH_KEY,
    PARAMS_KEY,
    SDPA_KEY,
    SLIDING_KEY,
    SPARSE_KEY,
    UNREAD_KEY,
)
from converters.vision_language import (
    example_images,
    image_sizes,
    image_text_model,
    placed,
    placed_step,
)

EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts",  # config fields
                 "moe_num_experts")
# the experts a token goes to, where no experts layer traced says it
TOP_K_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "moe_top_k")


def from_hf_config(config: str | os.PathLike | dict, *, seq_len: int = 128,
                   target_len: int | None = None, repeat: bool = True,
                   lora_rank: int | None = None, lora_targets: Sequence[str] = (ALL_LINEAR,),
                   images: int = 1, image_size: int | None = None,
                   video_frames: int | None = None, audio_seconds: float | None = None,
                   **overrides: Any) -> onnx.ModelProto:
    """A Hugging Face language model built from its configuration alone (a `config.json`, its
    folder, or the dict; nothing is fetched), on the meta device, exported as its training
    graph at `seq_len` tokens with the loss of its own tokens as labels: a causal LM's next
    tokens, an encoder alone's (DistilBERT's, ModernBERT's) masked-LM loss over every position,
    an encoder-decoder's (T5's, BART's: `is_encoder_decoder`) `target_len` targets
    (default: as many as its inputs), its decoder fed them shifted right; a speech
    recogniser's (Whisper's, Moonshine's) `seq_len` target tokens from its audio (a sample's
    `audio_seconds` where its config pads no clip to a length: `hf_heads.recognised`); a task head's
    that its `architectures` names (`...ForSequenceClassification`), its labels' loss (an
    image or video classifier's or segmenter's at `image_size` and `video_frames` where
    given, a CTC's or audio classifier's on `audio_seconds` of audio: `converters.hf_heads`); a
    vision-language model's (PaliGemma's, InternVL's, Qwen-VL's) `seq_len` tokens, one
    image's features the first of them (`converters.vision_language`; a grid encoder's
    (Qwen-VL's) images of `image_size` pixels a side, the graph holding `images` of them:
    the batch it is converted at, `meta["head"]["images"]`; with `video_frames`, a video of
    so many frames a sample; one that is a causal LM too, Gemma 3's or Qwen3.5's, on its text
    unless `image_size` or `video_frames` asks for images)
    (`from_torch`; `convert(..., seq_len=...)` predicts at other lengths up to the model's
    positions).
    `overrides` change config fields (e.g. `num_hidden_layers=2`, per-layer lists cut to
    it). Any size exports without allocating weights; with `repeat`, a stack of identical
    layers (or of a pattern of kinds) is traced with two (two periods) and repeated in the
    graph (`converters.repeat`: a 70B Llama in seconds). `lora_rank`: fine-tuned with LoRA
    adapters of that rank on the linear layers `lora_targets` names, every other parameter
    frozen (`converters.lora`)."""
    import torch
    import transformers

    if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 0:
        raise ConversionError(f"seq_len {seq_len!r}: expected a positive integer (0: a model "
                              "of images or audio, which takes no tokens)")
    if isinstance(config, dict):
        fields, where = dict(config), "config"
    elif not isinstance(config, (str, os.PathLike)):
        raise ConversionError(f"config: a {type(config).__name__}; expected a config.json's "
                              "path, its folder, or its fields as a dict")
    else:
        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
        try:
            fields, where = json.loads(path.read_text()), str(path)
        except (OSError, ValueError) as e:
            raise ConversionError(f"{path}: not a readable config.json ({e})") from None
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ConversionError(f"{where}: no 'model_type' (a Hugging Face config.json has one)")
    check_names(fields, where)
    fields.update(per_layer(fields, overrides))
    kind = fields.pop("model_type")
    for key in ("torch_dtype", "dtype", "quantization_config"):  # how the checkpoint is stored,
        fields.pop(key, None)  # not how it trains: `--precision` says that
    try:
        cfg = transformers.AutoConfig.for_model(kind, **fields)
        check_shape(cfg, fields, where)
        settings = cfg.to_dict()
        settings.update({k: v for c in ("ffn_config", "text_config") for k, v in (  # DBRX's,
            settings.get(c) or {}).items() if k in EXPERT_COUNTS + TOP_K_FIELDS})  # a VLM's
        experts = max((v for k, v in settings.items()
                       if k in EXPERT_COUNTS and isinstance(v, int)), default=0)
        routed = not balanced(cfg) and experts > 1  # experts: as balanced routing
        if cfg.is_encoder_decoder:  # ids its targets are shifted right with: no work
            if getattr(cfg, "decoder_start_token_id", None) is None:
                cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
            if getattr(cfg, "pad_token_id", None) is None:  # (Moonshine's)
                cfg.pad_token_id = 0
        head = task_head(cfg)  # (T5's and BART's classifiers: not their LMs)
        video = head is not None and head.suffix in CLIPS  # its sizes set before it is built
        picture = image(cfg, image_size, where, video_frames, video) if head and \
            head.suffix in PICTURED else None  # [C, H, W]; a video's [T, C, H, W]
        auto = getattr(transformers, head.auto) if head else language_model(
            transformers, cfg, audio_seconds is not None)
        pictured = None if head else image_text_model(transformers, cfg)  # image, text in
        if vlm := pictured is not None and (auto is None or bool(image_size or video_frames)):
            auto = pictured  # a vision-language model (Gemma 3, a causal LM too: if asked)
        listener = None if head or vlm else audio_text_model(transformers, cfg)  # Voxtral's
        if listened := listener is not None and (auto is None or audio_seconds is not None):
            auto = listener[0]  # an audio-language model (a causal LM too: if audio is asked)
        if paired := auto is None and contrastive_model(transformers, cfg):  # CLIP's
            auto, picture = paired, image(cfg, image_size, where)  # its images' sizes set
        if auto is None:
            raise ConversionError(
                f"{where}: model_type {kind!r} has no causal, masked, sequence-to-sequence, "
                "image-text-to-text or audio-text language model in transformers (an image, "
                "video or audio model's config names its task head in architectures: "
                "...ForImageClassification, ...ForCTC): export the model itself with "
                "converters.from_torch")
        masked = bool(getattr(cfg, "apply_spec_augment", False)) and any(
            getattr(cfg, f, 0) for f in ("mask_time_prob", "mask_feature_prob"))
        if masked:  # SpecAugment's masks drawn in NumPy, written in place: not exported
            cfg.apply_spec_augment = False  # (an elementwise pass; `trained_as` says so)
        dropped = every_layer(cfg)  # a draw a layer a step, which a trace would freeze
        if video_frames and not vlm and not video:
            raise ConversionError(f"{where}: video_frames {video_frames}: model_type {kind!r} "
                                  + ("classifies images, not videos" if picture else
                                     "reads no images or videos"))
        if not routed:
            with torch.device("meta"):
                model = auto.from_config(cfg)
    except ConversionError:
        raise
    except Exception as e:  # transformers' own refusal of the config, whatever its type
        while e.__cause__ is not None:  # a validator's error wraps the one that says why
            e = e.__cause__  # type: ignore[assignment]
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = msg.split(". Should contain")[0]  # not the hundreds of model types known
        if isinstance(e, KeyError) and (f := holding(fields, e.args[0] if e.args else None)):
            msg = f"{f} {e.args[0]!r} is none of the names transformers knows for it"
        elif isinstance(e, (TypeError, ArithmeticError, IndexError, MemoryError, RuntimeError)):
            msg += suspects(transformers, kind, fields)  # Python's words: which field?
        raise ConversionError(f"{where}: model_type {kind!r} builds no model here: "
                              f"{msg}{known_as(transformers, kind, fields)}") from None
    if routed:
        raise ConversionError(f"{where}: model_type {kind!r} is a mixture of {experts} experts, "
                              "which this transformers has no experts interface to export as "
                              "balanced routing (transformers 5 has)")
    check_dims(target_len=target_len)
    if lora_rank is not None:  # a task head trained in full beside the adapters, as peft does
        add_adapters(model, lora_rank, lora_targets, trained=HEAD_MODULES if head else ())
    if target_len is not None and (head or not cfg.is_encoder_decoder):
        raise ConversionError(f"{where}: target_len {target_len}: model_type {kind!r} is " + (
            f"a {type(model).__name__}, trained on its labels" if head else
            "a causal LM, whose targets are its inputs (--seq-len)"))
    heard = head is not None and head.mapping in AUDIO_MAPPINGS  # a CTC's, a classifier's
    audio = None if heard else recognised(model, audio_seconds, where, kind)  # Whisper's
    ctc = heard and head is not None and head.suffix == CTC_HEAD
    detecting = head is not None and head.suffix in MATCHED  # a detector's, a segmenter's
    if audio_seconds is not None and not (heard or audio or listened):
        raise ConversionError(f"{where}: audio_seconds {audio_seconds:g}: model_type {kind!r} "
                              + ("is priced on images and text: audio beside them is not" if
                                 vlm and audio_text_model(transformers, cfg) else
                                 "trains on no waveform"))
    if audio and target_len is not None:
        raise ConversionError(f"{where}: target_len {target_len}: model_type {kind!r} "
                              "transcribes its audio into --seq-len tokens: give seq_len alone")
    step = type(model).forward  # what a language model trains on: the loss of its own tokens
    main = model.main_input_name  # input_ids; pixel_values (an image classifier's); Whisper's
    if not isinstance(main, str):  # OneFormer's: its images and its task's text
        raise ConversionError(f"{where}: model_type {kind!r} trains on {' and '.join(main)} "
                              "together: not priced from a config")

    def loss(self: Any, x: Any, *targets: Any) -> Any:  # x: the main input [1, ...]
        if ctc:  # its logits [1, frames, vocabulary], the transcript's CTC loss
            return ctc_loss(step(self, **{main: x}).logits, targets[0], self.config)
        if head and head.shaped:  # (a multiple-choice head's [B, choices, T])
            x = head.shaped(x, self.config)
        labels = dict(labels=targets[0]) if targets else head.labels(x, self.config) if head \
            else dict(labels=x if target_len is None else x.new_zeros((x.shape[0], target_len)))
        return step(self, **{main: x}, **labels).loss

    model.forward = types.MethodType(loss, model)  # bound: a copy of the model (the exporter's
    # CPU fallback) calls its own
    tokens = torch.zeros(1, seq_len, dtype=torch.long)  # [1, T]
    end = getattr(cfg, "eos_token_id", None)  # (none of DETR's, an encoder-decoder too)
    if head and cfg.is_encoder_decoder and isinstance(end, int):  # T5's, BART's classifiers
        tokens[:, -1] = end  # read the sequence's end token
    trained_as: dict | None = head and dict(head=type(model).__name__,
                               labels=cfg.num_labels if head.classes else None,
                               **(dict(pixels=picture[-2:]) if picture else {}),
                               **(dict(frames=picture[0]) if video and picture else {}),
                               **(dict(choices=choices(cfg)) if head.shaped else {}),
                               **(dict(masked=getattr(cfg, "mask_ratio", TUBES_MASKED if
                                                      video else 0.0)) if head.suffix
                                  in SELF_SUPERVISED else {}))
    if audio:  # a speech recogniser's audio, transcribed into its seq_len tokens
        trained_as = dict(head=type(model).__name__, labels=None, audio=list(audio),
                          seconds=audio_seconds, spec_augment=bool(masked), transcribed=True)
    elif not head and (other := listener[1] if listener and not listened else recogniser(cfg)):
        trained_as = dict(head=type(model).__name__, labels=None, text_alone=None,
                          recogniser=other)  # on its text, though it hears (Seamless M4T)
    if pictured and not vlm:  # trained on its text alone: what asks for an image
        trained_as = dict(head=type(model).__name__, labels=None, text_alone=image_sizes(cfg))
    if main.startswith("pixel_values") and not (picture or vlm):  # (V-JEPA 2's videos)
        raise unsized(where, kind)
    if heard:  # a sample's audio: a waveform of audio_seconds, or the features its config fixes
        clip = torch.zeros(1, *sound(cfg, main, audio_seconds, where, kind))
        assert trained_as is not None
        trained_as.update(audio=list(clip.shape[1:]), seconds=audio_seconds,
                          spec_augment=bool(masked))
        if ctc:
            tokens = transcript(model, cfg, clip, seq_len, where)
    example: Any
    if ctc or audio:  # a transcript of seq_len tokens: an input (Whisper's, a CTC's)
        example, names = (clip if ctc else torch.zeros(1, *(audio or ())), tokens), [
            main, "labels"]
    elif heard:
        example, names = clip, [main]
    elif detecting:  # each image's boxes a list the loss walks: the graph holds the batch
        example, names = torch.zeros(images, *(picture or ())), [main]
        assert trained_as is not None
        trained_as.update(images=images, objects=OBJECTS,
                          **(dict(masks=True) if head and head.suffix != DETECT_HEAD else {}))
    elif main.startswith("pixel_values") and not vlm:
        example, names = torch.zeros(IMAGES, *(picture or ())), [main]
    elif paired:  # the batch's image-text pairs, each contrasted with the others
        if picture is None:
            raise unsized(where, kind)
        model.forward, example, names = contrastive_step(model, picture, images, seq_len,
                                                         where, kind)
        trained_as = dict(head=type(model).__name__, labels=None, pixels=picture[-2:],
                          images=images, pairs=True)
    elif listened:  # a sample's audio, its features the first of the seq_len tokens
        pictures, placeholders, example, names, trained_as = audio_text_step(
            model, audio_seconds, images, seq_len, where, kind)
    elif not vlm:
        example, names = tokens, [main]
    else:  # one image a sample, its features the first of the seq_len tokens
        pictures = example_images(model, where, kind, images, image_size, video_frames)
        placeholders, model.forward, example, names = placed_step(model, pictures, seq_len,
                                                                  where)
        trained_as = dict(head=type(model).__name__, labels=None, image=pictures.size,
                          image_tokens=placeholders, **pictures.said(images))
    if trained_as is None and (other := next((a for a in cfg.architectures or () if a != type(
            model).__name__ and hasattr(transformers, a)), None)):  # (BertForMultipleChoice)
        trained_as = dict(head=type(model).__name__, labels=None, instead=other)
    if dropped:  # said whatever the model
        trained_as = dict(trained_as or {}, layerdrop=dropped)
    tokens = max(seq_len, target_len or 0)  # past its positions: exported (rotary, relative),
    lengths = {k: v for k, v in settings.items() if k in LENGTH_FIELDS and isinstance(v, int)
               and v > 0 and not picture}
    past = [[k, v, tokens] for k, v in lengths.items() if v < tokens]  # said
    if past:  # (a learned table's: refused as its graph is converted, `converters.checks`)
        trained_as = dict(trained_as or {}, positions=past[0])
    text = cfg.get_text_config()  # a vision-language model's language model's; else cfg
    filled = defaulted(text, (fields.get("text_config") or {}) if text is not cfg else fields)
    moe = experts > 1 and describe(model, experts, next(  # none where no layer holds experts
        (v for k, v in settings.items() if k in TOP_K_FIELDS and isinstance(v, int)), 1))
    said = {DEFAULTED_KEY: filled and json.dumps(filled),  # a class never calling SDPA:
            EAGER_KEY: model.config._attn_implementation == "eager" and type(model).__name__,
            SPARSE_KEY: isinstance(k := settings.get("index_topk"), int) and str(k),  # DSA
            SLIDING_KEY: (windows := _windows(model, cfg)) and json.dumps(windows),
            HEAD_KEY: trained_as and json.dumps(trained_as),  # next: a class FA2 is refused for
            NO_FLASH_KEY: not type(model)._supports_flash_attn and json.dumps(type(model).__name__)}

    def export() -> onnx.ModelProto:
        ROUTED.clear()
        try:
            with adapted(model), placed(model, pictures, placeholders) if vlm or listened else \
                    contextlib.nullcontext():
                onnx_model = from_torch(model, example, input_names=names)
        except ConversionError:  # a table or bias built for fewer positions: say which
            if not past:
                raise
            field, most, tokens = past[0]
            raise ConversionError(
                f"{where}: {tokens} tokens are more than its {field} ({most}) allows: set "
                f"{field} in the config to train longer sequences") from None
        # the class says whether it calls SDPA (EAGER_KEY), and the layers copied in the
        # graph have no export's record of their Softmax nodes
        drop_metadata(onnx_model, SDPA_KEY)
        if moe and moe["layers"]:  # the top k the router gave, as traced
            said[EXPERTS_KEY] = json.dumps(dict(moe, top_k=max(ROUTED, default=moe["top_k"])))
        for key, value in said.items():
            if value:
                onnx_model.metadata_props.add(key=key, value=value)
        return onnx_model

    stack = layer_stack(model, getattr(text, "num_hidden_layers", 0))
    with adapted(model):  # as exported
        unrolls = main == "input_ids" and not (vlm or listened) and _unrolls_tokens(model, stack)
    if unrolls:
        raise ConversionError(
            f"{where}: model_type {kind!r} exports as a loop over its tokens (a recurrence, such "
            "as RWKV's or xLSTM's scan, that the exporter unrolls where training runs one fused "
            "kernel): not priced")
    t = template(stack[1], text) if stack and repeat else None
    if stack is None or t is None:
        return export()
    src, period = t
    params = [n for n, _ in model.named_parameters()]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    try:  # up to layer src, the rest copied in the graph
        with _first_layers(model, stack, src + 1):
            onnx_model = export()
        sources = repeat_layer(onnx_model, stack[0], len(stack[1]), src, period)
    except ConversionError:  # a layer that reads more than its predecessor: trace them all
        return export()
    traced: list[str] = next((m.value.split(",") for m in onnx_model.metadata_props
                              if m.key == FROZEN_KEY), [])  # frozen, or no gradient reaches
    for k, j in sources.items():  # a copy's parameters as its layer's
        at, to = f"{stack[0]}.{j}.", f"{stack[0]}.{k}."
        frozen += [to + n[len(at):] for n in traced if n.startswith(at)]
    frozen = list(dict.fromkeys(frozen + traced))
    for key, names in ((PARAMS_KEY, params), (FROZEN_KEY, frozen)):  # the copied layers' too
        drop_metadata(onnx_model, key)  # (the traced layers may hold none frozen)
        if names:
            onnx_model.metadata_props.add(key=key, value=",".join(names))
    drop_metadata(onnx_model, UNREAD_KEY)  # of the first layers
    if missed := unread(model, {i.name for i in onnx_model.graph.input}):  # of them all
        onnx_model.metadata_props.add(key=UNREAD_KEY, value=json.dumps(missed))
    return onnx_model


# a graph two nodes a token or more larger at the second length unrolls a loop over the tokens
# (a Mamba scan's step is a dozen; masks' code may differ by a few nodes between lengths)
PROBE_TOKENS = (8, 24)
_UNROLLS: dict[frozenset, bool] = {}  # by the classes of the modules probed: what runs


@contextlib.contextmanager
def _first_layers(model: Any, stack: tuple[str, Any] | None, n: int) -> Iterator[None]:
    """`model` with the first `n` layers of its `stack` (name, ModuleList) alone, as long as the
    block runs; no stack: as it is."""
    if stack is None:
        yield
        return
    parent, _, attr = stack[0].rpartition(".")
    owner = model.get_submodule(parent)
    setattr(owner, attr, stack[1][:n])
    try:
        yield
    finally:
        setattr(owner, attr, stack[1])


def _unrolls_tokens(model: Any, stack: tuple[str, Any] | None) -> bool:
    """Whether `model`'s exported graph grows with its tokens (its first layer alone where it
    has a `stack`; `PROBE_TOKENS`): a recurrence traced step by step. A probe that fails says
    nothing."""
    import torch

    with _first_layers(model, stack, 1):
        key = frozenset(type(m).__qualname__ for m in model.modules())
        if key not in _UNROLLS:
            probe = copy.deepcopy(model)  # a forward may change its model: BigBird's sets
            try:  # its attention dense below its blocks' size, on the layers it then holds
                short, long = (len(from_torch(probe, torch.zeros(1, n, dtype=torch.long))
                                   .graph.node) for n in PROBE_TOKENS)
            except ConversionError:
                return False
            _UNROLLS[key] = long - short >= 2 * (PROBE_TOKENS[1] - PROBE_TOKENS[0])
    return _UNROLLS[key]


def _windows(model: Any, cfg: Any) -> list[int]:
    """Each layer's sliding window as transformers masks it (keys a query sees; 0: every earlier
    one), where the model's code builds sliding-window masks: `sliding_window` on the layers
    `layer_types` calls `sliding_attention`, on every layer where it names none."""
    import inspect

    try:
        code = inspect.getsource(sys.modules[type(model).__module__])
    except (KeyError, OSError, TypeError):  # no source to read: no window said
        return []
    if "create_sliding_window_causal_mask" not in code:
        return []
    n = getattr(cfg, "num_hidden_layers", None)
    try:
        window = getattr(cfg, "sliding_window", None)
    except RuntimeError:  # a heterogeneous config's field (NeoMME's): a layer's each
        windows = [getattr(c, "sliding_window", None) or 0 for c in cfg.per_layer_config]
        return windows if any(windows) and len(windows) == n else []
    if not (isinstance(window, int) and window > 0 and isinstance(n, int) and n > 0):
        return []
    kinds = getattr(cfg, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) == n:
        windows = [window if k == "sliding_attention" else 0 for k in kinds]
        return windows if any(windows) else []
    return [window] * n


# the fields that bound a model's positions (a learned table, an ALiBi bias built to length)
LENGTH_FIELDS = ("max_seq_len", "n_positions", "max_position_embeddings", "n_ctx",
                 "seq_length", "max_sequence_length", "max_target_positions")
def _main(argv: list[str]) -> int:
    """`CONFIG SEQ_LEN OUT.onnx [TARGET_LEN [LORA_RANK LORA_TARGETS [IMAGES IMAGE_SIZE
    [FRAMES [SECONDS]]]]]` (0: none; targets comma-separated): `from_hf_config` in a process of
    its own (PyTorch, transformers out of the caller's memory); a ConversionError: a line,
    status 2."""
    config, seq_len, out, target, rank, targets, images, side, frames, seconds = (
        argv + ["0", "0", "", "1", "0", "0", "0"])[:10]
    try:
        onnx.save(from_hf_config(config, seq_len=int(seq_len), target_len=int(target) or None,
                                 lora_rank=int(rank) or None,
                                 lora_targets=tuple(targets.split(",")) if targets
                                 else (ALL_LINEAR,), images=int(images),
                                 image_size=int(side) or None,
                                 video_frames=int(frames) or None,
                                 audio_seconds=float(seconds) or None), out)
    except ConversionError as e:
        print(e, file=sys.stderr, flush=True)  # the caller may `os._exit` after
        return 2
    return 0
