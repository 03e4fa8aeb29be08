"""The task heads a Hugging Face config's `architectures` names (a classifier's, a question
answerer's: its head and loss, not a language model's), and an image or video classifier's
input: the size (and frames) it trains at, set in its config where the config holds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from converters.errors import ConversionError
from converters.vision_language import MOST

IMAGE_HEAD = "ForImageClassification"  # an image classifier's config: no tokens, its image's
VIDEO_HEAD = "ForVideoClassification"  # a video classifier's: a clip of frames a sample
PICTURED = (IMAGE_HEAD, VIDEO_HEAD)
SIDES = ("image_size", "crop_size")  # a config's image side (V-JEPA 2's crop)
FRAMES = ("num_frames", "frames_per_clip")  # a video classifier's clip length
HEAD_MODULES = ("classifier", "score", "qa_outputs")  # peft's task models' `modules_to_save`
IMAGES = 2  # an image classifier's example batch: one image has no batch statistics
# (LeViT's BatchNorm1d refuses it in training)


class Head(NamedTuple):
    """A task head a config's `architectures` names (`suffix`): transformers' `mapping` of the
    configs that build it, its `auto` class, its `labels` for the main input [B, ...] (a class
    a sequence or a token, where an answer starts and ends), and whether `num_labels` counts
    classes."""

    suffix: str
    mapping: str
    auto: str
    labels: Callable[[Any], dict]
    classes: bool = True


HEADS = (
    Head("ForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
         "AutoModelForSequenceClassification", lambda x: dict(labels=x.new_zeros(x.shape[:1]))),
    Head("ForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING",
         "AutoModelForTokenClassification", lambda x: dict(labels=x.new_zeros(x.shape))),
    Head("ForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING",
         "AutoModelForQuestionAnswering", lambda x: dict(
             start_positions=x.new_zeros(x.shape[:1]), end_positions=x.new_zeros(x.shape[:1])),
         classes=False),
    *(Head(h, f"MODEL_FOR_{kind}_CLASSIFICATION_MAPPING", f"AutoModelFor{h[3:]}",
           lambda x: dict(labels=x.new_zeros(x.shape[:1]).long()))
      for h, kind in ((IMAGE_HEAD, "IMAGE"), (VIDEO_HEAD, "VIDEO"))))


def task_head(cfg: Any) -> Head | None:
    """The task head `cfg.architectures` names (a Llama or BERT fine-tuned to classify or to
    answer: its head and loss, not a language model's); None where it names none that
    transformers builds for `cfg`."""
    from transformers.models.auto import modeling_auto as auto

    return next((h for arch in getattr(cfg, "architectures", None) or () for h in HEADS
                 if arch.endswith(h.suffix) and type(cfg) in getattr(auto, h.mapping)), None)


def reads_images(config: dict) -> bool:
    """Whether a config.json's fields (`config`) name an image or video classifier (ViT, Swin,
    ConvNeXt, VideoMAE fine-tuned: `architectures`), trained on pictures, not on tokens."""
    return any(str(a).endswith(PICTURED) for a in config.get("architectures") or ())


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


def unsized(where: str, kind: str) -> ConversionError:
    """The error of an image classifier whose config sizes no image, none asked."""
    return ConversionError(f"{where}: model_type {kind!r} trains on images of any size, which "
                           "its config does not give: give image_size (the side its images "
                           "train at, its image processor's crop: 224 for most)")
