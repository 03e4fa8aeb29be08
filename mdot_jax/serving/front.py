"""The front door: `predict(TrainingJob(...))` chooses the predictor for the job's device (a
GPU's spec sheet, or a checkpoint trained on measured steps), prices every batch size and GPU
count asked, and returns `Prediction`s whose fields are named as the job's.

The choice: a `device_spec`, a step model as `checkpoint` (`gpu-spec-sheet`, or one adapted
by `mdot adapt`), or a catalogued GPU `device` that the checkpoint does not predict for: the
spec sheet (`serving.spec_sheet`, data parallel by `serving.parallel`). Otherwise the
checkpoint (`serving.predict.Predictor`; default `timm-rtx3090`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from converters import ConversionError, OperatorSequence
from converters.attention import attention_blocks, calling_sdpa, layer_starts, varlen
from converters.fusion import fusion_version
from converters.substitutes import described
from mdot_jax import autograd
from mdot_jax.errors import MdotError, RequestError
from mdot_jax.options import AUTOCAST, FLASH_ATTN, OPTIMIZERS, SHARDED_WEIGHTS
from mdot_jax.serving.attention_choice import choose
from mdot_jax.serving.memory import HALF, OPTIMIZER_STATE, held_optimizer, param_bytes
from mdot_jax.serving.model_facts import tokens_of
from mdot_jax.serving.model_source import (
    config_input,
    config_said,
    cut,
    is_config,
    model_errors,
    sequence,
)
from mdot_jax.serving.prediction import SPEC_SHEET, Prediction
from mdot_jax.serving.request import FIELDS, TrainingJob

if TYPE_CHECKING:  # a checkpoint's network (JAX's), imported where one prices
    from mdot_jax.serving.by_checkpoint import Checkpoint


@model_errors
def predict(job: TrainingJob) -> Prediction | list[Prediction]:
    """The job's prediction; a list, one per batch size or GPU count, where the job asks for
    several (`TrainingJob.several`). Raises `MdotError`s: a `RequestError` names the field,
    a `ModelError` the model's problem."""
    try:
        job, spec = _spec(job)
        pricer = _SpecSheet(job, *spec) if spec else _checkpoint(job)
        out = []
        for b in job.batch_sizes:
            seq, one = pricer.step(b)
            for n in job.gpu_counts:
                out.append(_complete(pricer.parallel(one, seq, n), pricer.job, pricer, seq,
                                     b, n))
    except ValueError as e:  # a bad value met deep in the pricing: said as the request's
        if isinstance(e, (MdotError, ConversionError)):
            raise
        first = str(e).split(" ", 1)[0].rstrip(":").removeprefix("--").replace("-", "_")
        raise RequestError(str(e), first if first in FIELDS else "") from None
    return out if job.several else out[0]


def _spec(job: TrainingJob) -> tuple[TrainingJob, tuple | None]:
    """The job to price and the GPU and step model pricing it from a spec sheet, or None: a
    checkpoint. A catalogued `device` the default checkpoint was trained on is priced from its
    spec sheet where the job asks what only the spec sheet prices (`_spec_only`), or, in NCHW
    (what the spec sheet prices), a precision or a kind of input (a language model's tokens)
    the checkpoint never trained on, with a note; at the checkpoint's precision (the device's
    usual) where the job names none. No device and no checkpoint named: the default
    checkpoint's GPU, but for what only a spec sheet prices (which asks for a device)."""
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, spec_gpu
    from mdot_jax.storage.shipped import checkpoint_devices, checkpoint_trained

    spec, only = spec_gpu(job.device, job.device_spec, job.checkpoint), _spec_only(job)
    device = job.device  # none named: the default checkpoint's GPU, where it takes the job
    if device is None and job.checkpoint is None and not spec and not only:
        device = next(iter(checkpoint_devices(None)), None)
    gpu = catalog.lookup(device) if device and not job.checkpoint else None
    if spec or gpu is None:
        return job, spec
    seen = checkpoint_trained(None, "precisions")
    if only:
        field, why = only, "predicts the one-GPU steps it was measured on"
    elif job.precision and job.layout == "nchw" and seen and job.precision not in seen:
        field, why = "precision", f"was trained at {', '.join(seen)} only"
    elif job.layout == "nchw" and (kinds := checkpoint_trained(None, "input_kinds")) and (
            kind := config_input(job.model) if is_config(job.model)  # not exported twice
            else sequence(job, job.batch_sizes[0], fusion_version(True)).input_kind
    ) not in kinds:
        field, why = "model", f"was trained on {' and '.join(kinds)} models only, not {kind}"
    else:
        return job, None
    if job.precision is None and seen:  # the device's usual, as the checkpoint would have
        job = dataclasses.replace(job, precision=seen[0])
        why += f"; at {seen[0]}, its measured precision"
    return job, (gpu, STEP_MODEL_DIR, f"{field}: priced from the {gpu.name}'s spec sheet; the "
                                      f"checkpoint measured on it {why}")


def _spec_only(job: TrainingJob) -> str | None:
    """The first field `job` sets that only a GPU priced from its spec sheet prices: a
    checkpoint predicts the one-GPU eager steps it was measured on (torch.optim's default
    update, unclipped, no accumulation or checkpointing, its attention as exported)."""
    if job.step:
        return "step"
    if job.data_parallel:
        return "gpus"
    if job.precision == "fp8":
        return "precision"
    if job.optimizer not in OPTIMIZERS:
        return "optimizer"
    for name in ("activation_checkpointing", "compile", "fused_optimizer", "clip_grad_norm"):
        if getattr(job, name):
            return name
    for name in ("grad_accum", "tp", "pp", "ep", "cp", "attention", "framework", "offload"):
        if getattr(job, name) not in (1, None, "pytorch"):
            return name
    return None


def _complete(p: Prediction, job: TrainingJob, pricer, seq: OperatorSequence, b: int,
              n: int) -> Prediction:
    """`p` with what the job asked beside the step: its batch and GPUs, the source, the whole
    job's time and where the time goes."""
    moe = seq.meta.get("experts")
    about = [f"mixture of experts ({moe['experts']} experts, top {moe['top_k']}, in "
             f"{moe['layers']} layer{'s' * (moe['layers'] > 1)}): priced as balanced routing, "
             "each expert computing an equal share of the routed tokens (none dropped)"
             ] if moe else []
    about += [f"{s.what}: priced as the work of {s.kernels}, not measured"
              for s in described(seq.meta.get("linear_attention", ""))]
    if k := seq.meta.get("sparse_attention"):
        about.append(f"sparse attention (each query's top {k:,} keys by its indexer): priced "
                     "as transformers computes it, the attention dense over every key and "
                     "masked, the indexer's per-head scores in fp32 kept for a backward "
                     "(DeepSeek's sparse and FP8 kernels do neither): slower and larger than "
                     "those at long sequences")
    about += config_said(seq)
    if unread := seq.meta.get("unread"):
        about.append(f"{unread['params']:,} more of the model's parameters (in "
                     f"{', '.join(unread['in'])}) are read by none of the exported step's "
                     "operators (its forward never uses them: a vision-language model given "
                     "tokens alone, an encoder's unused head): neither their work nor their "
                     "weights' memory is priced")
    if shares := seq.meta.get("selected"):  # `converters.selected`
        about.append(f"{len(shares)} selections by a mask (x[mask], torch.nonzero): each the "
                     f"share of its mask the example selected ({min(shares):.1%}-"
                     f"{max(shares):.1%}), grown with the batch and the sequence")
    if packed := seq.meta.get("packed"):
        about.append(f"recurrent layers given packed sequences ({packed}): priced at every "
                     "padded step, cuDNN runs each sequence's own (up to max / mean length less)")
    if seq.meta.get("checkpointed") and not job.activation_checkpointing:
        about.append("the model checkpoints activations in its own code (torch.utils.checkpoint"
                     ", or its library's flag): priced without the forward it runs again and "
                     "with every activation kept; give activation_checkpointing full")
    frozen = (trained := autograd.trainable(seq)) < seq.params
    if frozen and not trained:
        raise RequestError(f"model: every one of its {seq.params:,} parameters is frozen "
                           "(requires_grad off): nothing trains, and its loss has no backward",
                           "model")
    if frozen:  # no band: the bands were measured on steps that train every parameter
        about.append(f"{trained:,} of the {seq.params:,} parameters trained, the rest frozen"
                     f"{_held(job)}: {pricer.FROZEN}; no band")
        p = dataclasses.replace(p, interval_ms=None)
    if job.optimizer == "sgd" and seq.input_kind == "tokens":
        about.append("optimizer: sgd; language models usually train with adam or adamw, "
                     "whose two moments a parameter the update reads and memory keeps: give "
                     "optimizer adamw")
    p = dataclasses.replace(p, batch_size=b, gpus=n * job.nodes, source=pricer.source,
                            warnings=[*p.warnings, *pricer.notes, *about],
                            mfu=pricer.mfu(seq, p), parameters=seq.params,
                            trained_parameters=trained,
                            tokens=tokens_of(seq) * job.cp)
    p.operators, p.operators_from = (pricer.operators(seq, p, b) if job.operators
                                     else (None, p.operators_from))
    epochs, dataset = job.epochs, job.dataset_size
    if job.train_tokens is not None:  # one pass over a dataset of that many tokens
        if not p.tokens:
            raise RequestError("train_tokens: the model reads no token ids (a rank-2 integer "
                               "input); give epochs and dataset_size", "train_tokens")
        epochs, dataset = 1, math.ceil(job.train_tokens / p.tokens)
    if epochs is not None and dataset is not None:
        if dataset < p.global_batch:  # a partial batch an epoch, priced as a whole one
            short = (f"train_tokens {job.train_tokens:,}: fewer than one iteration's "
                     f"{p.global_batch * p.tokens:,} tokens" if job.train_tokens is not None
                     else f"dataset_size {dataset:,}: fewer than one iteration's "
                     f"{p.global_batch:,} samples")
            p.warnings.append(f"{short}; priced as one whole iteration an epoch")
        p.job_s = p.job_seconds(epochs, dataset, p.global_batch)
        p.job_interval_s = p.job_interval_seconds(epochs, dataset, p.global_batch)
    return p


def _held(job: TrainingJob) -> str:
    """How a job's frozen parameters are held, in words (`TrainingJob.frozen_weights`)."""
    if job.frozen_weights == "nf4":
        return (" (held in nf4: the linear layers' at 4 bits but the head's, each dequantised "
                "for its GEMMs, forward and data gradient, at the memory bandwidth; "
                "bitsandbytes' kernels, not measured)")
    if job.frozen_weights:
        return f" (held in {job.frozen_weights})"
    if job.precision in AUTOCAST:
        return (" (held in fp32, as autocast holds weights: frozen_weights bf16 for a base "
                "loaded in bf16, nf4 for QLoRA's)")
    return ""


# while `keeping_steps` holds (in this thread): the latest steps priced, with their keys
_KEPT: contextvars.ContextVar[list | None] = contextvars.ContextVar("kept", default=None)
KEEP = 16  # steps kept: a plan tries each one's pipeline depths and checkpointings on each GPU


@contextlib.contextmanager
def keeping_steps():
    """Within it, one micro-batch's step priced from a spec sheet is kept (the latest `KEEP`)
    and used again by a job that differs only in what is built on it: the pipeline depth, the
    accumulation, the data-parallel replicas (a plan search's layouts)."""
    token = _KEPT.set([])
    try:
        yield
    finally:
        _KEPT.reset(token)


FP32_DEFAULT = "precision: fp32, the default (no autocast; PyTorch's matmuls off TF32)"
MOST_GPUS = 1_000_000  # GPUs in one job past which no cluster built holds them (a slip)
GIVE_PRECISION = ("; give precision amp-bf16, amp-fp16, bf16 (the whole model in it) or tf32 for "
                  "how you train")


class _SpecSheet:
    """A GPU priced from its spec sheet, data parallel over N GPUs."""
    FROZEN = ("no gradient, gradient communication or optimizer state for those, no backward "
              "before the first trained one (autograd's rules; not measured)")

    def __init__(self, job: TrainingJob, gpu, folder: Path, note: str | None = None):
        from mdot_jax.gpu import catalog, spec_sheet
        from mdot_jax.gpu.parallel import NETWORK_GBS

        self.notes: list[str] = [note] if note else []
        self.optimizer = held_optimizer(job.optimizer, job.step)  # whose state memory holds
        if OPTIMIZER_STATE[job.optimizer] and not OPTIMIZER_STATE[self.optimizer]:
            self.notes.append(f"step {job.step}: no {job.optimizer} update, so no optimizer "
                              "state in memory")
        self.job, self.gpu = job, gpu
        self.model = spec_sheet.load_step_model(folder)
        if job.layout != "nchw" and not self.model.info.get("channels_last"):
            raise RequestError(f"layout: {folder.name} prices NCHW only (no channels-last "
                               "ratios measured: `mdot gpu-fit --channels-last SWEEP`)", "layout")
        adapted = self.model.info.get("adaptation") and self.model.info["gpu"]["name"]
        self.source = f"{SPEC_SHEET} by {folder.name}" + (
            "" if not adapted else ", adapted to measured steps" if adapted == gpu.name
            else f", unadapted (adapted to the {adapted}'s steps)")
        if (most := max(job.gpu_counts)) > (node := gpu.node_gpus):
            held = "its NVLink joins" if gpu.nvlink_gpus else "HGX boards and DGX systems hold"
            self.notes.append(f"gpus {most}: priced as {most} GPUs in one node; {held} {node}: "
                              f"give gpus {node} and nodes {math.ceil(most * job.nodes / node)} "
                              "for such nodes")
        if (total := most * job.nodes) > MOST_GPUS:  # nodes given as GPUs, a zero too many
            self.notes.append(f"gpus x nodes {total:,}: more GPUs than any cluster "
                              f"holds (past {MOST_GPUS:,}); priced as given")
        for field in ("network_gbs", "host_gbs"):  # a unit slipped: Gb/s, MB/s, TB/s
            _, low, high = catalog.RANGES[field]
            if (given := getattr(job, field)) and not low <= given <= high:
                self.notes.append(f"{field} {given:g}: outside the {low:g}-{high:,} GB/s of any "
                                  "real system; priced as given (GB/s: a 400 Gb/s NIC is 50)")
        self.network_gbs = job.network_gbs or gpu.network_gbs or NETWORK_GBS
        if job.nodes > 1 and not job.network_gbs:
            why = (f"the compute NICs of the {gpu.name}'s reference system (its DGX's, or its "
                   "source's)" if gpu.network_gbs else f"one 200 Gb/s NIC (the {gpu.name} has "
                   "no reference system in the catalog)")
            self.notes.append(f"network: {self.network_gbs:g} GB/s a node per direction between "
                              f"nodes, {why}; give network_gbs for your cluster's")

    def step(self, b: int) -> tuple[OperatorSequence, Prediction]:
        """The model at batch `b`, and one GPU's step of one micro-batch of it (its share
        under tensor parallelism, kept with its attention blocks for `parallel`)."""
        from mdot_jax.gpu import model_parallel
        from mdot_jax.gpu.recompute import checkpoint_layers, rerun
        from mdot_jax.gpu.spec_sheet import price

        job = self.job
        try:
            seq = sequence(cut(job), b, fusion_version(True), loss=True)  # a GPU's piece
        except ConversionError as e:  # said of the cut seq_len: say it of cp
            if job.cp > 1 and "--seq-len" in str(e):
                raise RequestError("cp: the model has no token-id input (a rank-2 integer data "
                                   "input) whose sequences to cut", "cp") from None
            raise
        precision = self._precision(seq.meta.get("half_type"))  # the job's, or the model's
        job = self.job
        blocks = attention_blocks(seq)
        self.layout = model_parallel.Layout(1, 1, job.tp, job.pp, job.schedule or "1f1b",
                                            job.stages_per_gpu, job.sequence_parallel)
        model_parallel.check(seq, blocks, self.layout, job.grad_accum, job.cp)
        seq = model_parallel.whole_keys(seq, blocks, job.cp)
        calls = blocks if job.attention else calling_sdpa(seq, blocks)  # those fused
        attention, said = choose(job.attention, self.gpu.capability, precision, blocks,
                                 len(calls), seq.meta.get("eager_attention"))
        self.notes += [said] if said else []
        if attention == FLASH_ATTN:  # the flash-attn package takes each window itself, and
            # a loop over a split's pieces in one varlen call
            blocks = calls = varlen(seq, [b._replace(local=True) for b in blocks])[0]
        # what the step depends on: the model and step model themselves (held, and compared
        # by identity), the GPU and the job's fields that reach the pricing
        if job.ep > 1 and not seq.meta.get("experts"):
            raise RequestError("ep: the model has no experts to split (a mixture of experts' "
                               "config.json has them)", "ep")
        gathered = job.strategy in SHARDED_WEIGHTS  # in the half type by FSDP's mixed precision
        key = (seq, self.model, self.gpu, job.tp, job.sequence_parallel, job.ep, precision,
               job.step, job.optimizer, job.fused_optimizer, job.clip_grad_norm, attention,
               gathered, job.framework, job.activation_checkpointing, job.compile, job.layout)
        steps = _KEPT.get()
        for kept, priced in steps or ():
            if kept[0] is seq and kept[1] is self.model and kept[2:] == key[2:]:
                self.seq, self.blocks, self.fused, one = priced
                return seq, one
        # sharding keeps every operator in its place: the blocks found here hold for it
        self.seq = model_parallel.shard_experts(
            model_parallel.shard(seq, job.tp, job.sequence_parallel, blocks), job.ep)
        self.blocks = blocks
        self.fused = calls if attention in ("flash", FLASH_ATTN) else []
        again = rerun(self.seq, job.activation_checkpointing, blocks, self.fused) \
            if job.activation_checkpointing else set()
        one = price(self.seq, self.gpu, self.model, precision=precision,
                    step=job.step or "train", optimizer=job.optimizer, fit=False,
                    attention="flash" if self.fused else attention,
                    blocks=self.fused or blocks,
                    half_weights=gathered,
                    framework=job.framework, recompute=again,
                    fused_optimizer=job.fused_optimizer, clip_grad_norm=job.clip_grad_norm,
                    layout=job.layout)
        if job.activation_checkpointing:
            one = checkpoint_layers(one, self.seq, precision,
                                    job.activation_checkpointing, self.fused, blocks,
                                    job.framework)
        if steps is not None:
            steps[:] = [*steps[1 - KEEP:], (key, (self.seq, blocks, self.fused, one))]
        return seq, one

    def _precision(self, half: str | None) -> str:
        """The job's precision; where it names none, autocast to the half type the model was
        exported in (`half`), else fp32 (the job keeps it), with a note either way."""
        asked, autocast = self.job.precision, {"bf16": "amp-bf16", "fp16": "amp-fp16"}.get(
            half or "")
        if asked is None:
            precision = autocast or "fp32"
            self.job = dataclasses.replace(self.job, precision=precision)
            note = (f"precision: {autocast}, as the model was exported in {half} (autocast: "
                    "GEMMs in it, weights, gradients and optimizer state in fp32; a model "
                    "trained in it throughout holds half those bytes)" if autocast else
                    FP32_DEFAULT) + GIVE_PRECISION
        elif autocast and asked not in (autocast, "fp8", half):  # fp32, tf32, the other half
            precision, note = asked, (
                f"precision: {asked} as asked, though the model was exported in {half}"
                + ("" if asked in HALF else ": priced with every tensor in fp32"))
        else:
            return asked
        self.notes += [note] * (note not in self.notes)
        return precision

    def parallel(self, one: Prediction, seq: OperatorSequence, n: int) -> Prediction:
        from mdot_jax.gpu import bands, model_parallel
        from mdot_jax.gpu.offload import offload
        from mdot_jax.gpu.parallel import accumulate, data_parallel
        from mdot_jax.gpu.recompute import copies_kept
        from mdot_jax.serving.memory import check_fit, loss_note

        job, network = self.job, self.network_gbs
        params = self.seq.params
        if job.cp > 1:  # the ring's sends, each micro-batch
            one = self._context(one, n)
        if job.model_parallel:
            layout = dataclasses.replace(self.layout, gpus=n * job.nodes, gpus_per_node=n)
            one, params = model_parallel.pipeline(
                one, self.seq, self.blocks, layout, self.gpu, job.grad_accum,
                job.precision or "fp32", self.optimizer, job.activation_checkpointing, network,
                job.interconnect, self.fused, job.framework)
        else:
            one = accumulate(one, job.grad_accum)
        experts = 0
        if job.ep > 1:  # the experts' share of the (fullest stage's) parameters
            one, experts = self._experts(one, n)
            experts = round(experts * params / self.seq.params)
        starts = layer_starts(self.seq, self.blocks)  # FSDP's units: its layers and the root
        shape = dict(optimizer=self.optimizer, grad_accum=job.grad_accum,
                     precision=job.precision or "fp32", units=len(starts) + 1 if starts else 0,
                     trained=autograd.trainable(self.seq) / max(self.seq.params, 1),
                     weight_bytes=self._weight_bytes())
        copies = copies_kept(self.seq, job.precision or "fp32", job.framework,
                             job.activation_checkpointing, self.blocks)
        # Megatron-LM reduces the gradients after the backward (overlap_grad_reduce off)
        p = data_parallel(one, params, self.gpu, n, job.nodes, job.interconnect, network,
                          job.strategy, model_parallel=job.tp * job.pp,
                          after_flush=job.model_parallel or job.framework == "megatron",
                          framework=job.framework, experts=experts, ep=job.ep,
                          stride=job.tp, copies=copies, **shape)  # Megatron's order: tp, dp, pp
        if job.offload:
            p = offload(p, job.offload, params, self.gpu, gpus_per_node=n, nodes=job.nodes,
                        strategy=job.strategy, host=job.host_gbs, **shape)
        p = dataclasses.replace(p, warnings=list(p.warnings), tp=job.tp, pp=job.pp, cp=job.cp)
        if job.model_parallel and (note := loss_note(seq, p.memory_gb, job.tp)):  # a stage's
            # activations leave the loss out; one GPU's and data parallel's count it
            p.warnings.append(note)
        check_fit(p, self.gpu.memory_gb, f"the {self.gpu.name}'s memory")  # as finally priced
        return bands.megatron(p, self.model.info, self.gpu, job, self.seq, bool(self.fused))

    def _weight_bytes(self) -> float | None:
        """A weight's bytes on average where the frozen ones are held otherwise (None: as the
        precision holds every weight)."""
        if self.seq.meta.get("frozen_weights") is None:
            return None
        held = param_bytes(self.job.precision or "fp32", self.job.optimizer, self.job.framework)
        return autograd.held_bytes(self.seq, held.model) / max(self.seq.params, 1)

    def _context(self, one: Prediction, n: int) -> Prediction:
        """`one` with context parallelism's ring sends (`model_parallel.context_exchange`):
        the cp GPUs of a ring tp ranks apart."""
        from mdot_jax.gpu import model_parallel
        from mdot_jax.gpu.parallel import group_link

        job = self.job
        link = group_link(self.gpu, n, job.nodes, job.interconnect, self.network_gbs, job.cp,
                          job.tp)
        return model_parallel.context_exchange(one, self.seq, self.blocks, job.cp, job.tp, link,
                                               *self._activations())

    def _experts(self, one: Prediction, n: int) -> tuple[Prediction, int]:
        """`one` with expert parallelism's all-to-alls (`parallel.expert_exchange`), and the
        parameters of the experts a GPU holds."""
        from mdot_jax.gpu import model_parallel
        from mdot_jax.gpu.parallel import exchange_links, expert_exchange

        job, moe = self.job, self.seq.meta["experts"]
        links = exchange_links(self.gpu, n, job.interconnect, self.network_gbs, job.ep, job.tp)
        tokens = model_parallel.tokens_of(self.seq, self.blocks) // (
            job.tp if job.sequence_parallel else 1)
        act_bytes, passes = self._activations()
        one = expert_exchange(one, moe, job.ep, tokens, model_parallel.width(self.seq),
                              act_bytes, -(-moe["layers"] // job.pp), passes, *links)
        return one, model_parallel.expert_params(self.seq)

    def _activations(self) -> tuple[int, int]:
        """Bytes of an activation's element at the job's precision, and the passes over the
        layers a micro-batch makes (forward, backward, a recomputed forward)."""
        job = self.job
        return (2 if (job.precision or "fp32") in HALF else 4,
                2 + (job.activation_checkpointing == "full"))

    def mfu(self, seq: OperatorSequence, p: Prediction) -> float | None:
        """The time the model's forward and backward FLOPs an iteration (not the
        recomputation's; causal attention at the keys it needs) take at its GPUs' peaks at the
        precision, over the iteration's time (convolutions at theirs: TF32 under PyTorch's fp32
        defaults, `peaks.peak_ms`)."""
        from mdot_jax.gpu.peaks import peak_ms

        ideal = peak_ms(seq, self.gpu, self.job.precision or "fp32", self.blocks) \
            * self.job.grad_accum
        return ideal / (p.iteration_ms * p.tp * p.pp) if p.iteration_ms > 0 else None

    def operators(self, seq, p: Prediction, b: int) -> tuple[list[dict], str]:
        return p.operators or [], f"the GPU operator model on the {p.device}"


def _checkpoint(job: TrainingJob) -> Checkpoint:
    """The checkpoint's pricer for `job`, which asks nothing only a spec sheet prices (its
    network, JAX's, imported only here: a spec sheet's prediction needs none)."""
    from mdot_jax.serving.by_checkpoint import Checkpoint

    if job.device and not job.checkpoint:  # a GPU's name that matched no one row
        from mdot_jax.gpu import catalog

        try:
            catalog.find(job.device)
        except catalog.UnknownGPU as e:  # said first where the name was meant as a GPU
            if e.meant:
                raise RequestError(f"device: {e}", "device") from None
    if field := _spec_only(job):
        if job.checkpoint:
            which, name = f"checkpoint {job.checkpoint}", "device=NAME, no checkpoint"
        else:
            which = f"device {job.device}'s checkpoint" if job.device else \
                "the default checkpoint (no device named)"
            name = "name one: device=NAME, `mdot devices`"
        value = getattr(job, field)
        said = field if isinstance(value, (bool, tuple)) else f"{field} {value!r}"
        raise RequestError(f"{said}: priced for a GPU from its spec sheet ({name}); {which} "
                           "predicts the one-GPU steps it was measured on", field)
    return Checkpoint(job)
