"""A training job as one typed, validated request: what `predict(job)` prices, whether it
comes from Python, the command line or a service.

Every field is checked when the job is made (`TrainingJob.__post_init__`): a bad value or a
combination that would mean nothing is a `RequestError` naming the field, never ignored.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import onnx

from converters import OperatorSequence
from mdot_jax.errors import RequestError, fields_named
from mdot_jax.options import (
    ATTENTION,
    AUTOCAST,
    CHECKPOINTING,
    FRAMEWORKS,
    FROZEN_WEIGHTS,
    INTERCONNECTS,
    LAYOUTS,
    MAX_BATCH_TOKENS,
    MAX_TOKENS,
    OFFLOAD_OPTIMIZERS,
    OFFLOADS,
    PRECISIONS,
    SCHEDULES,
    SPEC_SHEET_OPTIMIZERS,
    STEPS,
    STRATEGIES,
)
from mdot_jax.serving import named_models
from mdot_jax.serving.fields import (
    boolean,
    choice,
    distinct,
    plain_fields,
    positive,
    positive_int,
    positive_ints,
    short,
    whole_count,
)

MODEL_TYPES = (str, Path, bytes, onnx.ModelProto, OperatorSequence)  # what `model` may be
_SHORT = reprlib.Repr()  # a value said back: a list of mappings as `[{...}, {...}]`
_SHORT.maxlevel = 1
# a field's values, by field (`mdot_jax.options`): checked where made, and the service's schema
CHOICES = {"precision": PRECISIONS, "frozen_weights": FROZEN_WEIGHTS,
           "optimizer": SPEC_SHEET_OPTIMIZERS, "layout": LAYOUTS, "step": STEPS,
           "strategy": STRATEGIES, "interconnect": INTERCONNECTS,
           "activation_checkpointing": CHECKPOINTING, "attention": ATTENTION,
           "framework": FRAMEWORKS, "offload": OFFLOADS, "schedule": SCHEDULES}
_TOKENS = (MAX_TOKENS, " tokens, the longest sequence priced (the conversion holds each "
                       "position)")


def too_many_tokens(batch: int | None, seq_len: int | None) -> str | None:
    """Why a micro-batch of `batch` sequences of `seq_len` tokens cannot be converted (more
    than `options.MAX_BATCH_TOKENS`), or None."""
    if batch and seq_len and batch * seq_len > MAX_BATCH_TOKENS:
        return (f"batch_size {batch:,} x seq_len {seq_len:,}: {batch * seq_len:,} tokens a "
                f"micro-batch, more than {MAX_BATCH_TOKENS:,} (the conversion holds each)")
    return None


@fields_named
@dataclass(frozen=True)
class TrainingJob:
    """One training job to predict.

    Attributes:
      model: an `.onnx` file, its bytes or ModelProto, an `.npz` or `OperatorSequence` from
        `convert` (at its own batch and input size), a Hugging Face model's `config.json` (or
        its folder; built on the meta device at `seq_len` tokens), or the name of one that
        ships with the package (`named_models`: `llama-3.1-8b`, `Qwen/Qwen3-8B`).
      batch_size: per device; a tuple gives one prediction each; None: dim 0 of
        `input_shapes`.
      device: a GPU of the catalog (`mdot devices`: priced from its spec sheet), or the
        device a checkpoint predicts for; None: the checkpoint's.
      device_spec: a JSON file describing a GPU the catalog lacks, or its object (a dict of
        the catalog's fields: `mdot devices --json NAME` writes one to start from, a list of
        one, read as its one).
      checkpoint: a shipped checkpoint's name or a folder; None: chosen from the device.
      precision: `options.PRECISIONS`; None: the device's usual (fp32 on CPUs and GPUs
        priced from their spec sheet, amp-fp16 on a GPU checkpoint).
      optimizer, layout: `mdot_jax.options`.
      step: the whole step or forward and backward alone (`options.STEPS`; GPUs priced from
        their spec sheets only).
      image_size, seq_len, input_shapes: the input's size (default: the model's own).
      video_frames: a vision-language config.json's sample a video of that many frames (of
        image_size a side) where its encoder takes one (Qwen-VL's grid over time); a video
        classifier's clip.
      audio_seconds: an audio model's config.json's sample (wav2vec 2.0's CTC or classifier):
        that many seconds of waveform.
      target_len: the targets per sample of an encoder-decoder's config.json (default:
        seq_len).
      lora_rank, lora_targets: a config.json's model fine-tuned with LoRA adapters of that rank
        on the linear layers `lora_targets` names (default: every one but the output head),
        every other parameter frozen (`converters.lora`); an ONNX export records the
        parameters its model froze itself.
      frozen_weights: how the frozen ones are held (`options.FROZEN_WEIGHTS`): in the half
        type (a base model loaded so) or QLoRA's 4-bit NormalFloat; default as the precision
        holds weights (fp32 under autocast).
      gpus: GPUs per node, `batch_size` each data-parallel replica; a tuple gives one
        prediction each.
      nodes: of `gpus` GPUs each.
      strategy: of the data parallelism, `options.STRATEGIES` (hsdp: FSDP over a node's
        replicas, replicated across nodes).
      tp, pp: tensor- and pipeline-parallel degrees (Megatron-LM's); the data-parallel
        replicas are gpus x nodes / (tp x pp).
      schedule: the pipeline's (`options.SCHEDULES`; default 1f1b).
      virtual_stages: chunks per stage of the interleaved schedule (default 2).
      sequence_parallel: the residual stream cut along the sequence over the tp GPUs.
      ep: expert-parallel degree of a mixture of experts: its experts split over ep of the
        data-parallel replicas, tokens exchanged all-to-all.
      cp: context-parallel degree (Megatron-LM's, ring attention): each sequence cut over cp
        GPUs, keys and values passed round them; the data-parallel replicas are gpus x nodes /
        (tp x pp x cp).
      grad_accum: micro-batches of `batch_size` an iteration runs before its one update (the
        pipeline's micro-batches).
      activation_checkpointing: `full` (every layer's forward run again in its backward) or
        `selective` (only the attention core's).
      attention: `flash` (PyTorch's fused scaled_dot_product_attention), `eager` (as the
        graph shows it) or `flash_attention_2` (the flash-attn package, transformers'
        `attn_implementation`: FlashAttention that takes a sliding window itself, its keys
        alone); None: flash where PyTorch runs it (half precision, compute capability 8.0 and
        later), a note says which.
      fused_optimizer: torch.optim's fused update kernel (`fused=True`; transformers'
        Trainer's default, `adamw_torch_fused`), not its default foreach kernels (GPUs priced
        from their spec sheets; `gpu.update`).
      clip_grad_norm: gradients clipped by their total norm before the update
        (`torch.nn.utils.clip_grad_norm_`, the Trainer's default: a pass over them; GPUs
        priced from their spec sheets).
      optimizer: muon is torch.optim.Muon over the hidden weight matrices, AdamW over the
        rest (`gpu.muon`; GPUs priced from their spec sheets, DDP only); adamw-8bit is
        bitsandbytes' AdamW8bit (transformers' `adamw_bnb_8bit`): two one-byte states a
        parameter, a kernel a parameter tensor (`gpu.update`; GPUs priced from their spec
        sheets).
      compile: the model compiled with `torch.compile` (TorchInductor, its default mode):
        memory-bound operators fused into generated kernels (`gpu.compiled`; eager PyTorch's
        framework, GPUs priced from their spec sheets).
      framework: whose kernels the step runs (`options.FRAMEWORKS`): `pytorch` (default;
        eager PyTorch, autocast at amp-*) or `megatron` (Megatron-LM at amp-fp16 / amp-bf16:
        the model in the half type, fp32 master weights, fused softmax and Adam; the
        data-parallel gradients all-reduced after the backward, in fp16 at amp-fp16).
      interconnect: between a node's GPUs (default: NVLink where every GPU reaches the
        others by it).
      network_gbs: between nodes, gigabytes/s a node per direction: its NICs' gigabits / 8
        (eight 400 Gb/s NICs: 400; default: the catalog's `network_gbs` of the GPU, its DGX's
        NICs, else `parallel.NETWORK_GBS`).
      offload: `optimizer` (DeepSpeed's ZeRO-Offload: Adam's state, the fp32 master weights and
        the update in the host's memory, on its CPUs) or `params` (ZeRO-3's parameter offload
        too); `gpu.offload`.
      host_gbs: the host's memory bandwidth a node, GB/s, the update's (default: the
        catalog's `host_gbs`, its DGX's CPUs).
      epochs, dataset_size: together, the whole job's time.
      train_tokens: or the time to train a token model on that many tokens.
      operators: also where the time goes (`Prediction.operators`).
    """

    model: Any
    batch_size: int | tuple[int, ...] | None = None
    device: str | None = None
    device_spec: str | Mapping | None = field(default=None, hash=False)
    checkpoint: str | None = None
    precision: str | None = None
    optimizer: str = "sgd"
    fused_optimizer: bool = False
    clip_grad_norm: bool = False
    layout: str = "nchw"
    step: str | None = None
    image_size: int | None = None
    video_frames: int | None = None
    audio_seconds: float | None = None
    seq_len: int | None = None
    target_len: int | None = None
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | None = None
    frozen_weights: str | None = None
    input_shapes: Mapping[str, Sequence[int]] | None = field(default=None, hash=False)
    gpus: int | tuple[int, ...] = 1
    nodes: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str | None = None
    virtual_stages: int | None = None
    sequence_parallel: bool = False
    ep: int = 1
    cp: int = 1
    grad_accum: int = 1
    activation_checkpointing: str | None = None
    attention: str | None = None
    compile: bool = False
    framework: str = "pytorch"
    strategy: str = "ddp"
    interconnect: str | None = None
    network_gbs: float | None = None
    offload: str | None = None
    host_gbs: float | None = None
    epochs: float | None = None
    dataset_size: int | None = None
    train_tokens: int | None = None
    operators: bool = False

    def __post_init__(self):
        plain_fields(self)  # every field but the model
        if self.model is None or (isinstance(self.model, (str, Path)) and not str(self.model)):
            raise RequestError("model: required (an .onnx file, or a converted sequence)",
                               "model")
        if not isinstance(self.model, MODEL_TYPES):
            module = callable(getattr(self.model, "parameters", None))  # torch.nn.Module's
            raise RequestError(
                f"model {short(self.model)}: expected a path (.onnx, .npz, config.json), ONNX "
                "bytes or ModelProto, or an OperatorSequence" + (
                    "; export a PyTorch module first: converters.from_torch(module, "
                    "example_input)" if module else ""), "model")
        object.__setattr__(self, "model", named_models.resolve(self.model))  # a name: its file
        shapes = self.input_shapes or {}
        if not isinstance(shapes, Mapping) or not all(isinstance(v, (list, tuple))
                                                      for v in shapes.values()):
            raise RequestError(f"input_shapes {shapes!r}: expected input names and their shapes "
                               "({'x': [8, 3, 224, 224]})", "input_shapes")
        for name, shape in shapes.items():
            positive_ints(f"input_shapes[{name!r}]", list(shape), MAX_TOKENS,
                  " (a dim the conversion holds position by position)")
        if self.batch_size is None and not self.input_shapes:
            raise RequestError("batch_size: required (the batch per device)", "batch_size")
        sizes = distinct("batch_size", self.batch_sizes)
        counts = distinct("gpus", self.gpu_counts)
        if len(sizes) > 1 and len(counts) > 1:
            raise RequestError("gpus: several GPU counts take one batch_size (per GPU)", "gpus")
        for name in ("image_size", "video_frames", "seq_len", "target_len"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), *_TOKENS if "_len" in name else ())
        if self.audio_seconds is not None:
            positive("audio_seconds", self.audio_seconds)
        if why := too_many_tokens(max(sizes), self.seq_len):
            raise RequestError(why, "batch_size")
        self._check_lora()
        positive_int("nodes", self.nodes)
        positive_int("grad_accum", self.grad_accum)
        self._check_model_parallel(counts)
        object.__setattr__(self, "device_spec", one_spec(self.device_spec))
        for name, kinds in (("device", (str, Path)), ("device_spec", (str, Path, Mapping)),
                            ("checkpoint", (str, Path))):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, kinds) or not str(value)):
                raise RequestError(f"{name} {_SHORT.repr(value)}: name one (or leave it "
                                   "out)", name)
        if self.device_spec is not None and self.device:
            raise RequestError("device_spec: describes the device itself; drop device",
                               "device_spec")
        for name in ("precision", "frozen_weights", "optimizer", "layout", "step", "strategy",
                     "interconnect", "activation_checkpointing", "attention", "framework"):
            choice(name, getattr(self, name), CHOICES[name])  # None: the default, given
        for name in ("fused_optimizer", "clip_grad_norm", "compile", "operators"):
            boolean(name, getattr(self, name))
        sharded = [(f, v) for f, v, plain in (("strategy", self.strategy, "ddp"),
                                              ("tp", self.tp, 1), ("pp", self.pp, 1),
                                              ("ep", self.ep, 1),
                                              ("framework", self.framework, "pytorch"))
                   if v != plain]
        if self.optimizer == "muon" and sharded:  # on the field a plan's search varies
            raise RequestError(f"{sharded[0][0]} {sharded[0][1]!r}: optimizer muon "
                               "(torch.optim.Muon) orthogonalises each whole weight matrix on "
                               "every GPU: priced with DDP under eager PyTorch (no tp, pp, ep, "
                               "FSDP or ZeRO)", sharded[0][0])
        if self.optimizer == "adamw-8bit" and (self.fused_optimizer
                                               or self.framework != "pytorch"):
            field = "fused_optimizer" if self.fused_optimizer else "framework"
            raise RequestError(f"{field}: optimizer adamw-8bit runs bitsandbytes' own kernels "
                               "under eager PyTorch (no fused_optimizer, no framework "
                               "megatron)", field)
        if self.strategy == "hsdp" and self.ep > 1:
            raise RequestError(f"ep {self.ep}: expert parallelism is priced with strategy ddp, "
                               "zero1, zero2 or fsdp, not hsdp", "ep")
        if self.compile and self.framework != "pytorch":
            raise RequestError(f"compile: torch.compile compiles a PyTorch model; framework "
                               f"{self.framework} runs its own fused kernels", "compile")
        if self.framework == "megatron" and self.precision not in AUTOCAST:
            raise RequestError(f"framework megatron: trains at amp-fp16, amp-bf16 (its --fp16 "
                               f"/ --bf16) or fp8 (--fp8-format), not precision "
                               f"{self.precision or 'fp32 (the default)'}", "framework")
        if self.interconnect and max(counts) == 1:
            raise RequestError("interconnect: the link between a node's GPUs; give gpus > 1",
                               "interconnect")
        if self.network_gbs is not None:
            positive("network_gbs", self.network_gbs)
            if self.nodes == 1:
                raise RequestError("network_gbs: the link between nodes; give nodes > 1",
                                   "network_gbs")
        self._check_offload()
        if self.strategy == "zero2" and self.pp > 1:  # DeepSpeed's pipeline engine asserts it
            raise RequestError(f"strategy 'zero2': DeepSpeed runs no ZeRO-2 under a pipeline "
                               f"(pp {self.pp}: it accumulates whole gradients over the "
                               "micro-batches); give zero1 or fsdp", "strategy")
        if self.strategy != "ddp" and max(counts) * self.nodes == self.tp * self.pp:
            raise RequestError(f"strategy {self.strategy!r}: shards over data-parallel "
                               "replicas; give more gpus (or nodes) than tp x pp", "strategy")
        if (self.epochs is None) != (self.dataset_size is None):
            raise RequestError("epochs and dataset_size go together", "epochs")
        if self.epochs is not None:
            positive("epochs", self.epochs)
            object.__setattr__(self, "dataset_size", whole_count("dataset_size", self.dataset_size))
        if self.train_tokens is not None:
            object.__setattr__(self, "train_tokens", whole_count("train_tokens", self.train_tokens))
            if self.epochs is not None:
                raise RequestError("train_tokens: the job is epochs x dataset_size or a number "
                                   "of tokens, not both", "train_tokens")

    def _check_offload(self) -> None:
        choice("offload", self.offload, CHOICES["offload"])
        if self.host_gbs is not None:
            positive("host_gbs", self.host_gbs)
            if not self.offload:
                raise RequestError("host_gbs: the host's memory, where an offloaded optimizer "
                                   "updates; give offload", "host_gbs")
        if not self.offload:
            return
        if self.optimizer not in OFFLOAD_OPTIMIZERS:
            raise RequestError(f"offload: priced for DeepSpeed's CPU Adam; give optimizer "
                               f"{' or '.join(OFFLOAD_OPTIMIZERS)} (this is {self.optimizer})",
                               "offload")
        for name, plain in (("tp", (1,)), ("pp", (1,)), ("ep", (1,)), ("framework", ("pytorch",)),
                            ("step", (None, "train")), ("fused_optimizer", (False,))):
            if getattr(self, name) not in plain:
                raise RequestError(f"{name}: offload is priced under DeepSpeed's ZeRO over data "
                                   f"parallelism alone (no {name})", name)

    def _check_lora(self) -> None:
        if self.lora_rank is not None:
            positive_int("lora_rank", self.lora_rank)
        if self.lora_targets is None:
            return
        if self.lora_rank is None:
            raise RequestError("lora_targets: the layers LoRA adapts; give lora_rank",
                               "lora_targets")
        targets = self.lora_targets
        if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets \
                or not all(isinstance(t, str) and t.strip() for t in targets):
            raise RequestError(f"lora_targets {targets!r}: expected layer names (e.g. "
                               "['q_proj', 'v_proj'])", "lora_targets")
        object.__setattr__(self, "lora_targets", tuple(t.strip() for t in targets))

    def _check_model_parallel(self, counts: tuple[int, ...]) -> None:
        positive_int("tp", self.tp)
        positive_int("pp", self.pp)
        choice("schedule", self.schedule, CHOICES["schedule"])
        boolean("sequence_parallel", self.sequence_parallel)
        if self.schedule and self.pp == 1:
            raise RequestError("schedule: the pipeline's; give pp > 1", "schedule")
        if self.virtual_stages is not None:
            positive_int("virtual_stages", self.virtual_stages)
            if self.schedule != "interleaved":
                raise RequestError("virtual_stages: chunks of the interleaved schedule; give "
                                   "schedule 'interleaved'", "virtual_stages")
        if self.sequence_parallel and self.tp == 1:
            raise RequestError("sequence_parallel: cuts the sequence over the tensor-parallel "
                               "GPUs; give tp > 1", "sequence_parallel")
        positive_int("ep", self.ep)
        positive_int("cp", self.cp)
        if self.cp > 1 and self.ep > 1:
            raise RequestError("cp: with ep (a mixture of experts' expert parallelism) is not "
                               "priced; give one of them", "cp")
        split = self.tp * self.pp * self.cp
        for n in counts:
            if n * self.nodes % split:
                name = "cp" if self.cp > 1 else "tp" if self.tp > 1 else "pp"
                raise RequestError(f"{name} {getattr(self, name)}: {self.split} does not divide "
                                   f"the {n * self.nodes} GPUs (gpus {n} x nodes {self.nodes})",
                                   name)
            if n * self.nodes // (self.tp * self.pp) % self.ep:
                raise RequestError(f"ep {self.ep}: does not divide the "
                                   f"{n * self.nodes // (self.tp * self.pp)} data-parallel "
                                   "replicas (gpus x nodes / (tp x pp)) the experts are "
                                   "split over", "ep")

    @property
    def split(self) -> str:
        """The GPUs a replica spans, as errors say it: `tp x pp (T x P)`, with cp where given."""
        if self.cp > 1:
            return f"tp x pp x cp ({self.tp} x {self.pp} x {self.cp})"
        return f"tp x pp ({self.tp} x {self.pp})"

    @property
    def stages_per_gpu(self) -> int:
        """The interleaved schedule's chunks per stage (1 for the others)."""
        return (self.virtual_stages or 2) if self.schedule == "interleaved" else 1

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Per device; without `batch_size`, dim 0 of the first of `input_shapes`."""
        if self.batch_size is None:
            first = next(iter(dict(self.input_shapes or {}).values()))
            return positive_ints("batch_size", first[0])
        return positive_ints("batch_size", self.batch_size)

    @property
    def gpu_counts(self) -> tuple[int, ...]:
        return positive_ints("gpus", self.gpus)

    @property
    def several(self) -> bool:
        """Whether `predict` answers with a list (several batch sizes or GPU counts asked)."""
        return isinstance(self.batch_size, (list, tuple)) or isinstance(self.gpus, (list, tuple))

    @property
    def data_parallel(self) -> bool:
        return max(self.gpu_counts) * self.nodes > 1

    @property
    def model_parallel(self) -> bool:
        return self.tp * self.pp > 1


FIELDS = frozenset(f.name for f in fields(TrainingJob))  # what a request may name


# the converter's words for a model's sizes (the CLI's flags) -> the request's fields
_FLAGS = {"--input-shape": "input_shapes", "--batch-size": "batch_size",
          "--image-size": "image_size", "--video-frames": "video_frames", "--seq-len": "seq_len",
          "--audio-seconds": "audio_seconds",
          "--target-len": "target_len",
          "--lora-rank": "lora_rank", "--lora-targets": "lora_targets"}


def one_spec(spec: Any) -> Any:
    """A `device_spec` as given, but `mdot devices --json NAME`'s list of one GPU read as its
    one (as its file is)."""
    one = isinstance(spec, (list, tuple)) and len(spec) == 1 and isinstance(spec[0], Mapping)
    return spec[0] if one else spec


def in_fields(text: str) -> tuple[str, str]:
    """A converter's error in the request's field names, and the first field it names."""
    for flag, name in _FLAGS.items():
        text = text.replace(flag, name)
    named = sorted((text.find(n), n) for n in _FLAGS.values() if n in text)
    return text, named[0][1] if named else ""
