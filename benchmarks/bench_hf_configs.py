"""Every model type of the installed transformers for a task, from a config to a price.

    python benchmarks/bench_hf_configs.py --out benchmarks/results/hf-configs
    python benchmarks/bench_hf_configs.py --task image-classification \
        --out benchmarks/results/hf-configs-image-classification

`--task` (`TASKS`) picks transformers' auto mapping of the types swept: causal LMs (the
default), sequence-to-sequence LMs, masked LMs, or a task head (sequence, token, image, video
or audio classification, question answering, multiple choice, semantic segmentation, SimMIM's
masked image modeling, DETR's object detection, Mask2Former's segmentation, speech recognisers'
CTC, speech-to-text models: the config's `architectures` names the mapping's class), or
vision-language models (image-text-to-text: transformers' defaults at 4,096 tokens, on an
image of its config's size, or of the size its refusal or its note of training on text alone
names, 224 where it asks for one), or dual encoders (zero-shot-image-classification: CLIP's, on
image-text pairs, 64 tokens). A text type's config is transformers' defaults with one small
shape (`SMALL`: the fields a type does not know are dropped by its class or refused); an image,
video or audio type's is transformers' defaults (built on the meta device: no size costs
memory), at 224 pixels where its config sizes no image (a ResNet's: `--image-size`, as a user
gives it), on 10 s of audio where it takes a waveform of any length (wav2vec 2.0's:
`--audio-seconds`; a CTC's or a speech-to-text model's transcript 64 tokens). Each is exported
by `converters.from_hf_config` (text at 64 tokens), converted at batch 2 and priced on 8 H100s
(FSDP, amp-bf16, AdamW). Recorded per type: priced (parameters, against the meta-device model's
own count; ms; MFU) or the one-line refusal. A refusal may be the small config's (a type whose
fields must agree otherwise), so the count of priced types is a floor. Anything but a one-line
`ConversionError` / `MdotError` is a bug; so is a parameter count off the model's by more than
2% outside multimodal models and cross-attention decoders (TrOCR's): their towers and
cross-attention are not in a text step, so they take no gradient there. A type whose export
fails on tensors of unequal sizes is tried once more without `LATENT` (latent attention wants
as many key-value heads as heads, and head widths of its own). Resumable: one line a type in
`types.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from pathlib import Path

SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1024, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, max_position_embeddings=512, head_dim=32, mamba_n_heads=8,
             mamba_d_head=32, n_embd=128, n_layer=3, n_head=4, d_model=128, n_layers=3,
             n_heads=4, num_layers=3, max_seq_len=512, n_positions=512)
LATENT = ("num_key_value_heads", "head_dim")  # DeepSeek's, MiniCPM3's, GLM-4.7-Flash's shapes


# task: (transformers' mapping of the types swept, whether its class is named in
# `architectures` (a task head), what it reads: text, pictures (images or clips) or audio)
TASKS = {"causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", False, "text"),
         "seq2seq-lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", False, "text"),
         "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", False, "text"),
         "sequence-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", True,
                                     "text"),
         "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", True, "text"),
         "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", True, "text"),
         "multiple-choice": ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", True, "text"),
         "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", True,
                                  "picture"),
         "video-classification": ("MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES", True,
                                  "picture"),
         "semantic-segmentation": ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", True,
                                   "picture"),
         "masked-image-modeling": ("MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES", True,
                                   "picture"),
         "object-detection": ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", True, "picture"),
         "universal-segmentation": ("MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES", True,
                                    "picture"),
         "ctc": ("MODEL_FOR_CTC_MAPPING_NAMES", True, "audio"),
         "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", True, "audio"),
         "speech-seq2seq": ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", True, "audio"),
         "image-text-to-text": ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", False, "image-text"),
         "zero-shot-image-classification": (
             "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES", False, "image-text")}
TRANSCRIBED = ("ctc", "speech-seq2seq")  # audio tasks trained on a transcript's tokens
SIDE = 224  # an image type's side where its config sizes none
SECONDS = 10.0  # a waveform's length, an audio type's sample
TOKENS = 64  # a text's (a transcript's); an audio-language model's: its audio's tokens and 64
IMAGE_TEXT_TOKENS = 4096  # a vision-language model's text, its image's tokens among them


def price(kind: str, task: str = "causal-lm") -> dict:
    """The type priced from `SMALL` (a picture type: from its defaults, at `SIDE` where they
    size no image), or from `SMALL` without `LATENT` where that config's tensors do not fit
    together. A vision-language type's, on an image: of its config's size, or of the size its
    refusal or its note of training its text alone names."""
    if TASKS[task][2] == "image-text":  # (a dual encoder's text: a caption's tokens)
        tokens = IMAGE_TEXT_TOKENS if task == "image-text-to-text" else TOKENS
        r = _price(kind, task, {}, tokens=tokens)
        named = r.get("refused") or str(r.get("text_alone") or "")
        if side := re.search(r"give (?:a multiple of )?(\d+)|^(\d+)$|give (image_size)", named):
            r = _price(kind, task, {}, side=int(side[1] or side[2] or SIDE), tokens=tokens)
        return r
    r = _price(kind, task, SMALL if TASKS[task][2] == "text" else {})
    if "must match the size of tensor" in r.get("refused", ""):
        r = _price(kind, task, {k: v for k, v in SMALL.items() if k not in LATENT})
    if "give image_size" in r.get("refused", ""):
        r = _price(kind, task, {}, side=SIDE)
    if "give audio_seconds" in r.get("refused", ""):
        r = _price(kind, task, {}, seconds=SECONDS)
    if heard := re.search(r"a sample's audio takes (\d+)", r.get("refused", "")):
        r = _price(kind, task, {}, seconds=SECONDS, tokens=int(heard[1]) + TOKENS)
    return r


def _price(kind: str, task: str, small: dict, side: int | None = None,
           seconds: float | None = None, tokens: int = TOKENS) -> dict:
    import torch
    import transformers
    from transformers.models.auto import modeling_auto

    from converters import ConversionError, convert, from_hf_config
    from mdot_jax.errors import MdotError
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    mapping, named, reads = TASKS[task]
    cls = getattr(modeling_auto, mapping)[kind]
    cls = cls if isinstance(cls, str) else cls[0]  # (a type of several classes: the first)
    fields = dict(model_type=kind, **small, **(dict(architectures=[cls]) if named else {}))
    length = dict(seq_len=tokens) if reads in ("text", "image-text") or task in TRANSCRIBED \
        else {}
    r: dict = dict(type=kind, **(dict(image_size=side) if side else {}),
                   **(dict(audio_seconds=seconds) if seconds else {}),
                   **(dict(seq_len=tokens) if tokens != TOKENS else {}))
    try:
        seq = convert(from_hf_config(fields, image_size=side, audio_seconds=seconds, images=2,
                                     **length), batch_size=2, fuse=True, **length)
        p = predict(TrainingJob(model=seq, batch_size=2, device="h100-sxm", gpus=8,
                                strategy="fsdp", precision="amp-bf16", optimizer="adamw"))
        cfg = transformers.AutoConfig.for_model(kind, **small)
        with torch.device("meta"):
            head = seq.meta.get("head") or {}  # the class trained, where said (its text
            built = None if "text_alone" in head else head.get("head")  # alone: as its LM)
            model = (getattr(transformers, built or cls)._from_config(cfg) if built or named
                     else (transformers.AutoModelForSeq2SeqLM if cfg.is_encoder_decoder
                           else transformers.AutoModelForMaskedLM if task == "masked-lm"
                           else transformers.AutoModelForCausalLM).from_config(cfg))
        r.update(params=int(seq.params), model_params=sum(t.numel() for t in model.parameters()),
                 ms=round(p.iteration_ms, 3), mfu=round(p.mfu, 4))
        if "text_alone" in (seq.meta.get("head") or {}):  # what would train it on images too
            r["text_alone"] = seq.meta["head"]["text_alone"]
    except (ConversionError, MdotError) as e:
        r["refused"] = str(e)
    except Exception as e:  # a bug: reported, not raised, so the sweep goes on
        r["uncaught"] = f"{type(e).__name__}: {e}"
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--task", choices=sorted(TASKS), default="causal-lm")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import transformers
    from transformers.models.auto import modeling_auto

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "types.jsonl"
    done = {json.loads(line)["type"]: json.loads(line) for line in
            path.read_text().splitlines()} if path.exists() else {}
    kinds = sorted(getattr(modeling_auto, TASKS[args.task][0]))
    t0 = time.time()
    with open(path, "a") as out:
        for n, kind in enumerate(k for k in kinds if k not in done):
            done[kind] = price(kind, args.task)
            out.write(json.dumps(done[kind]) + "\n")
            out.flush()
            print(f"{n + 1} {kind}: {'priced' if 'ms' in done[kind] else 'refused'} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    rows = [done[k] for k in kinds]
    priced = [r for r in rows if "ms" in r]
    summary = dict(transformers=transformers.__version__, task=args.task, types=len(rows),
                   priced=len(priced),
                   refused=sum("refused" in r for r in rows),
                   uncaught=[r["type"] for r in rows if "uncaught" in r],
                   params_off_2pct=[r["type"] for r in priced
                                    if abs(r["params"] / r["model_params"] - 1) > 0.02])
    (args.out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
