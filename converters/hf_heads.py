"""The task heads a Hugging Face config's `architectures` names (a classifier's, a question
answerer's, a segmenter's, a speech recogniser's CTC: its head and loss, not a language
model's), and their inputs: a picture head's size (and frames) it trains at, set in its config
where the config holds them; an audio head's seconds of audio a sample."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from converters.detection import boxes, masks
from converters.errors import ConversionError
from converters.vision_language import MOST

IMAGE_HEAD = "ForImageClassification"  # an image classifier's config: no tokens, its image's
VIDEO_HEAD = "ForVideoClassification"  # a video classifier's: a clip of frames a sample
SEGMENT_HEAD = "ForSemanticSegmentation"  # a segmenter's: a class a pixel
MAE_HEAD = "ViTMAEForPreTraining"  # self-supervised: the patches its random mask leaves
VIDEO_MAE_HEAD = "VideoMAEForPreTraining"  # the tubes of a clip its mask leaves
MIM_HEAD = "ForMaskedImageModeling"  # SimMIM's: masked patches' pixels reconstructed
CHOICE_HEAD = "ForMultipleChoice"  # SWAG's, RACE's: a sequence a choice, a class a sample
CHOICES, CHOICES_FIELD = 4, "num_choices"  # SWAG's and RACE's count; the config field that
# gives another (not transformers': a user's)
DETECT_HEAD = "ForObjectDetection"  # DETR's: boxes an image, matched to its queries
MASK_HEADS = ("ForUniversalSegmentation", "ForInstanceSegmentation")  # Mask2Former's,
# MaskFormer's: masks an image, matched to its queries
PICTURED = (IMAGE_HEAD, VIDEO_HEAD, SEGMENT_HEAD, MAE_HEAD, VIDEO_MAE_HEAD, MIM_HEAD,
            DETECT_HEAD, *MASK_HEADS)
MATCHED = (DETECT_HEAD, *MASK_HEADS)  # each image's targets a list: the graph holds its batch
CLIPS = (VIDEO_HEAD, VIDEO_MAE_HEAD)  # a sample a clip of frames
SELF_SUPERVISED = (MAE_HEAD, VIDEO_MAE_HEAD, MIM_HEAD)  # their images' pixels their labels
TUBES_MASKED = 0.9  # VideoMAE's pretraining ratio (its paper's; its config gives none)
CTC_HEAD = "ForCTC"  # a speech recogniser's (wav2vec 2.0's): audio in, a transcript's loss
AUDIO_MAPPINGS = ("MODEL_FOR_CTC_MAPPING", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING")
AUDIO_FIELDS = ("conv_dim", "num_mel_bins", "feature_projection_input_dim")  # an audio config's
RATE = 16_000  # a waveform's samples a second (wav2vec 2.0's feature extractors')
MOST_SECONDS = 3600.0  # the longest audio a sample priced
# a feature-input recogniser's frame width and frames a second, by its config's field:
# Wav2Vec2-BERT's pairs of 80 mel bins stacked (50 a second), Parakeet's and LASR's mel bins
# at their extractors' 10 ms hop, Speech2Text's filter banks (its input channels of them) too
FEATURES = (("feature_projection_input_dim", 50), ("num_mel_bins", 100),
            ("input_feat_per_channel", 100))
SIDES = ("image_size", "crop_size")  # a config's image side (V-JEPA 2's crop)
FRAMES = ("num_frames", "frames_per_clip")  # a video classifier's clip length
HEAD_MODULES = ("classifier", "score", "qa_outputs")  # peft's task models' `modules_to_save`
LAYERDROP = "layerdrop"  # how a field of a layer's chance to skip ends (Seamless M4T's
# speech_encoder_layerdrop)
IMAGES = 2  # a picture head's example batch: one image has no batch statistics
# (LeViT's BatchNorm1d refuses it in training)


class Head(NamedTuple):
    """A task head a config's `architectures` names (`suffix`): transformers' `mapping` of the
    configs that build it, its `auto` class, its `labels` for the main input [B, ...] and the
    model's config (a class a sequence, a token or a pixel, where an answer starts and ends,
    the patches masked; none where its loss needs none), and whether `num_labels` counts
    classes."""

    suffix: str
    mapping: str
    auto: str
    labels: Callable[[Any, Any], dict]
    classes: bool = True
    shaped: Callable[[Any, Any], Any] | None = None  # the main input as the head reads it


def _choices(x: Any, cfg: Any) -> Any:
    """Token ids x [B, T] as a multiple-choice head reads them, [B, choices, T]: each choice
    its own sequence (their ids are the data's; their count the config's `CHOICES_FIELD`)."""
    return x.unsqueeze(1).expand(-1, choices(cfg), -1)


def choices(cfg: Any) -> int:
    """A multiple-choice model's choices a sample: its config's `num_choices`, else
    `CHOICES`."""
    n = getattr(cfg, CHOICES_FIELD, CHOICES)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 < n <= 64:
        raise ConversionError(f"{CHOICES_FIELD} {n!r}: give 2 to 64 choices a sample")
    return n


def _a_class(x: Any, cfg: Any) -> dict:
    """A class a sample of the main input [B, ...]."""
    return dict(labels=x.new_zeros(x.shape[:1]).long())


def _masked_tubes(x: Any, cfg: Any) -> dict:
    """VideoMAE's mask over the tubes of clips x [B, T, C, H, W], `TUBES_MASKED` of them: the
    last ones, as CPU values (it picks the visible ones by boolean indexing: a random draw
    would be the data's; which ones changes no work)."""
    import torch

    tubes = x.shape[1] // cfg.tubelet_size * (x.shape[-2] // cfg.patch_size) * (
        x.shape[-1] // cfg.patch_size)
    seen = tubes - int(TUBES_MASKED * tubes)
    return dict(bool_masked_pos=(torch.arange(tubes) >= seen).expand(x.shape[0], -1))


def _masked_patches(x: Any, cfg: Any) -> dict:
    """SimMIM's mask over the patches of images x [B, C, H, W] (which are masked changes no
    work: the masked ones are replaced by its mask token, every pixel's loss weighted)."""
    return dict(bool_masked_pos=x.new_zeros(
        (x.shape[0], (x.shape[-2] // cfg.patch_size) * (x.shape[-1] // cfg.patch_size))).bool())


HEADS = (
    Head("ForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
         "AutoModelForSequenceClassification", _a_class),
    Head("ForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING",
         "AutoModelForTokenClassification", lambda x, _: dict(labels=x.new_zeros(x.shape))),
    Head(CHOICE_HEAD, "MODEL_FOR_MULTIPLE_CHOICE_MAPPING", "AutoModelForMultipleChoice",
         _a_class, classes=False, shaped=_choices),
    Head("ForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING",
         "AutoModelForQuestionAnswering", lambda x, _: dict(
             start_positions=x.new_zeros(x.shape[:1]), end_positions=x.new_zeros(x.shape[:1])),
         classes=False),
    Head(IMAGE_HEAD, "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING", "AutoModelForImageClassification",
         _a_class),
    Head(VIDEO_HEAD, "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING", "AutoModelForVideoClassification",
         _a_class),
    Head(SEGMENT_HEAD, "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING",
         "AutoModelForSemanticSegmentation",  # a class a pixel [B, H, W] of images [B, C, H, W]
         lambda x, _: dict(labels=x.new_zeros((x.shape[0], *x.shape[2:])).long())),
    Head(MAE_HEAD, "MODEL_FOR_PRETRAINING_MAPPING", "AutoModelForPreTraining",  # its mask drawn
         lambda x, _: {}, classes=False),  # in its forward
    Head(VIDEO_MAE_HEAD, "MODEL_FOR_PRETRAINING_MAPPING", "AutoModelForPreTraining",
         _masked_tubes, classes=False),
    Head(MIM_HEAD, "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING",
         "AutoModelForMaskedImageModeling", _masked_patches, classes=False),
    Head(DETECT_HEAD, "MODEL_FOR_OBJECT_DETECTION_MAPPING", "AutoModelForObjectDetection",
         boxes),
    *(Head(suffix, "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING",
           "AutoModelForUniversalSegmentation", masks) for suffix in MASK_HEADS),
    Head(CTC_HEAD, "MODEL_FOR_CTC_MAPPING", "AutoModelForCTC", lambda x, _: {},  # its
         classes=False),  # transcript: an input
    # an audio classifier's (wav2vec 2.0's are `...ForSequenceClassification`: the text
    # head's mapping builds no audio config, so this one is found)
    Head("ForSequenceClassification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING",
         "AutoModelForAudioClassification", _a_class),
    Head("ForAudioClassification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING",
         "AutoModelForAudioClassification", _a_class))


def task_head(cfg: Any) -> Head | None:
    """The task head `cfg.architectures` names (a Llama or BERT fine-tuned to classify or to
    answer: its head and loss, not a language model's); None where it names none that
    transformers builds for `cfg`."""
    from transformers.models.auto import modeling_auto as auto

    return next((h for arch in getattr(cfg, "architectures", None) or () for h in HEADS
                 if arch.endswith(h.suffix) and type(cfg) in getattr(auto, h.mapping)), None)


def language_model(transformers: Any, cfg: Any, heard: bool) -> Any:
    """The auto class that builds `cfg`'s language model: the one whose class its
    `architectures` names (BERT's masked LM, Seamless M4T's speech recogniser), else an
    encoder-decoder's (a speech recogniser's where `heard`, audio asked: Whisper), else a
    causal LM's, else (an encoder alone: ModernBERT, DistilBERT, ALBERT) a masked LM's; None
    where transformers has none of them."""
    from transformers.models.auto import modeling_auto as auto

    options = [(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING, transformers.AutoModelForSeq2SeqLM),
               (auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING, transformers.AutoModelForSpeechSeq2Seq)
               ][::-1 if heard else 1] if cfg.is_encoder_decoder else [
        (auto.MODEL_FOR_CAUSAL_LM_MAPPING, transformers.AutoModelForCausalLM),
        (auto.MODEL_FOR_MASKED_LM_MAPPING, transformers.AutoModelForMaskedLM)]
    built = [(getattr(mapping[type(cfg)], "__name__", ""), cls) for mapping, cls in options
             if type(cfg) in mapping]
    named = getattr(cfg, "architectures", None) or ()
    return next((cls for name, cls in built if name in named), built[0][1] if built else None)


def every_layer(cfg: Any) -> dict[str, float]:
    """Every layer of `cfg`'s model trained: its fields of a layer's chance to skip a step
    (LayerDrop: wav2vec 2.0's `layerdrop`, M2M-100's `encoder_layerdrop`, Seamless M4T's
    `speech_encoder_layerdrop`, Parakeet's in its encoder config), which a trace would freeze
    one draw of, set to 0; those that were not, by field."""
    import transformers

    dropped = {}
    for sub in [cfg, *(v for v in vars(cfg).values()
                       if isinstance(v, transformers.PretrainedConfig))]:
        for f in [f for f in vars(sub) if f.endswith(LAYERDROP)]:
            if isinstance(p := getattr(sub, f), float) and p:
                dropped[f] = p
                setattr(sub, f, 0.0)
    return dropped


def input_kind(config: dict) -> str:
    """What a config.json's fields (`config`) train on, without building the model: "image"
    where they name an image or video classifier (ViT, VideoMAE fine-tuned: `architectures`),
    a detector, a mask segmenter or a self-supervised image model (MAE, SimMIM),
    "audio" where a speech recogniser's CTC or an audio classifier (wav2vec 2.0's, AST's),
    else "tokens"."""
    names = [str(a) for a in config.get("architectures") or ()]
    if any(a.endswith(PICTURED) for a in names):
        return "image"
    if any(a.endswith((CTC_HEAD, "ForAudioClassification")) or a.endswith(
            "ForSequenceClassification") and any(f in config for f in AUDIO_FIELDS)
           for a in names):
        return "audio"
    return "tokens"


def holds_images(config: dict) -> bool:
    """Whether a config.json's training graph holds its batch's images, without building the
    model: a detector's or mask segmenter's (each image's targets a list the loss walks:
    `MATCHED`, by `architectures`), a grid encoder's (Qwen-VL's, GLM-4V's: patches over time
    too). Such a graph converts at the batch it was exported at alone."""
    vision = config.get("vision_config")
    return any(str(a).endswith(MATCHED) for a in config.get("architectures") or ()) or (
        isinstance(vision, dict) and "temporal_patch_size" in vision)


def needs_tokens(config: dict) -> bool:
    """Whether a config.json's model is sized by its tokens (`seq_len`): a language model's,
    a text classifier's, a speech recogniser's transcript; not a picture's or an audio
    classifier's."""
    return input_kind(config) == "tokens" or any(
        str(a).endswith(CTC_HEAD) for a in config.get("architectures") or ())


def sound(cfg: Any, main: str, seconds: float | None, where: str, kind: str) -> tuple[int, ...]:
    """A sample's audio input for an audio head: a waveform [samples] of `seconds` at `RATE`
    (wav2vec 2.0's, HuBERT's, WavLM's), features [frames, width] of `seconds` at the rate its
    feature extractor gives them (`FEATURES`: Parakeet's, Wav2Vec2-BERT's), or the spectrogram
    its config fixes (AST's [max_length, num_mel_bins]; Whisper's [num_mel_bins, 2 x
    max_source_positions], its 30 s); a ConversionError where `seconds` is missing or does
    not apply."""
    if fixed := _spectrogram(cfg, main):
        if seconds is not None:
            raise ConversionError(f"{where}: audio_seconds {seconds:g}: model_type {kind!r} "
                                  f"pads every clip to its {fixed} features")
        return fixed
    holders = (cfg, getattr(cfg, "encoder_config", None), getattr(cfg, "encoder", None))
    width, rate = next(((getattr(c, f) * getattr(c, "input_channels", 1), r) for c in holders
                        for f, r in FEATURES if isinstance(getattr(c, f, None), int)),
                       (None, RATE))
    if main != "input_values" and width is None:
        raise ConversionError(f"{where}: model_type {kind!r} takes audio features its config "
                              "does not size: export the model itself with converters.from_torch")
    seconds = asked_seconds(seconds, where, kind)
    if main == "input_values":
        return (round(seconds * RATE),)
    return max(round(seconds * rate), 1), int(width or 0)


def asked_seconds(seconds: float | None, where: str, kind: str, padded: str = "") -> float:
    """A sample's `seconds` of audio, given and in range (a frame of wav2vec 2.0's features
    to `MOST_SECONDS`); else a ConversionError (`padded`: what its processor pads them to)."""
    if seconds is None:
        raise ConversionError(f"{where}: model_type {kind!r} trains on audio of any length: "
                              f"give audio_seconds (a sample's seconds of audio{padded})")
    if not 0.025 <= seconds <= MOST_SECONDS:
        raise ConversionError(f"{where}: audio_seconds {seconds:g}: give 0.025 to "
                              f"{MOST_SECONDS:,.0f} seconds")
    return seconds


def image(cfg: Any, side: int | None, where: str, frames: int | None = None,
          video: bool = False) -> tuple[int, ...] | None:
    """An image classifier's input image [channels, height, width] (a video classifier's clip
    [frames, channels, height, width]): `side` pixels a side (`frames` frames) where given,
    set in its config where the config sizes its images (a ViT's position table is built for
    them, as fine-tuning at another resolution does; a CLIP's or SigLIP's vision config's),
    else the size its config gives (a timm model's pretrained input size); None where neither
    says one (a ResNet's trains at any: `unsized`)."""
    holders = (cfg, getattr(cfg, "vision_config", None))
    holder, field = next(((c, f) for c in holders for f in SIDES
                          if getattr(c, f, None) is not None), (None, ""))
    channels = getattr(holder or cfg, "num_channels", 3)
    timm = (getattr(cfg, "pretrained_cfg", None) or {}).get("input_size")  # [C, H, W]
    clip: tuple[int, ...] = ()
    if video:
        length = next((f for f in FRAMES if isinstance(getattr(cfg, f, None), int)), None)
        if length is None:
            raise ConversionError(f"{where}: its config gives no frames a clip "
                                  f"({' or '.join(FRAMES)})")
        if frames is not None and not 0 < frames <= MOST["video_frames"]:
            raise ConversionError(f"{where}: video_frames {frames:,}: give 1 to "
                                  f"{MOST['video_frames']:,} frames")
        if frames is not None:
            setattr(cfg, length, frames)
        clip = (getattr(cfg, length),)
    if side is not None:
        if not 0 < side <= MOST["image_size"]:
            raise ConversionError(f"{where}: image_size {side:,}: give a side of 1 to "
                                  f"{MOST['image_size']:,} pixels")
        if (cell := windowed(cfg)) and side % cell:
            patch = cfg.backbone_config.patch_size
            raise ConversionError(f"{where}: image_size {side:,}: its backbone cuts the image's "
                                  f"{patch}-pixel patches into {cell // patch} x {cell // patch} "
                                  f"windows: give a multiple of {cell}")
        if holder is not None:
            size = getattr(holder, field)
            setattr(holder, field, side if isinstance(size, int) else [side, side])
        return *clip, (timm[0] if timm else channels), side, side
    if timm:
        return tuple(timm)
    if holder is None:
        return None
    size = getattr(holder, field)
    sides = [size] * 2 if isinstance(size, int) else list(size)
    if len(sides) != 2 or not all(isinstance(d, int) and d > 0 for d in sides + [channels]):
        raise ConversionError(f"{where}: {field} {size} is no side or [height, width] of "
                              "pixels: give image_size")
    return *clip, channels, sides[0], sides[1]


def windowed(cfg: Any) -> int:
    """The pixels a side of the cells a windowed ViT backbone's image is a whole number of
    (RF-DETR's, LW-DETR's: patches times windows a side); 0 where it has none."""
    backbone = getattr(cfg, "backbone_config", None)
    windows = getattr(backbone, "num_windows_side", None) or getattr(backbone, "num_windows", 0)
    patch = getattr(backbone, "patch_size", None)
    return patch * windows if isinstance(patch, int) and isinstance(windows, int) and \
        windows > 1 else 0


def unsized(where: str, kind: str) -> ConversionError:
    """The error of an image classifier whose config sizes no image, none asked."""
    return ConversionError(f"{where}: model_type {kind!r} trains on images of any size, which "
                           "its config does not give: give image_size (the side its images "
                           "train at, its image processor's crop: 224 for most)")


def transcript(model: Any, cfg: Any, clip: Any, seq_len: int, where: str) -> Any:
    """A CTC head's transcript [1, seq_len] of `clip` [1, ...]: token ids other than its blank
    (its pad token); a ConversionError where its frames are fewer than the tokens."""
    import torch

    frames = getattr(model, "_get_feat_extract_output_lengths", None)
    n = int(frames(torch.tensor(clip.shape[1]))) if frames and clip.dim() == 2 else None
    if n is not None and n < seq_len:
        raise ConversionError(f"{where}: seq_len {seq_len}: {clip.shape[1] / RATE:g} s of audio "
                              f"make {n} frames of features, fewer than the transcript's tokens")
    blank, vocab = int(cfg.pad_token_id or 0), int(cfg.vocab_size)
    ids = torch.arange(seq_len) % max(vocab - 1, 1)
    return (ids + (ids >= blank).long())[None]  # [1, T]


def recognised(model: Any, seconds: float | None, where: str, kind: str
               ) -> tuple[int, ...] | None:
    """One sample's audio input where `model` is an encoder-decoder speech recogniser
    (transformers' speech-to-text models: Whisper's features, every clip padded to its 30 s;
    Moonshine's, SpeechT5's or a wav2vec 2.0 encoder's waveform, Speech2Text's, Seamless
    M4T's, Canary's features, of `seconds`: `sound`); None for a language model."""
    from transformers.models.auto import modeling_auto as auto

    if not model.config.is_encoder_decoder or type(model) is not \
            auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING.get(type(model.config), None):
        return None  # (Seamless M4T's text-to-text model: its speech recogniser's config)
    main = model.main_input_name
    if main == "inputs":  # a SpeechEncoderDecoderModel's: its encoder's
        main = model.get_encoder().main_input_name
    return sound(model.config, main, seconds, where, kind)


def recogniser(cfg: Any) -> str | None:
    """The speech recogniser transformers builds of `cfg`'s type where it is an
    encoder-decoder's (Seamless M4T's, beside its text-to-text model): its class's name."""
    from transformers.models.auto import modeling_auto as auto

    speech = auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING
    return getattr(speech[type(cfg)], "__name__", None) if cfg.is_encoder_decoder and \
        type(cfg) in speech else None


def _spectrogram(cfg: Any, main: str) -> tuple[int, int] | None:
    """The features a sample that `cfg` fixes, every clip padded to them: AST's
    [max_length, num_mel_bins] (`input_values`), Whisper's [num_mel_bins, 2 x
    max_source_positions] (`input_features`); None where it fixes none."""
    bins = getattr(cfg, "num_mel_bins", None)
    fixed = (getattr(cfg, "max_length", None), bins) if main == "input_values" else (
        bins, 2 * getattr(cfg, "max_source_positions", 0) or None)
    return fixed if all(isinstance(d, int) for d in fixed) else None  # type: ignore[return-value]


def contrastive_model(transformers: Any, cfg: Any) -> Any:
    """transformers' auto class for `cfg` where it is a dual encoder trained on image-text
    pairs (CLIP's, SigLIP's, ALIGN's: its forward returns their contrastive loss), else None."""
    from transformers.models.auto import modeling_auto as auto

    mapping = auto.MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING
    cls: Any = mapping[type(cfg)] if type(cfg) in mapping else None
    if getattr(cls, "main_input_name", "") != "input_ids" or "return_loss" not in \
            inspect.signature(cls.forward).parameters:  # (VideoPrism's clips: not priced)
        return None
    return transformers.AutoModelForZeroShotImageClassification


def contrastive_step(model: Any, picture: tuple[int, ...], pairs: int, seq_len: int,
                     where: str, kind: str) -> tuple[Any, tuple, list[str]]:
    """A dual encoder's training step on `pairs` image-text pairs, images [B, C, H, W] and
    tokens [B, T]: its loss contrasting each pair with the batch's others (a B x B matrix of
    their similarities, its size in the graph: exported at the batch). Its forward, the
    example's inputs and their names; a ConversionError where it takes its images as lists
    of patches (SigLIP2's)."""
    import torch

    forward = type(model).forward
    if "spatial_shapes" in inspect.signature(forward).parameters:
        raise ConversionError(f"{where}: model_type {kind!r} takes its images as lists of "
                              "patches (spatial_shapes): not priced from its config; export "
                              "the model itself with converters.from_torch")

    def loss(self: Any, pixel_values: Any, input_ids: Any) -> Any:
        return forward(self, input_ids=input_ids, pixel_values=pixel_values,
                       return_loss=True).loss

    return types.MethodType(loss, model), (torch.zeros(pairs, *picture), torch.zeros(
        pairs, seq_len, dtype=torch.long)), ["pixel_values", "input_ids"]
