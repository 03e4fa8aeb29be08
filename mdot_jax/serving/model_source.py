"""The model a job names, as the operator sequence a predictor prices: an ONNX file converted
at the job's sizes (kept while the file is unchanged, on disk too for a service), a converted
`.npz` or sequence checked against them, or a Hugging Face config.json exported on the meta
device in a process of its own; a context-parallel job's model at its GPU's share of each
sequence."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np
import onnx

from converters import ConversionError, OperatorSequence, convert, converts_the_same
from converters.dims import head_of
from converters.errors import PastPositions
from converters.hf_fields import check_names
from converters.hf_heads import holds_images, input_kind, needs_tokens
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from mdot_jax import writers
from mdot_jax.errors import MdotError, RequestError
from mdot_jax.gpu import compiled
from mdot_jax.options import FLASH_ATTN
from mdot_jax.serving import exports, named_models
from mdot_jax.serving.model_facts import check_converted, input_size_of
from mdot_jax.serving.request import TrainingJob, in_fields

P = ParamSpec("P")
R = TypeVar("R")


class ModelError(MdotError, ConversionError):
    """The model a job names cannot be read or priced as asked (no such file, an input past
    its positions): the converters' `ConversionError`, raised by `predict` and `plan` as an
    `MdotError` too, so that one `except MdotError` holds every failure of a request; said in
    the request's words (`image_size`, not the converters' `--image-size`), `field` the first
    of its fields it names, if any."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


def model_errors(f: Callable[P, R]) -> Callable[P, R]:
    """`f` raising the converters' errors as `ModelError`s, a named model's config.json said
    by its name (`named_models.said`: the package's folders are not the user's)."""
    @functools.wraps(f)
    def said(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return f(*args, **kwargs)
        except MdotError as e:
            e.args = (named_models.said(str(e)), *e.args[1:])
            raise
        except ConversionError as e:
            raise ModelError(*in_fields(named_models.said(str(e)))) from None
    return said


def config_said(seq: OperatorSequence) -> list[str]:
    """What a config.json decided beyond the model's shape, a line each: the classifier its
    architectures named, and what transformers' defaults filled in where it is short of the
    shape."""
    said = []
    head = seq.meta.get("head")
    if head and head.get("instead"):  # a class its architectures name, not priced from a config
        said.append(f"its architectures name {head['instead']}, which is not priced from a "
                    f"config: trained as {head['head']}, its language model")
    elif head and "text_alone" in head:  # a vision-language model that is a causal LM too
        sizes = head["text_alone"]  # None: its images' size is not the config's to say
        said.append(f"trained as {head['head']} on its text alone" + (
            f"; an image_size ({sizes}) trains it on an image a sample too" if sizes else "") + (
            f"; audio_seconds trains {head['recogniser']} on audio a sample"
            if head.get("recogniser") else ""))
    elif head and head.get("cross"):  # its text reads the tiles by cross-attention
        said.append(f"trained as {head['head']} on one image a sample, {head['tiles']} tiles "
                    f"of {head['tile']} x {head['tile']} (its processor pads every image to "
                    "them), which its cross-attention layers read, the image's token first, "
                    "and every token's loss")
    elif head and head.get("pairs"):  # a dual encoder's (CLIP's)
        said.append(f"trained as {head['head']} on image-text pairs, {head['pixels'][0]} x "
                    f"{head['pixels'][1]} pixels and the tokens asked, its loss contrasting "
                    "each pair with the batch's others")
    elif head and head.get("audio_tokens"):  # an audio-language model's
        chunks = f"{head['chunks']} chunks" if head["chunks"] > 1 else "a chunk"
        said.append(f"trained as {head['head']} on {head['seconds']:g} s of audio a sample "
                    f"({chunks} of {' x '.join(map(str, head['audio']))} features: its "
                    f"processor pads it to whole chunks), its features the first "
                    f"{head['audio_tokens']:,} of the tokens, and every token's loss")
    elif head and head.get("image"):  # a vision-language model (`converters.vision_language`)
        size = " x ".join(map(str, head["image"]))
        sample = f"video of {head['frames']} frames of {size}" if head.get("frames") else \
            f"{size} image"
        tiles = f" ({head['tiles']} tiles of {head['tile']} x {head['tile']}: its grid and " \
            "the whole resized)" if head.get("tiles") else ""
        said.append(f"trained as {head['head']} on one {sample} a sample{tiles}, its features "
                    f"the first {head['image_tokens']:,} of the tokens, and every token's loss" + (
                        "; its encoder's attention as transformers' SDPA path runs it, a kernel "
                        "an image or window (attention flash_attention_2: one varlen call a layer)"
                        if head.get("looped") else ""))
    elif head and "head" in head:
        labels = f", {head['labels']} labels" if head["labels"] else ""
        if pixels := head.get("pixels"):  # an image classifier's (the config's, or asked)
            labels += f", at {pixels[0]} x {pixels[1]} pixels" + (
                f", {head['frames']} frames a clip" if head.get("frames") else "")
        if n := head.get("choices"):  # a multiple-choice model's
            labels += (f", {n} choices a sample, each its own sequence of the tokens asked "
                       "(num_choices in the config gives another count)")
        if objects := head.get("objects"):  # a detector's (DETR's)
            labels += (f", {objects} {'masks' if head.get('masks') else 'boxes'} an image, "
                       "matched to its queries (the matching, scipy's on the CPU, not priced)")
        if ratio := head.get("masked"):  # self-supervised: MAE's, VideoMAE's
            unit, whose = ("tubes", "the VideoMAE paper's: the config gives none") if \
                head.get("frames") else ("patches", "its mask_ratio")
            labels += (f", its encoder on the {unit} its random mask leaves ({ratio:g} masked, "
                       f"{whose}), its decoder on all")
        elif "masked" in head:  # SimMIM's
            labels += (", its masked patches replaced by its mask token (which are masked "
                       "changes no work), their pixels reconstructed")
        if audio := head.get("audio"):  # a waveform's samples, or the features its config fixes
            form = f"{audio[0]:,} samples" if len(audio) == 1 else \
                f"{audio[0]:,} frames of {audio[1]} features"  # a waveform's, or features'
            labels += f", on {head['seconds']:g} s of audio a sample ({form})" \
                if head.get("seconds") else f", on {' x '.join(map(str, audio))} audio " \
                "features a sample"
            if head.get("spec_augment"):
                labels += " (SpecAugment's masking, an elementwise pass, not priced)"

        said.append(f"trained as {head['head']}{labels}, transcribed into its tokens: every "
                    "token's loss" if head.get("transcribed") else  # a speech recogniser
                    f"trained as {head['head']} (the config's architectures){labels}: its "
                    "head and loss, not a language model's")
    if past := (head or {}).get("positions"):
        field, most, tokens = past[:3]
        said.append(f"{tokens:,} tokens a sample are past its {field} ({most:,}), the positions "
                    "it was trained for (rotary or relative ones extend): priced as asked")
    for field, p in ((head or {}).get("layerdrop") or {}).items():  # a draw a layer a step
        said.append(f"{field} {p:g}: every layer priced, none skipped (training skips "
                    f"{p:.0%} of them a step on average)")
    if every := (moe := seq.meta.get("experts") or {}).get("every"):
        said.append(f"transformers' own {every} runs every expert on every token "
                    f"({moe['experts'] // moe['top_k']}x the routed experts' work); priced as "
                    "routed training code runs it (Megatron-LM's, torchtitan's)")
    if defaulted := seq.meta.get("defaulted"):
        values = (f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"  # Swin's heads: a list
                  for k, v in defaulted.items())
        said.append("the config gives no " + ", ".join(defaulted) + ": transformers' defaults "
                    "built the model (" + ", ".join(values) + ")")
    return said


def cut(job: TrainingJob) -> TrainingJob:
    """The job whose model one GPU of a context-parallel group runs: its sequences cp times
    shorter (the load-balanced ring cuts each into 2 cp pieces, two a GPU); a sequence
    converted so (by a plan) as it is."""
    if job.cp == 1 or (isinstance(job.model, OperatorSequence) and job.seq_len and
                       input_size_of(job.model) * job.cp == job.seq_len):  # cut already
        return job
    if job.seq_len is None or isinstance(job.model, OperatorSequence) or \
            str(job.model).endswith(".npz"):
        raise RequestError("cp: give seq_len, with the model as ONNX or a config.json (it is "
                           "converted at seq_len / cp tokens)", "cp")
    if job.seq_len % (2 * job.cp):
        raise RequestError(f"cp {job.cp}: seq_len {job.seq_len} is not a multiple of 2 x cp "
                           "(the load-balanced ring cuts each sequence into 2 x cp pieces)",
                           "cp")
    return dataclasses.replace(job, seq_len=job.seq_len // job.cp)


def sequence(job: TrainingJob, b: int, fuse: int, loss: bool = False) -> OperatorSequence:
    """The job's model at batch `b`: converted from ONNX, or a converted sequence as it is
    (`.npz` or in memory), whose batch, input size and fusion must be the job's (or of
    a fusion version that converts it the same). An input past the model's positions is
    said by the field that made it that long. `loss`: an ONNX model's logits given their loss
    where it has none (`converters.load_model`)."""
    try:
        return _sequence(job, b, fuse, loss)
    except PastPositions as e:
        field = "seq_len" if job.seq_len else "input_shapes" if job.input_shapes else ""
        if not field:
            raise
        held = e.rows - (e.top + 1 - job.seq_len) if job.seq_len else 0  # less an offset
        raise RequestError(f"{field} {getattr(job, field)}: past the "
                           f"{held if 0 < held <= e.rows else e.rows:,} positions "
                           f"model '{e.label}' has (a table of them, read by node '{e.node}')",
                           field) from None


def _sequence(job: TrainingJob, b: int, fuse: int, loss: bool) -> OperatorSequence:
    model: Any = job.model
    config = is_config(model)  # its graph is named by its file
    if isinstance(model, (str, Path)) and str(model).endswith(".npz"):
        model = OperatorSequence.load_npz(model)
    check_lora(model, job.lora_rank, job.lora_targets)
    if config:
        try:
            model, size = config_graph_at(job.model, b, job.seq_len, job.target_len,
                                          job.lora_rank, job.lora_targets, job.image_size,
                                          job.video_frames, job.audio_seconds)
        except ConversionError as e:  # a piece of a sample: its image, not its tokens, errs
            if job.cp > 1 and re.search("a sample's (image|audio) takes", str(e)):
                raise _image_cut(job) from None
            raise
        if job.cp > 1 and (read := set(head_of(model)) & {"image", "audio_tokens", "pixels",
                                                           "audio"}):
            raise _image_cut(job, placed=bool(read & {"image", "audio_tokens"}))
        asked = (job.seq_len, job.target_len, job.lora_rank, job.lora_targets, job.image_size,
                 job.video_frames, job.audio_seconds)
        job = dataclasses.replace(job, image_size=size)
    if job.target_len is not None and not config:
        raise RequestError("target_len: an encoder-decoder's config.json takes it (an ONNX "
                           "file's targets are an input: give its shape)", "target_len")
    if job.video_frames and not config:
        raise RequestError("video_frames: a vision-language model's config.json takes it (an "
                           "ONNX file's frames are its input's: give its shape)", "video_frames")
    if job.audio_seconds and not config:
        raise RequestError("audio_seconds: an audio model's config.json takes it (an ONNX "
                           "file's audio is its input's: give its shape)", "audio_seconds")
    shapes = tuple((k, tuple(v)) for k, v in (job.input_shapes or {}).items())
    if isinstance(model, (str, Path)) and Path(model).is_file():  # converted once, kept
        stat = Path(model).stat()
        return run_as(_converted(str(model), (stat.st_mtime_ns, stat.st_size), b,
                                 job.image_size, job.seq_len, shapes, fuse, loss), job)
    if config:  # converted once at each batch while the file is unchanged
        stat = config_file(job.model).stat()
        return run_as(_config_converted(str(job.model), (stat.st_mtime_ns, stat.st_size), b,
                                        asked, shapes, fuse), job)
    if not isinstance(model, OperatorSequence):
        return run_as(convert(model, batch_size=b, image_size=job.image_size,
                              seq_len=job.seq_len, input_shapes={k: list(v) for k, v in shapes},
                              fuse=fuse, loss=loss), job)
    check_converted(model, b, job.image_size, job.seq_len, job.cp)
    if model.fusion != fuse:
        if not converts_the_same(model, fuse):
            raise RequestError(f"model: the operator sequence {model.name!r} was converted "
                               f"with fusion version {model.fusion}, this predictor reads "
                               f"{fuse} (`mdot convert --fuse {fuse}`)", "model")
        model = dataclasses.replace(model, meta={**model.meta, "fusion_version": fuse})
    return run_as(model, job)


def check_lora(model: Any, lora_rank: int | None, lora_targets: tuple[str, ...] | None
               ) -> None:
    """LoRA's rules beyond each field's own: targets need a rank, and adapters are added to a
    config.json's model (an ONNX export records the parameters its model froze; a sequence
    converted with adapters keeps them)."""
    if lora_targets is not None and lora_rank is None:
        raise RequestError("lora_targets: the layers LoRA adapts; give lora_rank",
                           "lora_targets")
    if lora_rank is not None and not is_config(model) and not (
            isinstance(model, OperatorSequence) and "frozen" in model.meta):
        raise RequestError("lora_rank: adapters are added to a config.json's model; an ONNX "
                           "export records the parameters its model froze (export the LoRA "
                           "model itself, e.g. peft's, with converters.from_torch)", "lora_rank")


_ELEM = CONFIG_FIELDS.index("elem_bytes")
_READ, _WRITTEN, _INTENSITY = (LOAD_FIELDS.index(f) for f in
                               ("bytes_read", "bytes_written", "intensity"))


def at_fp32_width(seq: OperatorSequence) -> OperatorSequence:
    """`seq` as its fp32 export reads, the width everything priced from a sequence assumes
    (memory scales it by the precision; a checkpoint learned from fp32 exports): a model
    exported in a half type (`meta["half_type"]`, kept: the precision it trains at by
    default) has the bytes of its operators of 2-byte elements doubled, their intensity
    halved. Kept while `seq` is, so that what is computed of it is too."""
    def widened() -> OperatorSequence:
        config, load = seq.config.copy(), seq.load.copy()
        half = config[:, _ELEM] == 2  # [N]
        config[half, _ELEM] = 4
        load[np.ix_(half, [_READ, _WRITTEN])] *= 2
        load[half, _INTENSITY] /= 2
        return dataclasses.replace(seq, config=config, load=load)
    return KEPT.get(("fp32 width", seq), widened) if seq.meta.get("half_type") else seq


def run_as(seq: OperatorSequence, job: TrainingJob) -> OperatorSequence:
    """`seq` as `job` runs it, in its metadata (a copy: a converted sequence is kept and
    shared), at fp32 width (`at_fp32_width`): its frozen parameters held as `frozen_weights`
    says, compiled if `compile`."""
    if job.attention == FLASH_ATTN and (name := seq.meta.get("no_flash_attn")):
        raise RequestError(f"attention {FLASH_ATTN}: transformers refuses it for {name} (its "
                           "class does not support Flash Attention 2): give flash (PyTorch's "
                           "SDPA) or eager", "attention")
    seq = at_fp32_width(seq)
    how: dict = {}
    if job.frozen_weights is not None and seq.meta.get("frozen_weights") != job.frozen_weights:
        if "frozen" not in seq.meta:
            raise RequestError(f"frozen_weights {job.frozen_weights}: the model has no frozen "
                               "parameters (give lora_rank, or export a model that froze "
                               "some)", "frozen_weights")
        how["frozen_weights"] = job.frozen_weights
    if job.compile != bool(seq.meta.get(compiled.KEY)):
        how[compiled.KEY] = job.compile
    if not how:
        return seq
    copies = KEPT.get(("run_as", seq), dict)  # one copy a way of running it, while it is kept:
    key = tuple(sorted(how.items()))  # what is computed of a sequence is kept by its identity
    if key not in copies:
        copies[key] = dataclasses.replace(seq, meta=dict(seq.meta, **how))
    return copies[key]


SEQUENCE_CACHE: dict = {}  # folder, limit: converted sequences also kept on disk there


def keep_sequences(folder: str | Path, limit: int = 256) -> None:
    """Also keep converted sequences as `.npz` files in `folder`, at most `limit` (the least
    recently used go first): a restarted service does not convert its models again."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    SEQUENCE_CACHE.update(folder=Path(folder), limit=limit)


@functools.lru_cache(maxsize=32)
def _converted(path: str, stamp: tuple, b: int, image_size: int | None, seq_len: int | None,
               shapes: tuple, fuse: int, loss: bool) -> OperatorSequence:
    """An ONNX file converted at these sizes, kept while the file is unchanged (`stamp`: its
    modification time and size): a service or a plan prices one model many times."""
    folder = SEQUENCE_CACHE.get("folder")
    key = hashlib.sha256(repr((path, stamp, b, image_size, seq_len, shapes, fuse, loss)
                              ).encode())
    kept = folder / f"{key.hexdigest()[:32]}.npz" if folder else None
    if kept is not None and kept.exists():
        os.utime(kept)
        return OperatorSequence.load_npz(kept)
    seq = convert(path, batch_size=b, image_size=image_size, seq_len=seq_len,
                  input_shapes={k: list(v) for k, v in shapes}, fuse=fuse, loss=loss)
    if folder is not None and kept is not None:
        seq.save(kept)  # a temporary name, then a rename: safe beside other writers
        writers.evict(folder, ".npz", SEQUENCE_CACHE["limit"])
    return seq




@functools.lru_cache(maxsize=8)
def _config_converted(path: str, stamp: tuple, b: int, asked: tuple, shapes: tuple, fuse: int
                      ) -> OperatorSequence:
    """A config.json's model converted at batch `b` for the job's fields that shape it
    (`asked`: seq_len, target_len, lora_rank, lora_targets, image_size, video_frames,
    audio_seconds), kept while the file is unchanged (`stamp`): what would fit prices one
    model at many settings, a plan at many GPUs."""
    model, size = config_graph_at(path, b, *asked)  # exported once (`_from_config`)
    return convert(model, batch_size=b, image_size=size, seq_len=asked[0],
                   input_shapes={k: list(v) for k, v in shapes}, fuse=fuse,
                   name=config_name(path), label=path)


def config_file(path: str | Path) -> Path:
    """A config.json given as the file or as the folder holding it."""
    return Path(path) if str(path).endswith(".json") else Path(path) / "config.json"


def config_name(path: str | Path) -> str:
    """What a config.json's model is called: its folder's name for a file named config.json
    (`llama-70b/config.json`: llama-70b), else the file's."""
    file = config_file(path)
    return file.parent.resolve().name if file.name == "config.json" else file.stem


def is_config(model: Any) -> bool:
    """Whether `model` names a Hugging Face config.json (the file, or a folder holding one)."""
    return isinstance(model, (str, Path)) and (
        str(model).endswith(".json") or (Path(model) / "config.json").is_file())


def config_graph(path: str | Path, seq_len: int | None, target_len: int | None = None,
                 lora_rank: int | None = None, lora_targets: tuple[str, ...] | None = None,
                 images: int = 1, image_size: int | None = None,
                 video_frames: int | None = None, audio_seconds: float | None = None
                 ) -> onnx.ModelProto:
    """The training graph of the model a config.json describes, at `seq_len` tokens (an
    encoder-decoder's targets: `target_len`, default as many; an image classifier's: none,
    its config's image), with LoRA adapters of `lora_rank` on `lora_targets` where given
    (`converters.lora`); a vision-language model's images of `image_size` pixels a side (a
    video of `video_frames` frames), a grid encoder's graph holding `images` of them
    (`fixed_images`); an audio model's `audio_seconds` of audio a sample."""
    file = config_file(path)
    if seq_len is None and needs_tokens(_fields(file)):
        raise RequestError("seq_len: required with a Hugging Face config (the tokens per "
                           "sample to export the model at)", "seq_len")
    stat = file.stat() if file.is_file() else None  # the child says what is wrong with it
    return _from_config(str(path), stat and (stat.st_mtime_ns, stat.st_size), seq_len or 0,
                        target_len, lora_rank, lora_targets, images, image_size, video_frames,
                        audio_seconds)


def config_graph_at(path: str | Path, b: int, seq_len: int | None,
                    target_len: int | None = None, lora_rank: int | None = None,
                    lora_targets: tuple[str, ...] | None = None,
                    image_size: int | None = None, video_frames: int | None = None,
                    audio_seconds: float | None = None) -> tuple[onnx.ModelProto, int | None]:
    """`config_graph` at batch `b`, and the image size left to convert at: None where the
    graph holds its images (a detector's, a grid encoder's: exported at the batch at once,
    `holds_images`; another's that says so, again at `b`) or reads them by cross-attention
    (tiles: no rank-4 input to size)."""
    def graph(images: int) -> onnx.ModelProto:
        return config_graph(path, seq_len, target_len, lora_rank, lora_targets, images=images,
                            image_size=image_size, video_frames=video_frames,
                            audio_seconds=audio_seconds)

    model = graph(b if holds_images(_fields(config_file(path))) else 1)  # once, at b
    if images := fixed_images(model):  # its image's size is in the graph already
        return (model if images == b else graph(b)), None
    head = head_of(model)  # a classifier's pictures sized in the graph, as a cross-attended
    return model, None if head.get("cross") or head.get("pixels") else image_size  # image's


def fixed_images(graph: onnx.ModelProto) -> int | None:
    """The images a vision-language model's graph holds where its encoder fixes them (a grid
    encoder's, Qwen-VL's: it converts at that batch alone), else None."""
    return head_of(graph).get("images")


def _image_cut(job: TrainingJob, placed: bool = True) -> RequestError:
    """Context parallelism refused a model that reads images or audio: their features `placed`
    among its tokens (a vision- or audio-language model's), or read apart (a CLIP's pixels, a
    CTC's or Whisper's audio)."""
    return RequestError(f"cp {job.cp}: " + (
        "an image's or audio's features lie in its sequences" if placed else
        "the model trains on images or audio, which no ring cuts") +
        "; context parallelism is priced for language models alone", "cp")


def config_input(path: str | Path) -> str:
    """The kind of input a config.json's model trains on, without exporting it: an image
    or video classifier's images, an audio model's audio, else tokens."""
    return input_kind(_fields(config_file(path)))


def _fields(file: Path) -> dict:
    """A config.json's fields; none where they cannot be read (the export says why)."""
    try:
        fields = json.loads(file.read_text())
        check_names(fields, str(file))
    except (OSError, ValueError, TypeError, ConversionError):
        return {}
    return fields


@functools.lru_cache(maxsize=2)
def _from_config(path: str, stamp: tuple | None, seq_len: int, target_len: int | None,
                 lora_rank: int | None = None, lora_targets: tuple[str, ...] | None = None,
                 images: int = 1, image_size: int | None = None,
                 video_frames: int | None = None, audio_seconds: float | None = None
                 ) -> onnx.ModelProto:
    """A Hugging Face language model's training graph from its config.json alone, on the meta
    device (`converters.from_hf_config`), in a process of its own (PyTorch stays out of this
    one's memory; `os._exit` skips its teardown, which would take 0.1 GB more), once for every
    batch size asked while the file is unchanged (`stamp`: its modification time and size)."""
    asked = [str(seq_len), str(target_len or 0), str(lora_rank or 0), ",".join(lora_targets or ()),
             str(images), str(image_size or 0), str(video_frames or 0), str(audio_seconds or 0)]
    if (kept := exports.load(config_file(path), asked)) is not None:
        return kept  # exported by an earlier command
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.onnx"
        code, stderr = _export_child([path, asked[0], str(out), *asked[1:]])
        if code:  # 2: a ConversionError's line; else the export died
            lines = stderr.strip().splitlines() or [f"exit status {code}"]
            raise ConversionError(lines[-1] if code == 2 else
                                  f"{path}: the export failed: {lines[-1]}")
        exports.keep(config_file(path), asked, out)
        return onnx.load(out)


def _export_child(argv: list[str]) -> tuple[int, str]:
    """`converters.hf_config._main(argv)` in a child process: its exit status and stderr;
    on a terminal, a line says it runs and for how long (a large model's takes minutes)."""
    from tqdm import tqdm

    with subprocess.Popen([sys.executable, "-c", "import os, sys; from converters.hf_config "
                           "import _main; os._exit(_main(sys.argv[1:]))", *argv],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as child, \
            tqdm(desc=f"exporting {Path(argv[0]).name} on the meta device", leave=False,
                 bar_format="{desc}: {elapsed}", disable=not sys.stderr.isatty()) as shown:
        while True:
            try:
                stderr = child.communicate(timeout=0.5)[1]
                return child.returncode, stderr
            except subprocess.TimeoutExpired:  # still exporting (its stderr read meanwhile)
                shown.refresh()
