"""A training step on a named GPU from its spec sheet alone: the model's operators (converted
with eager-kernel fusion, `converters.fusion`: the kernels eager PyTorch runs) priced one by
one by the GPU operator model (`models.gpu_ops`, fitted on public fp32 measurements of other
GPUs) and summed.

The rules, per operator of the sequence:
- forward: MatMul and Gemm are GEMMs (`linear` when one [K, N] operand serves the whole
  batch, `bmm` otherwise), Conv an implicit GEMM (`conv`; a grouped one as the dense
  convolution of its FLOPs: its groups side by side in the output channels), Softmax and the
  normalisations row-wise kernels (a batch norm's rows are its channels), elementwise
  operators the measured kind they are closest to (binary, with a broadcast operand, cheap or
  transcendental unary); copies (Concat, Slice,
  Gather, Pad, ...) are a unary kernel over their output; views cost nothing; every other
  operator (pooling, reductions, resizing, operators unknown to the converter) is priced as a
  copy of its larger tensor, with a warning that nothing like it was measured; recurrent
  layers (LSTM, GRU, RNN) as cuDNN runs their steps (`gpu.recurrent`), warned too.
- backward: a GEMM's or convolution's data- and weight-gradient GEMMs (no data gradient for
  one reading only the graph's inputs and weights); any other operator its forward times the
  ratio measured for its kind on the fitted GPUs' traces (`StepModel.ratios`); each weight an
  elementwise gradient accumulation, but a linear layer's (its GEMM writes it; its bias's kept).
- scans whose matrix products stay on chip (`fused.ON_CHIP_SCANS`: Mamba-2's chunked scan) as
  fused attention is priced (`gpu.fused`): GEMMs of their FLOPs at the share of the peak fused
  attention reaches, the forward once and the backward twice.
- the optimizer update (`step="train"`; NeuSight's labels and `step="fwd-bwd"` have none):
  elementwise passes over all parameters, as torch.optim's foreach or fused kernels or
  Megatron-LM's run it (`gpu.update`).
- memory-bound kernels (elementwise, normalisations, softmax, the update's passes, casts): at
  the share of the bandwidth a lent GPU's sweep measured, where the step model holds it
  (`StepModel.kernel_ms`, `gpu.streaming`).
- activation checkpointing (`recompute`, the nodes `gpu.recompute.rerun` names): their
  forward kernels run again in the backward, each just before its node's backward kernels, and
  the host issues them too (phase `recomputation`).
- the host: the framework issues one kernel every `StepModel.host_ms(framework)` (fitted on
  measured whole steps, `gpu_fit.best_host`) and the GPU runs them in order (`launch_bound`),
  each for its time less the fixed cost learned from kernels measured one at a time (the
  host's part); the GPU's idle time is the phase `launch gaps`, said in a warning where it is
  more than `LAUNCH_BOUND` of the step.
- convolutions (dense, depthwise) and batch norms at the shares a lent GPU's sweep measured,
  on GPUs of its architecture, where the step model holds `cnn_kernels` (`gpu.cnn_kernels`).
- autocast's casts (`amp-*`), one kernel each, where each tensor's type changes as it flows
  (`gpu.autocast`): a GEMM's or convolution's weight and bias, an fp32 activation it reads,
  a half tensor an autocast fp32 operator reads, forward and gradient back; a half tensor
  promoted to fp32 (added to an fp32 residual), its gradient; under FSDP no weight is cast
  (its mixed precision, as LLM trainers configure it, gathers them in the half type). Small
  steps are launch-bound: their number counts, not their bytes.
- precision: GEMMs and convolutions at the peaks `gpu.peaks` gives them; under autocast
  (`amp-*`, `fp8`) elementwise operators on 2-byte tensors, softmax, normalisations and the
  optimizer in fp32 (autocast's lists). GEMMs on tensor cores are priced at the share of the
  peak measured GEMMs reach (`gpu.tensor_cores`, where the step model holds it); any other
  kernel at a tensor-core precision is the operator model's with the tensor-core peak as the
  GPU's: the public operator data is fp32 only, so every non-fp32 price comes with a warning.
  `fp8`: the linear layers' GEMMs at the FP8 peak, and each one's input, weight and output
  gradient scaled and cast (`autocast.fp8_casts`).
- a step model adapted to a GPU's measured steps (`mdot adapt`, `serving.adaptation`): the
  step's time mapped by its fit, or (its `machine` form) every kernel at the fitted factor of
  its price and the host at the fitted time a kernel.
- a step compiled with `torch.compile` (the sequence says so, `gpu.compiled`): the memory-bound
  operators between GEMMs fused into generated kernels priced by the bytes they move.
- framework `megatron` (Megatron-LM at amp-*): the model in the half type, so no casts and
  softmax and normalisations on half tensors; each eager attention block's scale, mask and
  guards fused into its softmax kernel; a model's written-out norms, rotary embeddings and
  gated activations as its fused kernels, linear layers reading one tensor as one GEMM, a
  fused attention call's scale, mask and grouped keys on chip (`gpu.megatron_fusions`); its
  update (`gpu.update`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from converters import OperatorSequence
from converters.attention import Block
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from mdot_jax import autograd
from mdot_jax.errors import RequestError, UsageError
from mdot_jax.gpu import (
    autocast,
    cnn_kernels,
    compiled,
    megatron_fusions,
    muon,
    peaks,
    recurrent,
    tensor_cores,
)
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.classify import classified
from mdot_jax.gpu.fused import ON_CHIP_SCANS, fused_attention, fused_nodes, masked, scan_gemms
from mdot_jax.gpu.gpu_ops import StepModel, backward_gemms
from mdot_jax.gpu.host import launch_bound, record, waits
from mdot_jax.gpu.tensor_cores import GEMM_OPS
from mdot_jax.gpu.unmeasured import unmeasured
from mdot_jax.gpu.update import update, update_kernels
from mdot_jax.options import AUTOCAST, LAYOUTS, STEPS
from mdot_jax.options import SPEC_SHEET_PRECISIONS as PRECISIONS
from mdot_jax.readable import number
from mdot_jax.serving.memory import check_fit, held_optimizer, step_memory
from mdot_jax.serving.model_facts import graph_warnings, input_size_of
from mdot_jax.serving.prediction import GAPS, Prediction
from mdot_jax.storage.shipped import STEP_MODEL_DIR, checkpoint_devices

FUSED = "attention (fused)"  # the type of the operator a fused attention kernel is kept on
CASTS = "casts"  # the type of the cast kernels added around a node (its name's), kept apart
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_L = {name: i for i, name in enumerate(LOAD_FIELDS)}


def step_model_dir(checkpoint: str | Path | None) -> Path | None:
    """The folder of a GPU step model `checkpoint` names (the shipped one by its name, or a
    folder holding one, e.g. adapted by `mdot adapt`), else None."""
    if checkpoint is None:
        return None
    if str(checkpoint) == STEP_MODEL_DIR.name:
        return STEP_MODEL_DIR
    return Path(checkpoint) if (Path(checkpoint) / StepModel.META).is_file() else None


def spec_gpu(device: str | None, device_spec: str | Mapping | None, checkpoint: str | None
             ) -> tuple[GPU, Path] | None:
    """The GPU `mdot predict` prices from its spec sheet, and the step model's folder:
    `device_spec`'s GPU; the catalogued GPU `device` names with a step model as checkpoint (an
    adapted one's own GPU without `device`), or with none where the default checkpoint does
    not predict for it. None: a checkpoint predicts. A bad request: a RequestError naming the
    field, or the catalog's ValueError for an unknown GPU."""
    folder = step_model_dir(checkpoint)
    if device_spec is not None:
        if device or (checkpoint and folder is None):
            raise RequestError("device_spec: describes the device itself; drop device, and a "
                               "checkpoint that is not a GPU step model", "device_spec")
        return gpus.from_spec_file(device_spec), folder or STEP_MODEL_DIR
    if folder is not None:
        if device:
            return gpus.find(device), folder
        adapted = json.loads((folder / StepModel.META).read_text()).get("gpu")
        if not adapted:
            raise RequestError(f"device: the step model {checkpoint} prices a GPU that device "
                               "names (`mdot devices`)", "device")
        return gpus.find(adapted["name"]), folder
    gpu = gpus.lookup(device) if device and not checkpoint else None
    if gpu is None:  # no GPU, or the checkpoint's own name for a device (or its error)
        return None
    theirs = {g.name for g in map(gpus.lookup, checkpoint_devices(None)) if g}
    return (gpu, STEP_MODEL_DIR) if gpu.name not in theirs else None


def load_step_model(folder: str | Path | None = None) -> StepModel:
    """The shipped step model (`mdot gpu-fit` makes it), or the one in `folder`; read once
    while its files are unchanged."""
    folder = Path(folder or STEP_MODEL_DIR)
    meta = folder / StepModel.META
    if not meta.exists():
        raise UsageError(f"{folder}: no GPU step model ({StepModel.META}); `mdot gpu-fit "
                         "../shared/datasets/neusight` makes one")
    stat = meta.stat()
    return _step_model(str(folder.resolve()), (stat.st_ino, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _step_model(folder: str, stamp: tuple) -> StepModel:
    return StepModel.load(folder)


LAUNCH_BOUND = 0.2  # a step whose launch gaps are more than this share says so
ODD_SHARE = 0.01  # a linear layer with this share of the forward's FLOPs is said if unaligned
# a kernel: (node index, phase "fw" | "bw", measured operator, dims, the GPU as that operator
# sees it, times what)
Kernel = tuple[int, str, str, tuple, GPU, float]


@dataclass
class _Found:
    """The kernels of a step as `_kernels` finds them, and what the warnings say of them."""

    grads: autograd.Backward  # the backward kernels autograd runs
    work: list[Kernel] = field(default_factory=list)
    measured: dict[int, float] = field(default_factory=dict)  # work index -> measured ms
    kinds: list[str] = field(default_factory=list)  # each node's (`classify`)
    classes: set[str] = field(default_factory=set)  # `peaks.seen_by_class` classes priced
    other: dict[str, int] = field(default_factory=dict)  # types priced as copies: how many
    recurrent: dict[str, int] = field(default_factory=dict)  # LSTM, GRU, RNN layers: how many
    odd_convs: int = 0  # convolutions unlike the measured ones (3x3, stride 1, dense)
    unmeasured: int = 0  # convolutions without a measured kernel of their kind
    slowed: list[int] = field(default_factory=list)  # unaligned features of layers slowed
    odd_layers: list[int] = field(default_factory=list)  # large unaligned layers' features


def price(seq: OperatorSequence, gpu: GPU, model: StepModel, *, precision: str = "fp32",
          step: str = "train", optimizer: str = "sgd", fit: bool = True,
          attention: str = "eager", blocks: list[Block] | None = None,
          host_ms: float | None = None, kernels: list[float] | None = None,
          half_weights: bool = False, framework: str = "pytorch",
          recompute: Collection[int] = (), fused_optimizer: bool = False,
          clip_grad_norm: bool = False, layout: str = "nchw") -> Prediction:
    """ms of one training step of `seq` (fused, at its batch size) on `gpu`, with per-operator
    times (`operators`, each with its `index` in `seq`), warnings for whatever is
    extrapolated, and an 80% band when nothing is (the band of whole steps on GPUs left out of
    the fit). `fit`: judge here whether the step fits the GPU (False: the caller judges the
    memory it finally prices). `attention`: `flash` prices each attention block (`blocks`,
    found in `seq` when not given) as one fused kernel (`fused_attention`), `eager` as
    exported. `host_ms`: the host's time to issue a kernel (default: the model's fitted one);
    `kernels`, if given, receives the kernel times in the order they run. `half_weights`: the
    weights reach the step in the half type already (FSDP's mixed precision gathers them so):
    autocast casts none of them. `framework`: whose kernels (the module docstring's rule).
    `recompute`: the nodes whose forward kernels run again in the backward (checkpointing).
    `fused_optimizer`, `clip_grad_norm`: the update's kernels and clipping's (`gpu.update`).
    `layout` nhwc: channels-last, at the model's measured layout ratios (`cnn_kernels`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} on a GPU: choose from {list(PRECISIONS)}")
    if step not in STEPS:
        raise ValueError(f"step {step!r}: choose from {list(STEPS)}")
    u = update(optimizer, precision, framework, fused_optimizer, clip_grad_norm)  # checks it
    megatron = framework == "megatron"
    cl = cnn_kernels.channels_last(model.info, gpu, precision) if layout == "nhwc" else None
    if layout not in LAYOUTS or (layout == "nhwc" and cl is None):
        raise ValueError(f"layout {layout!r}: this step model prices nchw" + (
            " and nhwc" if model.info.get("channels_last") else " only (channels-last: "
            "`mdot gpu-fit --channels-last SWEEP`)"))
    if megatron and precision not in AUTOCAST:
        raise ValueError(f"framework megatron trains at {', '.join(AUTOCAST)}, not {precision}")
    at, extrapolated = peaks.seen_by_class(
        gpu, precision, model.info.get("tensor_cores", {}).get(gpu.name, ()))
    tc = peaks.tensor_core_gemms(model.info, gpu, precision)
    if tc:  # still not banded: the band is of fp32 steps
        extrapolated["gemm"] = tc[2]
    lin = peaks.linear_gemms(model.info, gpu, precision)  # fp8's linear layers
    warnings: list[str] = [lin[1]] if lin else []
    if precision == "bf16":
        warnings.append("bf16: the whole model, its gradients and optimizer state in bfloat16 "
                        "(model.to(torch.bfloat16)), no autocast: priced, not measured")
    blocks, inside = fused_nodes(seq, attention, megatron, blocks)
    inside |= megatron_fusions.in_attention(seq, blocks) if megatron else set()  # on chip
    (flash, note), (efficient, masked_note) = (tensor_cores.fused_attention_share(
        model.info.get("fused_attention"), gpu, tc, k) for k in ("flash", "efficient"))
    cnn, rnn = cnn_kernels.applying(model.info, gpu, precision), recurrent.cudnn_gemms(
        model.info, gpu, precision)
    at = dict(at, rnn=rnn[0] if rnn else at["gemm"], rowwise=at["memory" if megatron else "fp32"])
    fusion = compiled.fusing(seq, blocks) or megatron_fusions.fusing(seq, blocks, framework)
    found = _kernels(seq, model, gpu, precision, at, blocks, inside, (flash, efficient),
                     cnn, {i for g in fusion for i in g.members}, cl,
                     megatron_fusions.projections(seq) if megatron else {})
    work = found.work
    work.extend(compiled.kernels(fusion, found.grads.runs, at["rowwise"], at["memory"]))
    first_cast = len(work)  # the casts autocast, QLoRA and fp8 add: shown apart (`CASTS`)
    if precision in AUTOCAST and not megatron:
        work.extend(autocast.casts(seq, found.kinds, inside | {b.output for b in blocks},
                                   at["fp32"], half_weights, found.grads, precision,
                                   not fusion))
    work.extend(autocast.dequantised(seq, found.grads, at["memory"], precision))  # QLoRA's
    if lin:
        work.extend(autocast.fp8_casts([(w[0], w[3]) for w in work if w[1] == "fw"
                                        and w[2] == "linear" and w[4] is at["linear"]],
                                       at["memory"]))
    casts = slice(first_cast, len(work))
    adapted = model.adaptation(gpu, warnings)
    machine = adapted if adapted and adapted.fit == "machine" else None
    host = host_ms if host_ms is not None else float(machine.host_ms or 0.0) if machine \
        else model.host_ms(framework)
    apart = host > 0 or machine is not None  # kernels without the host's part (as fitted)
    ms = model.kernel_ms([w[2] for w in work], [w[3] for w in work], [w[4] for w in work],
                         apart)
    for pricer, seen in ((tc and functools.partial(tc[1].ms, tc[0]), at["gemm"]),  # tensor
                         (rnn and rnn[1], at["rnn"]),  # cores; cuDNN's TF32; fp8's linears
                         (lin and (lambda *a: [lin[0].ms(*w) for w in zip(*a)]), at["linear"])):
        if pricer and (on := [j for j, w in enumerate(work) if w[2] in GEMM_OPS and w[4] is seen]):
            ms[on] = pricer(*zip(*(work[j][2:5] for j in on)))  # ops, dims, seen: measured
    if found.measured and cnn:
        ms[list(found.measured)] = list(found.measured.values())
        warnings.append(cnn.note)
        if not found.unmeasured:
            found.classes.discard("conv")
    speed = math.exp(machine.a) if machine else 1.0  # the machine's kernels' factor
    order, per_op, phases = _in_order(work, ms * speed, recompute, seq.num_ops)
    if step != "train":
        del phases["update"]
    cast_ms = _in_order(work[casts], ms[casts] * speed, recompute, seq.num_ops)[1]
    fused = {b.output for b in blocks}  # the node each fused kernel's time is kept on
    operators: list[dict] = [dict(type=kind, name=str(nm), ms=float(t), index=i) for i, (
        n, nm, own, c) in enumerate(zip(seq.op_names.tolist(), seq.node_names, per_op, cast_ms))
        for kind, t in ((FUSED if i in fused else n, own - c), (CASTS, c)) if t > 1e-12]
    params = autograd.trainable(seq)  # the frozen ones are not updated
    ks: list[float] = []  # the update's kernels, ms
    if step == "train" and params:
        shapes = muon.matrices(seq) if optimizer == "muon" else []  # the rest: AdamW
        rest = params - sum(a * b for a, b in shapes)
        held = int(((seq.column("params") > 0) & ~autograd.frozen_nodes(seq)).sum())
        ks = update_kernels(u, rest, params, lambda n: float(
            model.kernel_ms(["add"], [(1, n)], [at["fp32"]], apart)[0]), held)
        ks += muon.kernels_ms(shapes, gpu, model, apart)
        phases["update"] = t = sum(ks) * speed
        order.extend(k * speed for k in ks)
        operators.append(dict(type="optimizer", ms=t, name=f"{optimizer} update (" + (
            f"{len(shapes)} matrices orthogonalised, AdamW over the rest" if shapes else
            f"{u.passes:.3g} passes over the parameters") + ")"))
        warnings.append(muon.said(shapes, rest) if optimizer == "muon" else
                        f"the {optimizer} update priced as {u.passes:.3g} elementwise passes "
                        f"over the {params:,} {'trained ' * (params < seq.params)}parameters"
                        + (f" of a {tp}-way tensor-parallel rank" if (tp := seq.meta.get("tp"))
                           else "") + f" ({u.what}): not measured")
    warnings += sorted({extrapolated[c] for c in found.classes if c in extrapolated})
    warnings += unmeasured(seq, found, model.info.get("unaligned_gemms"), blocks, note, masked_note)
    warnings += graph_warnings(seq.meta.get("graph") or {})
    if fusion:
        warnings.append(megatron_fusions.said(fusion) if megatron
                        else compiled.said(fusion, host, framework))
    gaps = (end := launch_bound(order, host)) - sum(order)
    if gaps > 1e-9:
        phases["launch gaps"] = gaps
        # where they fall: the forward's and the backward's, which each micro-batch pays
        # again (and communication hides behind: `parallel.data_parallel`), and what the
        # update's kernels add once an iteration (`parallel.accumulate`)
        first, passes = waits(order, host, (sum(w[1] == "fw" for w in work),
                                            len(order) - len(ks)))
        operators += [dict(type="launch gaps", name=GAPS[part], ms=t) for part, t in zip(
            GAPS, (first, passes - first, gaps - passes)) if t > 1e-9]
        if gaps > LAUNCH_BOUND * end:
            machines = _on_machines(order, model.host_range(framework)) \
                if host_ms is None and adapted is None else ""
            warnings.append(f"launch-bound: {gaps / end:.0%} of the step waits on the host "
                            f"({1e3 * host:.0f} us a kernel under {framework}{machines}; a "
                            "machine's own: `mdot adapt --from-measurements CSV --base "
                            f"gpu-spec-sheet --device-name {gpu.name}` fits your steps)")
    if cl:
        warnings.append(cl.note if "conv" in found.kinds or "BatchNormalization" in seq.op_names
                        else "layout nhwc: no convolution or batch norm to lay out; the step "
                        "is NCHW's")
    if kernels is not None:
        kernels.extend(order)
    record(order)
    total = sum(phases.values())
    banded = not (found.classes & set(extrapolated) or found.other or found.recurrent
                  or found.odd_convs or seq.unknown_ops or blocks
                  or fusion or cl)  # fused kernels: priced, not measured
    scale, band, band_from = model.banded(adapted, precision, total, banded, warnings)
    p = Prediction(iteration_ms=total * scale, device=gpu.name, num_ops=seq.num_ops,
                   input_size=input_size_of(seq), warnings=warnings,
                   operators=operators if scale == 1.0 else [
                       dict(o, ms=float(o["ms"]) * scale) for o in operators],
                   phases={k: v * scale for k, v in phases.items()}, interval_ms=band,
                   band_from=band_from)
    memory = step_memory(seq, precision, held_optimizer(optimizer, step), fused=blocks,
                         framework=framework)
    p.memory_gb, p.memory_parts = memory.total / 1e9, memory.parts()
    if fit:
        check_fit(p, gpu.memory_gb, f"the {gpu.name}'s memory")
    return p


def _kernels(seq: OperatorSequence, model: StepModel, gpu: GPU, precision: str, at: dict,
             blocks: list[Block], inside: set[int], slower: tuple[float, float], cnn,
             fused: set[int], cl: cnn_kernels.ChannelsLast | None, merged: dict[int, int]
             ) -> _Found:
    """The forward and backward kernels of `seq`'s nodes (the module docstring's rules), each
    priced on the GPU as its class sees it (`at`, `peaks.seen_by_class`); `fused`: the nodes
    fused kernels run instead (`compiled`'s, Megatron's); `cl`: a channels-last step's ratios;
    `merged`: linear layers run as one GEMM (`megatron_fusions.projections`)."""
    grads = autograd.backward(seq)  # what autograd runs (frozen parameters have no gradient)
    found = _Found(kinds=[""] * seq.num_ops, grads=grads)
    work = found.work
    unaligned = model.info.get("unaligned_gemms")
    flops = seq.total("fwd_flops")
    calls: dict[int, list[Block]] = {}  # a kernel's blocks (several: one varlen call)
    for b in blocks:
        calls.setdefault(b.scores if b.call < 0 else b.call, []).append(b)
    for b, *others in calls.values():
        found.classes.add("gemm")
        s = slower[masked(b, int(seq.config[b.scores, _C["mm_n"]]))]
        for phase, gemms in fused_attention(seq, b, *others).items():
            if phase == "fw" or grads.runs[b.output]:
                work.extend((b.output, phase, "linear", dims, at["gemm"], s) for dims in gemms)
    outputs = {b.output for b in blocks}
    for i, (name, c, load, (kind, op, dims)) in enumerate(zip(
            seq.op_names.tolist(), seq.config, seq.load, classified(seq))):
        found.kinds[i] = kind
        if kind == "free" or i in inside or i in outputs:
            continue
        if i in fused:  # a compiled step's generated kernels run it (`gpu.compiled`), but
            work.extend(_accumulated(i, int(load[_L["params"]]), grads, at))  # its parameters'
            continue
        weight = dims[2] * dims[3] if op == "linear" and load[_L["params"]] > 0 else 0
        if (n := merged.get(i)) is not None:  # one GEMM with its siblings (Megatron's)
            if not n:  # the first's runs it
                work.extend(_accumulated(i, int(load[_L["params"]]) - weight, grads, at))
                continue
            dims = (dims[0], dims[1], n, dims[3])
        if name in recurrent.GATES:  # its steps in turn, issued by cuDNN (`gpu.recurrent`)
            work.extend((i, phase, op, dims, at["rnn"] if op == "linear" else at["memory"], n)
                        for phase, op, dims, n in recurrent.kernels(
                            name, c, bool(grads.data[i]), bool(grads.weights[i]))
                        if phase == "fw" or grads.runs[i])
            found.recurrent[name] = found.recurrent.get(name, 0) + 1
            found.classes.add("gemm")
            continue
        if name in ON_CHIP_SCANS:  # its products on chip, priced as fused attention's are
            work.extend((i, phase, "linear", dims, at["gemm"], slower[0])
                        for phase, dims in scan_gemms(name, load[_L["fwd_flops"]])
                        if phase == "fw" or grads.runs[i])
            found.classes.add("gemm")
            continue
        if kind == "other":
            found.other[name] = found.other.get(name, 0) + 1
        found.classes.add("conv" if kind == "conv" else "gemm" if op in ("bmm", "linear")
                          else "")
        seen = at["conv"] if kind == "conv" else at["linear"] if op == "linear" and \
            peaks.takes_linear_peak(dims) else at["gemm"] if op in ("bmm", "linear") else \
            at["rowwise"] if kind in ("softmax", "ln") else at["memory"]
        factor = tensor_cores.unaligned_slowdown(unaligned, gpu, precision, dims) \
            if op == "linear" else 1.0
        odd = tensor_cores.unaligned(precision, dims) if op == "linear" else []
        if factor > 1:
            found.slowed.append(max(odd))
        if odd and precision != "fp32" and 2.0 * math.prod(dims) >= ODD_SHARE * flops:
            found.odd_layers.append(max(odd))
        g, c_in = int(c[_C["groups"]]), max(int(c[_C["in_channels"]]), 1)
        fw, bw = cl.of("batch norm" if name == "BatchNormalization" else "depthwise" if
                       cnn_kernels.is_depthwise(g, c_in, dims[2]) else "dense") \
            if cl and (kind == "conv" or name == "BatchNormalization") else (1.0, 1.0)
        work.append((i, "fw", op, dims, seen, factor * fw))
        if kind == "conv":  # its forward, data gradient (not of the graph's input), weights'
            convs = cnn_kernels.conv_kernels(dims, g, c_in, int(c[_C["kernel_h"]] * c[
                _C["kernel_w"]]), int(c[_C["out_numel"]]), bool(grads.data[i]))
            kept = convs[1:-1] + convs[-1:] * bool(grads.weights[i])  # the weights' is last
            work.extend((i, "bw", o, d, seen, bw) for o, d in kept)
            measured = cnn.conv_ms(cnn_kernels.is_depthwise(g, c_in, dims[2]), convs) \
                if cnn else None
            if measured:  # the forward's and those kept
                found.measured.update(zip(range(len(work) - 1 - len(kept), len(work)), measured))
            else:
                found.unmeasured += 1
                found.odd_convs += (c[_C["kernel_h"]], c[_C["kernel_w"]], c[_C["stride_h"]],
                                    g) != (3, 3, 1, 1)
        elif op in ("bmm", "linear"):  # a linear layer's data and weight gradients
            both = backward_gemms(op, dims)
            if op == "linear":
                both = [g for g, on in zip(both, (grads.data[i], grads.weights[i])) if on]
            work.extend((i, "bw", o, d, seen, factor) for o, d in both if grads.runs[i])
        elif grads.runs[i]:  # the forward again, times its kind's measured backward / forward
            bn = cnn.bn_ms(dims) if cnn and name == "BatchNormalization" else None
            work.append((i, "bw", op, dims, seen,
                         bw * (1.0 if bn else model.ratios.get(_ratio_kind(kind), 1.0))))
            if bn:
                found.measured.update({len(work) - 2: bn[0], len(work) - 1: bn[1]})
        elif cnn and name == "BatchNormalization" and (bn := cnn.bn_ms(dims)):
            found.measured[len(work) - 1] = bn[0]  # its forward alone
        work.extend(_accumulated(i, int(load[_L["params"]]) - weight, grads, at))
    return found


def _on_machines(order: list[float], hosts: tuple[float, float] | None) -> str:
    """The step (`order`: its kernels as they run) behind the fastest and the slowest host of
    the machines measured (`StepModel.host_range`), said; "" where they are not known."""
    if not hosts:
        return ""
    fast, slow = (number(launch_bound(order, h)) for h in hosts)
    return (f"; the machines we measured issue kernels at {1e3 * hosts[0]:.0f}-"
            f"{1e3 * hosts[1]:.0f} us: one GPU's step {fast}-{slow} ms on them")


def _accumulated(i: int, n: int, grads: autograd.Backward, at: dict) -> list[Kernel]:
    """The gradient accumulation of `n` of node `i`'s parameters, if they train."""
    return [(i, "bw", "add", (1, n), at["fp32"], 1.0)] if n > 0 and grads.weights[i] else []


def _in_order(work: list[Kernel], ms: np.ndarray, recompute: Collection[int], nodes: int
              ) -> tuple[list[float], np.ndarray, dict[str, float]]:
    """(the kernels' times as they run: the forward in node order, then the backward in
    reverse, a recomputed node's forward kernels just before its backward ones; `[nodes]` ms
    per node; ms per phase)."""
    n = len(work)
    node = np.fromiter((w[0] for w in work), np.int64, n)
    fw = np.fromiter((w[1] == "fw" for w in work), bool, n)
    t = np.asarray(ms, np.float64) * np.fromiter((w[5] for w in work), np.float64, n)
    again = np.flatnonzero(fw & np.isin(node, list(recompute))) if recompute else \
        np.zeros(0, np.int64)
    forward = np.flatnonzero(fw)
    forward = forward[np.argsort(node[forward], kind="stable")]
    back = np.concatenate([np.flatnonzero(~fw), again])  # a rerun forward before its backward
    rank = np.lexsort((np.arange(len(back)), np.arange(len(back)) < n - len(forward),
                       -node[back]))  # by node, last first; reruns first; then as listed
    order = np.concatenate([t[forward], t[back[rank]]]).tolist()
    per_op = np.bincount(node, weights=t, minlength=nodes) + np.bincount(
        node[again], weights=t[again], minlength=nodes)  # a node's, run twice
    phases = dict(forward=float(t[fw].sum()), backward=float(t[~fw].sum()), update=0.0)
    if len(again):
        phases["recomputation"] = float(t[again].sum())
    return order, per_op, phases


def _ratio_kind(kind: str) -> str:
    """The traced node kind whose measured backward / forward ratio an operator takes."""
    return kind if kind in ("softmax", "ln", "dropout", "embedding") else "elementwise"
