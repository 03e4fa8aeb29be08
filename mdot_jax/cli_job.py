"""The flags of a training job that `mdot predict` and `mdot plan` share, and the
`TrainingJob` fields they give (`job_fields`); the library checks every field."""

from __future__ import annotations

import argparse
import math

from mdot_jax.cli_args import POSITIVE_FLOAT, POSITIVE_INT, _int_list, tokens
from mdot_jax.errors import UsageError
from mdot_jax.options import (
    ATTENTION,
    CHECKPOINTING,
    FRAMEWORKS,
    FROZEN_WEIGHTS,
    INTERCONNECTS,
    LAYOUTS,
    MAX_TOKENS,
    OFFLOADS,
    PRECISIONS,
    SCHEDULES,
    SPEC_SHEET_OPTIMIZERS,
    STEPS,
    STRATEGIES,
)


def input_shapes(specs: list[str] | None) -> dict[str, list[int]]:
    """Parses repeated `NAME=D1,D2,...` into {name: [dims]}."""
    shapes = {}
    for spec in specs or []:
        name, sep, dims = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise UsageError(f"--input-shape {spec!r}: expected NAME=D1,D2,... "
                             "(e.g. x=1,3,224,224)") from None
        if max(shapes[name], default=0) > MAX_TOKENS:
            raise UsageError(f"--input-shape {spec!r}: a dim of {max(shapes[name]):,}: at most "
                             f"{MAX_TOKENS:,} (the conversion holds each position)")
    return shapes



def lora_targets(text: str | None) -> tuple[str, ...] | None:
    """`--lora-targets`: comma-separated layer names."""
    if text is None:
        return None
    names = tuple(t.strip() for t in text.split(","))
    if not all(names):
        raise UsageError(f"--lora-targets {text!r}: expected layer names, comma-separated "
                         "(e.g. q_proj,v_proj)")
    return names


def count(text: str) -> int:
    """A positive whole count, also written as a float (`2e12`)."""
    try:
        value = int(text)  # exactly, however long
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            f = 0.0
        value = int(f) if math.isfinite(f) and f.is_integer() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def add_shape_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags that size the model's inputs (and adapt it), a group of `--help` of their
    own."""
    p = parser.add_argument_group("the model and its inputs")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="concrete shape of a data input (repeatable)")
    p.add_argument("--batch-size", type=POSITIVE_INT, help="dim 0 of every data input")
    p.add_argument("--image-size", type=POSITIVE_INT, help="spatial size of rank-4 image inputs")
    p.add_argument("--video-frames", type=POSITIVE_INT, metavar="F",
                   help="a vision-language config.json's sample: a video of F frames of "
                        "--image-size (an encoder over time: Qwen2/2.5/3-VL, GLM-4V)")
    p.add_argument("--audio-seconds", type=POSITIVE_FLOAT, metavar="S",
                   help="an audio model's config.json's sample: S seconds of waveform "
                        "(wav2vec 2.0's, HuBERT's, WavLM's CTC or classifier)")
    p.add_argument("--seq-len", type=tokens, help="dim 1 of rank-2 token-id inputs")
    p.add_argument("--target-len", type=tokens,
                   help="an encoder-decoder's config.json: targets per sample (default: seq-len)")
    p.add_argument("--lora-rank", type=POSITIVE_INT, metavar="R",
                   help="a config.json's model fine-tuned with LoRA adapters of rank R, the rest "
                        "frozen (an ONNX export records its own frozen parameters)")
    p.add_argument("--lora-targets", metavar="NAME[,NAME...]",
                   help="with --lora-rank: the linear layers adapted, by name (e.g. q_proj,v_proj; "
                        "default all-linear: every one but the output head)")
    return p


def add_job_args(parser: argparse.ArgumentParser, plan: bool = False
                 ) -> dict[str, argparse._ArgumentGroup]:
    """The job's flags, besides the model, its shapes and where it runs, in `--help`'s groups
    (returned by name: step, parallel, job, for a command's own flags); `plan`: a plan's (--cp
    takes several degrees, which its layout search tries; one precision on every GPU)."""
    groups = {name: parser.add_argument_group(title) for name, title in (
        ("step", "the training step"), ("parallel", "parallelism and the cluster"),
        ("job", "the whole job"))}
    p = groups["step"]
    p.add_argument("--precision", choices=PRECISIONS,
                   help="default: fp32 on every GPU of a plan" if plan else
                   "default: the device's usual (fp32 on CPUs and GPUs priced from their "
                   "spec sheet, amp-fp16 on the RTX 3090's checkpoint)")
    p.add_argument("--frozen-weights", choices=FROZEN_WEIGHTS,
                   help="how a model's frozen parameters are held (LoRA's base): in the half "
                        "type (loaded so), or nf4 (QLoRA's 4 bits); default as --precision "
                        "holds weights (fp32 under autocast)")
    p.add_argument("--layout", default="nchw", choices=LAYOUTS,
                   help="an image model's tensors: nchw (default) or nhwc, channels-last")
    p.add_argument("--optimizer", default="sgd", choices=SPEC_SHEET_OPTIMIZERS,
                   help="the training step's optimizer; sgd: with momentum (memory; time "
                        "where the checkpoint was trained on it or the GPU is priced from its "
                        "spec sheet); muon: torch.optim.Muon over the weight matrices, AdamW "
                        "over the rest (a GPU priced from its spec sheet, DDP); adamw-8bit: "
                        "bitsandbytes' AdamW8bit, one-byte states (a GPU priced from its spec "
                        "sheet)")
    p.add_argument("--fused-optimizer", action="store_true",
                   help="torch.optim's fused update kernel (fused=True; transformers' "
                        "Trainer's default), not its foreach kernels (a GPU priced from its "
                        "spec sheet)")
    p.add_argument("--clip-grad-norm", action="store_true",
                   help="gradients clipped by their total norm before the update "
                        "(clip_grad_norm_; transformers' Trainer's default; a GPU priced from "
                        "its spec sheet)")
    p.add_argument("--grad-accum", type=POSITIVE_INT, default=1, metavar="K",
                   help="micro-batches of --batch-size per GPU an iteration runs before its "
                        "update (gradient accumulation; a GPU priced from its spec sheet)")
    p.add_argument("--activation-checkpointing", choices=CHECKPOINTING,
                   help="full: every transformer layer's forward run again in its backward; "
                        "selective: the attention core's (a GPU priced from its spec sheet)")
    p.add_argument("--attention", choices=ATTENTION,
                   help="flash: fused scaled_dot_product_attention; eager: as the graph shows "
                        "it; flash_attention_2: the flash-attn package (transformers' "
                        "attn_implementation), which takes sliding windows itself (default: "
                        "what PyTorch runs on the GPU at the precision)")
    p.add_argument("--compile", action="store_true",
                   help="the model compiled with torch.compile (Inductor: memory-bound "
                        "operators fused; a GPU priced from its spec sheet)")
    p.add_argument("--framework", choices=FRAMEWORKS, default="pytorch",
                   help="whose kernels: eager PyTorch's, or Megatron-LM's (the model in the "
                        "half type, fused softmax and Adam; with --precision amp-fp16|amp-bf16)")
    p.add_argument("--step", choices=STEPS,
                   help="a GPU priced from its spec sheet: the whole step (train, default) or "
                        "forward and backward without the optimizer update")
    p = groups["parallel"]
    p.add_argument("--nodes", type=POSITIVE_INT, default=1, help="nodes of --gpus GPUs each")
    p.add_argument("--strategy", default="ddp", choices=STRATEGIES,
                   help="of the data parallelism: DDP, ZeRO-1, ZeRO-2, FSDP (ZeRO-3) or HSDP "
                        "(FSDP within each node, replicated across nodes: HYBRID_SHARD)")
    p.add_argument("--tp", type=POSITIVE_INT, default=1,
                   help="tensor-parallel GPUs (Megatron-LM's); the data-parallel replicas are "
                        "--gpus x --nodes / (--tp x --pp), --batch-size each")
    p.add_argument("--pp", type=POSITIVE_INT, default=1,
                   help="pipeline stages; --grad-accum gives the micro-batches")
    p.add_argument("--schedule", choices=SCHEDULES, help="the pipeline's (default 1f1b)")
    p.add_argument("--virtual-stages", type=POSITIVE_INT, metavar="V",
                   help="chunks per stage of the interleaved schedule (default 2)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: the residual stream cut along the sequence")
    p.add_argument("--ep", type=POSITIVE_INT, default=1,
                   help="a mixture of experts: its experts split over this many data-parallel "
                        "replicas, tokens exchanged all-to-all")
    p.add_argument("--cp", type=_int_list if plan else POSITIVE_INT, default=[1] if plan else 1,
                   metavar="C[,D,...]" if plan else "C",
                   help="context parallel (ring attention): each sequence cut over this many "
                        "GPUs; the data-parallel replicas are --gpus x --nodes / (--tp x --pp x "
                        "--cp)" + ("; with --global-batch, several: each tried" if plan else ""))
    p.add_argument("--interconnect", choices=INTERCONNECTS, help="within a node")
    p.add_argument("--network-gbs", type=POSITIVE_FLOAT,
                   help="gigabytes/s a node sends to the others, per direction: its NICs' "
                   "gigabits / 8 (eight 400 Gb/s NICs: 400; default: the GPU's DGX NICs, else 25)")
    p.add_argument("--offload", choices=OFFLOADS,
                   help="DeepSpeed's ZeRO-Offload: the Adam optimizer (its state, fp32 master "
                        "weights and update) in the host's memory, on its CPUs; params: the "
                        "weights too, copied in layer by layer (with --strategy fsdp on several "
                        "GPUs; a GPU priced from its spec sheet)")
    p.add_argument("--host-gbs", type=POSITIVE_FLOAT,
                   help="with --offload: the host's memory bandwidth a node, GB/s (default: the "
                        "GPU's DGX CPUs')")
    p = groups["job"]
    p.add_argument("--epochs", type=POSITIVE_FLOAT, help="with --dataset-size: whole-job time")
    p.add_argument("--dataset-size", type=count, help="samples per epoch (1281167 or 1.28e6)")
    p.add_argument("--tokens", type=count, metavar="N",
                   help="a token model: the time to train on N tokens (e.g. 2e12)")
    return groups


def job_fields(args: argparse.Namespace) -> dict:
    """The `TrainingJob` fields of `add_job_args`' flags and the shape flags."""
    return dict(
        image_size=args.image_size, video_frames=args.video_frames,
        audio_seconds=args.audio_seconds, seq_len=args.seq_len,
        target_len=args.target_len,
        lora_rank=args.lora_rank,
        lora_targets=lora_targets(args.lora_targets), frozen_weights=args.frozen_weights,
        input_shapes=input_shapes(args.input_shape) or None,
        precision=args.precision, optimizer=args.optimizer,
        fused_optimizer=args.fused_optimizer, clip_grad_norm=args.clip_grad_norm,
        layout=args.layout, step=args.step,
        nodes=args.nodes, grad_accum=args.grad_accum,
        activation_checkpointing=args.activation_checkpointing, tp=args.tp, pp=args.pp,
        schedule=args.schedule, virtual_stages=args.virtual_stages,
        sequence_parallel=args.sequence_parallel, ep=args.ep, cp=args.cp,
        attention=args.attention, compile=args.compile,
        framework=args.framework,
        strategy=args.strategy, interconnect=args.interconnect, network_gbs=args.network_gbs,
        offload=args.offload, host_gbs=args.host_gbs,
        epochs=args.epochs, dataset_size=args.dataset_size, train_tokens=args.tokens)
