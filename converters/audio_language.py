"""An audio-language model from its config.json (Voxtral, Audio Flamingo 3: a speech encoder
whose features a causal LM reads in its text): built by its transformers auto class (`MAPPINGS`)
on the meta device and exported as its fine-tuning step on
`audio_seconds` of audio a sample and `seq_len` tokens of text, the audio's features the first
N of them (the placeholders its processor writes), every token's loss.

Their encoders are Whisper's: a chunk of audio is `num_mel_bins` x 2 `max_source_positions`
frames of 10 ms (30 s), every sample's audio padded to whole chunks (`example_audio`); the
features are written into the token embeddings as a vision-language model's image features are
(`converters.vision_language.placed`: the first N positions, N counted by running the forward
on the meta device). An encoder given a mask of each chunk's frames (Audio Flamingo 3's) takes
the audio's, its last chunk's padding masked, values on the CPU (`meta_joins`) that size its
features: its graph holds the example's batch, as a grid image encoder's does."""

from __future__ import annotations

import inspect
import math
from typing import Any

from converters.errors import ConversionError
from converters.hf_heads import asked_seconds
from converters.image_tiles import Images
from converters.vision_language import placed_step

# transformers' mappings of these models' configs (Voxtral's, Audio Flamingo 3's, GLM-ASR's),
# and the auto class of each
MAPPINGS = (("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING", "AutoModelForSpeechSeq2Seq"),
            ("MODEL_FOR_MULTIMODAL_LM_MAPPING", "AutoModelForMultimodalLM"),
            ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING", "AutoModelForSeq2SeqLM"))
KEY = "input_features"  # their forward's audio input
MASKS = ("input_features_mask", "feature_attention_mask")  # a chunk's frames, where taken
FRAMES_A_SECOND = 100  # a Whisper encoder's mel frames (10 ms hop)


def audio_text_model(transformers: Any, cfg: Any) -> tuple[Any, str] | None:
    """transformers' auto class for `cfg` and the class it builds, where it is an
    audio-language model's (a causal LM reading a speech encoder's features:
    `get_audio_features`), else None."""
    from transformers.models.auto import modeling_auto as auto

    if cfg.is_encoder_decoder:
        return None
    for mapping, name in MAPPINGS:
        if type(cfg) in (classes := getattr(auto, mapping, {})):
            cls = classes[type(cfg)]
            return (getattr(transformers, name), cls.__name__) if hasattr(
                cls, "get_audio_features") else None
    return None


def example_audio(model: Any, seconds: float | None, samples: int, where: str,
                  kind: str) -> Images:
    """`samples` samples' audio of `seconds` each, as whole chunks of its encoder's features
    ([B, mel bins, frames]; several chunks: [B, chunks, mel bins, frames]), with a mask of the
    audio's frames where its forward takes one (its last chunk's padding left out; the graph
    holds the batch, `samples`); a ConversionError where its config sizes no chunk or
    `seconds` is missing or out of range."""
    import torch

    audio = getattr(model.config, "audio_config", None)
    bins, positions = (getattr(audio, f, None) for f in ("num_mel_bins", "max_source_positions"))
    if not (isinstance(bins, int) and isinstance(positions, int)):
        raise ConversionError(f"{where}: model_type {kind!r} takes audio its config does not "
                              "size (no Whisper encoder's num_mel_bins and max_source_positions"
                              "): export the model itself with converters.from_torch")
    frames = 2 * positions  # a chunk's: its stride-2 convolution halves them into positions
    chunk = frames / FRAMES_A_SECOND
    seconds = asked_seconds(seconds, where, kind, f": its processor pads them to chunks of "
                            f"{chunk:g} s")
    chunks = math.ceil(seconds / chunk - 1e-9)
    takes = inspect.signature(type(model).forward).parameters
    mask = next((m for m in MASKS if m in takes), None)
    held = mask is not None
    rows = samples if held else 1
    heard = torch.zeros(rows, chunks * frames, dtype=torch.long)  # the audio's frames, 1
    heard[:, :round(seconds * FRAMES_A_SECOND)] = 1  # (its last chunk's padding 0)
    fixed = {mask: heard.view(rows * chunks, frames)} if mask else {}
    pixels = torch.zeros(rows, chunks, bins, frames) if chunks > 1 else \
        torch.zeros(rows, bins, frames)
    return Images(pixels, fixed, [bins, frames], held, key=KEY, chunks=chunks)


def audio_text_step(model: Any, seconds: float | None, samples: int, seq_len: int, where: str,
                    kind: str) -> tuple[Images, int, tuple, list[str], dict]:
    """`model`'s training step on `seconds` of audio a sample (`example_audio`) and `seq_len`
    tokens, the audio's features the first N of them (set as its forward): the audio, N, the
    example's inputs and their names, and what it is trained as; a ConversionError where the
    audio takes the tokens."""
    audio = example_audio(model, seconds, samples, where, kind)
    tokens, model.forward, example, names = placed_step(model, audio, seq_len, where)
    return audio, tokens, example, names, dict(
        head=type(model).__name__, labels=None, audio=audio.size, chunks=audio.chunks,
        seconds=seconds, audio_tokens=tokens, **audio.said(samples))
