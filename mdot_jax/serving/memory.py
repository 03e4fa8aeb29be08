"""The peak memory of a training step, estimated from the operator sequence: whether the step
fits on the device at all, before its time means anything.

What a step holds: the parameters, their gradients and the optimizer's state (`param_bytes`:
fp32, also under AMP, which keeps fp32 master weights; `OPTIMIZER_STATE` tensors the size of
the parameters; Megatron-LM's half-type model beside its fp32 master weights), the input
batch, and the activations autograd keeps for the backward pass: an
operator's output where its own backward needs it (Relu, Sigmoid, Softmax, ...) or where a
consumer's backward needs its input (Conv, MatMul, normalisations, Mul, GELU, pooling, ...),
each once, at the precision's width (half under AMP); an output only added, reshaped or
concatenated onward is freed, and views write nothing. Frozen parameters (`mdot_jax.autograd`)
hold no gradient or optimizer state, and an operator keeps an input only for a gradient that
reads it. On a GPU a wide loss keeps more than its input (`loss_bytes`: cross-entropy's fp32
log-softmax and gradient), and under PyTorch's autocast autograd keeps the half copy of every
weight (2 bytes a parameter) (docs/studies/llm-step-memory.md, cause 3).

A step compiled with torch.compile keeps at most each fusion group's inputs from outside it
(`gpu.compiled.kept_bytes`). On a GPU the estimate is the sum of all of these plus a working
set (the backward's transient gradients: the two largest operator outputs, none inside a fused
attention): the caching allocator's and the libraries' workspaces are not modelled apart.

On a CPU it also counts the copies eager PyTorch makes of a permuted view that a saving
consumer needs contiguous (a LayerNorm over a permuted tensor, a batched MatMul of permuted
heads), and follows the step in time (`live_bytes`): the forward (kept activations pile up,
the others are freed after their last consumer), the backward (kept activations freed after
the backward of the earliest operator keeping them, activation gradients live from their
first consumer's backward to their producer's, parameter gradients accumulating; the
optimizer zeroes gradients to None before the next forward) and the optimizer's update (the
gradients, and for a stateful optimizer one temporary the size of the parameters, as
PyTorch's multi-tensor SGD with Nesterov momentum and Adam(W) make). The largest of the three
is the live peak; the resident set is `CPU_FIXED + CPU_RETENTION` times it: the C allocator
keeps freed blocks and the kernel libraries hold working memory of their own (two constants
fitted on the development models of `docs/studies/cpu-step-memory-liveness.md`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from converters import OperatorSequence
from converters.attention import causal_mask
from converters.fusion import VIEWS
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from converters.traits import LOSSES, keeping
from mdot_jax import autograd
from mdot_jax.options import AUTOCAST, HALF
from mdot_jax.readable import number, percent

# fp32 tensors of optimizer state per parameter tensor: SGD with momentum (what `mdot profile`
# and timm's benchmark train with) keeps one, Adam and AdamW two, plain SGD none; bitsandbytes'
# AdamW8bit two of one byte, each with an fp32 scale a block of 256 (its blockwise default;
# tensors under 4,096 elements keep fp32 state, not counted)
OPTIMIZER_STATE = {"sgd": 1, "sgd-plain": 0, "momentum": 1, "adam": 2, "adamw": 2,
                   "muon": 2,  # muon: AdamW's, less one for each matrix it takes (`gpu.muon`)
                   "adamw-8bit": 2 * (1 + 4 / 256) / 4}


def held_optimizer(optimizer: str, step: str | None) -> str:
    """The optimizer whose state a `step` holds: none where the step has no update
    (`fwd-bwd`: forward and backward alone)."""
    return optimizer if step in (None, "train") else "sgd-plain"

_WRITTEN = LOAD_FIELDS.index("bytes_written")
_PARAMS = LOAD_FIELDS.index("params")
_CFG = {name: i for i, name in enumerate(CONFIG_FIELDS)}
# the resident set of a CPU step: fixed bytes + this times the live peak (module docstring)
CPU_FIXED = 29e6
CPU_RETENTION = 1.19
# whose backward needs the operator's input, or its output (PyTorch's derivatives)
NEEDS_INPUT, NEEDS_OUTPUT = keeping("input"), keeping("output")


@dataclass(frozen=True)
class ParamBytes:
    """Bytes a parameter costs each GPU that holds it, by what holds them."""

    model: float  # the weights the passes read
    master: float  # fp32 master weights beside a half-type model (the optimizer's)
    gradients: float
    optimizer: float  # the optimizer's state

    @property
    def total(self) -> float:
        return self.model + self.master + self.gradients + self.optimizer

    def sharded(self, strategy: str, trained: float = 1.0, model: float | None = None
                ) -> float:
        """Of `total`, the bytes ZeRO's stage `strategy` (`options.STRATEGIES`) shards over
        the replicas (`hsdp`: a node's): the optimizer's (state and master weights;
        Megatron-LM's distributed optimizer), `zero2` the gradients too, `fsdp` and `hsdp` the
        weights too; `ddp` none. `trained`: the share of the parameters trained (a frozen one
        has no gradient or state); `model`: a weight's bytes where frozen ones are held
        otherwise (default `self.model`)."""
        zero1 = (self.optimizer + self.master) * trained
        zero2 = zero1 + self.gradients * trained
        return {"ddp": 0.0, "zero1": zero1, "zero2": zero2}.get(
            strategy, zero2 + (self.model if model is None else model))


def param_bytes(precision: str = "fp32", optimizer: str = "sgd",
                framework: str = "pytorch") -> ParamBytes:
    """What a parameter costs when training at `precision` with `optimizer` under `framework`
    (`options.FRAMEWORKS`): eager PyTorch keeps fp32 weights and gradients, also under
    autocast; Megatron-LM at amp-* a model in the half type beside fp32 master weights, its
    gradients in fp32 at bf16 and fp8 (`main_grad`, accumulated and reduced in fp32) and in
    the half type at fp16 (18 and 16 bytes a parameter with Adam: the distributed optimizer's
    guide counts 20 at fp16, of which the fp32 copies of the gradients it makes for the update,
    freed before the next forward, are not there at a step's peak); at bf16 the whole model in
    bfloat16, torch.optim's state in its parameters' type (8 bytes a parameter with Adam)."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer {optimizer!r}: choose from {sorted(OPTIMIZER_STATE)}")
    state = 4.0 * OPTIMIZER_STATE[optimizer]
    if framework == "megatron" and precision in AUTOCAST:
        return ParamBytes(2.0, 4.0, 2.0 if precision == "amp-fp16" else 4.0, state)
    if precision == "bf16":  # bitsandbytes' 8-bit states are a byte whatever the weights
        return ParamBytes(2.0, 0.0, 2.0, state if optimizer == "adamw-8bit" else state / 2)
    return ParamBytes(4.0, 0.0, 4.0, state)


# what holds a step's memory, as a prediction says it: the weights, gradients and optimizer
# state (and DDP's gradient buckets); what the forward keeps for the backward, the batch with
# it; temporaries (the largest outputs in flight, weights gathered or unsharded a piece at once)
MEMORY_PARTS = ("model_states", "activations", "working")
MEMORY_SAID = {"model_states": "weights, gradients and optimizer state",  # in words
               "activations": "activations kept for the backward", "working": "working"}


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one training step, by what holds them."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    inputs: float
    working: float = 0.0
    peak: str = ""  # the moment they are counted at, where the step's live bytes are followed

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer + self.activations
                + self.inputs + self.working)

    def parts(self) -> dict[str, float]:
        """GB by `Prediction.memory_parts`' parts (`MEMORY_PARTS`), summing to the total's."""
        return dict(zip(MEMORY_PARTS, (
            (self.parameters + self.gradients + self.optimizer) / 1e9,
            (self.activations + self.inputs) / 1e9, self.working / 1e9)))

    def to_json(self) -> dict:
        return dict(parameters=self.parameters, gradients=self.gradients,
                    optimizer=self.optimizer, activations=self.activations, inputs=self.inputs,
                    working=self.working, total=self.total)


def step_memory(seq: OperatorSequence, precision: str = "fp32", optimizer: str = "sgd",
                cpu: bool = False, fused: Sequence = (), framework: str = "pytorch"
                ) -> StepMemory:
    """The estimate for `seq` (at its batch size) trained at `precision` with `optimizer`
    under `framework`, on a CPU (at the step's live peak, `live_bytes`) or a GPU (the sum
    form). `fused`: attention blocks (`converters.attention`) run as fused kernels, which keep
    their inputs, output and one fp32 log-sum-exp per query row instead of the S x S tensors
    between and the causal mask an export builds (`attention.causal_mask`; but for an
    additive mask a block is given: `gpu.fused.mask_bytes`). Frozen
    parameters (`autograd`) hold no gradient or optimizer state, and nothing before the first
    trained one keeps an activation."""
    held = param_bytes(precision, optimizer, framework)
    weights, trained = 4.0 * seq.params, autograd.trainable(seq)
    scale = activation_scale(precision)
    inputs = float(sum(4.0 * np.prod(s) for s in seq.meta.get("inputs", {}).values()))
    state = held.optimizer * trained
    if optimizer == "muon":  # a momentum buffer a matrix parameter, not AdamW's two
        from mdot_jax.gpu.muon import matrices

        state -= held.optimizer / 2 * sum(a * b for a, b in matrices(seq))
    grads = autograd.backward(seq)
    if cpu:
        live = live_bytes(seq, scale, optimizer, grads)
        total = weights + state + inputs + live.total
        return dataclasses.replace(live, parameters=weights, optimizer=state, inputs=inputs,
                                   working=live.working + CPU_FIXED
                                   + (CPU_RETENTION - 1) * total)
    outputs = np.array(seq.load[:, _WRITTEN], np.float64)
    for b in fused:  # a fused kernel's S x S tensors exist in no pass, nor its causal mask
        outputs[[*b.inner, *causal_mask(seq, b)]] = 0.0
    working = scale * float(np.sort(outputs)[-2:].sum())
    kept = saved(seq, fused, scale, grads, framework)
    return StepMemory(autograd.held_bytes(seq, held.model) + held.master * trained,
                      held.gradients * trained, state, float(kept.sum())
                      + loss_bytes(seq, kept, precision)
                      + autocast_copies(seq, precision, framework), inputs, working)


def autocast_copies(seq: OperatorSequence, precision: str, framework: str = "pytorch",
                    rerun: np.ndarray | None = None) -> float:
    """Bytes of autocast's half copies of the weights at the step's peak
    (`gpu.autocast.copied_weights`: a trained weight's, cached through the forward; a frozen
    fp32 one's where autograd keeps it, in no node `rerun` by full checkpointing) under
    PyTorch's AMP; Megatron-LM's half model is its own, and FSDP's mixed precision gathers
    half-type weights a unit at a time instead (`gpu.parallel`)."""
    if precision not in AUTOCAST or framework != "pytorch":
        return 0.0
    from mdot_jax.gpu.autocast import copied_weights  # (the GPU package reads this module)

    return 2.0 * copied_weights(seq, precision, autograd.backward(seq), rerun)


def loss_bytes(seq: OperatorSequence, kept: np.ndarray, precision: str = "fp32") -> float:
    """What a wide loss keeps beyond `kept` (`[N]` bytes `saved` counts): PyTorch's
    cross-entropy, in fp32 under autocast too, keeps the log-softmax of its scores and makes
    their gradient, `LOSS_BYTES` a score (half that where the whole model is bf16), in place of
    what is counted of its input."""
    losses, scores = loss_scores(seq)
    if not len(losses) or not len(seq.edges):
        return 0.0
    src, dst = seq.edges[:, 0], seq.edges[:, 1]
    counted = sum(float(kept[src[dst == i]].sum()) for i in losses)
    each = LOSS_BYTES / 2 if precision == "bf16" else LOSS_BYTES
    return max(each * float(scores.sum()) - counted, 0.0)


def loss_scores(seq: OperatorSequence) -> tuple[np.ndarray, np.ndarray]:
    """(the nodes of `seq`'s losses, `[L]` the scores each reads)."""
    losses = np.flatnonzero(np.isin(seq.op_names, sorted(LOSSES)))
    return losses, seq.config[losses, _CFG["in_numel"]].astype(np.float64)


def activation_scale(precision: str) -> float:
    """What a sequence's bytes (fp32's: `model_source.at_fp32_width`) are multiplied by for the
    activations a step at `precision` keeps: half under autocast and in bf16."""
    return 0.5 if precision in HALF else 1.0


def saved(seq: OperatorSequence, fused: Sequence = (), scale: float = 1.0,
          grads: autograd.Backward | None = None, framework: str = "pytorch") -> np.ndarray:
    """`[N]` bytes of each operator's output that autograd keeps for the backward pass, at
    `scale` times fp32; a fused attention block's in place of its output (module docstring of
    `step_memory`), a fused kernel's (`gpu.compiled`, `gpu.megatron_fusions` under
    `framework`) its inputs'. `grads`: the backward autograd runs (default:
    `autograd.backward`'s)."""
    names = seq.op_names
    grads = grads or autograd.backward(seq)
    kept = np.isin(names, list(NEEDS_OUTPUT)) & grads.runs
    if len(seq.edges):
        src, dst = seq.edges[:, 0], seq.edges[:, 1]
        kept[src[np.isin(names[dst], list(NEEDS_INPUT)) & autograd.keeps(seq, grads, src,
                                                                         dst)]] = True
    out = np.where(kept, scale * np.asarray(seq.load[:, _WRITTEN], np.float64), 0.0)
    # imported here: the GPU package reads this module
    from mdot_jax.gpu import compiled, megatron_fusions, recurrent
    from mdot_jax.gpu.fused import mask_bytes

    for i in np.flatnonzero(np.isin(names, list(recurrent.GATES)) & grads.runs):
        out[i] += scale * recurrent.kept_bytes(str(names[i]), seq.config[i])  # every step's

    for b in fused:
        out[list(b.inner)] = 0.0
        c = seq.config[b.scores]
        out[b.output] += 4.0 * float(c[_CFG["mm_batch"]] * c[_CFG["mm_m"]])  # log-sum-exp
        out[b.output] += scale * mask_bytes(seq, b)  # an additive mask, if given one

    if groups := megatron_fusions.fusing(seq, fused, framework):
        return megatron_fusions.kept_bytes(seq, out, scale, groups)
    return compiled.kept_bytes(out, scale, compiled.fusing(seq, fused))


def live_bytes(seq: OperatorSequence, scale: float = 1.0, optimizer: str = "sgd",
               grads: autograd.Backward | None = None) -> StepMemory:
    """The largest of the forward's, the backward's and the update's live bytes besides the
    parameters, optimizer state and inputs (module docstring): activations and gradients at
    that moment; `working` the update's temporary. Activations at `scale` times fp32; `grads`:
    the backward autograd runs (default: every operator's, every parameter trained)."""
    n = seq.num_ops
    names = seq.op_names
    grads = grads or autograd.backward(seq)
    src, dst = (seq.edges[:, 0], seq.edges[:, 1]) if len(seq.edges) else (np.zeros(0, int),) * 2
    view = np.isin(names, list(VIEWS))
    saver = np.isin(names[dst], list(NEEDS_INPUT)) & autograd.keeps(seq, grads, src, dst)
    out = scale * np.asarray(seq.load[:, _WRITTEN], np.float64)  # [n]
    base = np.arange(n)  # whose storage each output is (a view's: its input's)
    copy = np.asarray([names[i] == "Transpose" and not _swaps_last_two(seq, i)
                       for i in range(n)], bool)  # a permuted view: not contiguous
    for s, d in sorted(zip(src, dst), key=lambda e: e[1]):
        if view[d]:
            base[d] = base[s]
            copy[d] |= copy[s]
    copy &= np.bincount(src[saver], minlength=n) > 0  # ... that a saving consumer needs
    out[copy] = scale * (seq.config[copy, _CFG["out_numel"]].astype(np.float64)
                         * seq.config[copy, _CFG["elem_bytes"]])
    last = np.arange(n)  # the forward's last use of each storage = its gradient's first use
    np.maximum.at(last, base[src], dst)
    release = np.full(n, n)  # the earliest operator whose backward needs it; n: none
    keep_input = saver & (~view[src] | copy[src])
    np.minimum.at(release, np.where(copy[src], src, base[src])[keep_input], dst[keep_input])
    own = np.isin(names, list(NEEDS_OUTPUT)) & ~view & grads.runs
    release[own] = np.minimum(release[own], np.arange(n)[own])
    kept = release < n
    # forward: every output from its operator on; the unkept freed after their last use
    freed = np.bincount(np.minimum(last[~kept] + 1, n), out[~kept], n + 1)[:n]
    forward = np.cumsum(out - freed)  # [n] live after operator t
    # backward, operator t's: kept activations not yet released, activation gradients between
    # their first consumer and their producer, parameter gradients of operators t and later
    kept_alive = np.cumsum(np.bincount(release[kept], out[kept], n))
    grad = np.where(view | ~grads.runs, 0.0, out)
    live_grad = np.cumsum(np.bincount(np.arange(n), grad, n + 1)
                          - np.bincount(np.maximum(last, np.arange(n)) + 1, grad, n + 1))[:n]
    param_grads = np.cumsum(4.0 * np.where(grads.weights, seq.load[:, _PARAMS], 0.0)[::-1])[::-1]
    backward = kept_alive + live_grad + param_grads
    weights = 4.0 * autograd.trainable(seq)  # the gradients the update reads
    update = weights * (1 + (OPTIMIZER_STATE[optimizer] > 0))  # gradients + one temporary
    t = int(np.argmax(backward)) if n else 0
    phases = [StepMemory(0, 0, 0, float(forward.max(initial=0)), 0, peak="the forward"),
              StepMemory(0, float(live_grad[t] + param_grads[t]) if n else 0, 0,
                         float(kept_alive[t]) if n else 0, 0, peak="the backward"),
              StepMemory(0, weights, 0, 0, 0, update - weights, peak="the update")]
    return max(phases, key=lambda m: m.total)


def _swaps_last_two(seq: OperatorSequence, i: int) -> bool:
    """Whether Transpose `i` only swaps its last two axes (by its shapes, up to rank 4): a
    batched MatMul takes that without a copy."""
    c = seq.config[i]
    rank = int(c[_CFG["in_rank"]])
    if not 2 <= rank <= 4 or int(c[_CFG["out_rank"]]) != rank:
        return False
    din = [c[_CFG[f"in_d{k}"]] for k in range(rank)]
    dout = [c[_CFG[f"out_d{k}"]] for k in range(rank)]
    return din[:-2] == dout[:-2] and din[-2:] == dout[:-3:-1]


def machine_memory() -> float | None:
    """This machine's RAM, bytes (None where the system does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


NO_FIT = 2.0  # estimated memory over the device's by this factor: the step will not fit
LOSS_BYTES = 8.0  # a score: cross-entropy's fp32 log-softmax, kept, and its fp32 gradient
LOSS_SAID = 0.05  # of the estimate: what the loss may add beyond it is said from this share


def loss_note(seq: OperatorSequence, memory_gb: float, tp: int = 1) -> str | None:
    """What a pipeline's or tensor-parallel estimate leaves out of a wide loss (a language
    model's vocabulary; `step_memory` counts it, `loss_bytes`): PyTorch's
    cross-entropy keeps the fp32 log-softmax of the scores and makes their fp32 gradient, not
    counted beside the scores themselves (a GPU's share of them under `tp`-way tensor
    parallelism: the vocabulary-parallel loss); said where it may add `LOSS_SAID` of the
    estimate."""
    each = loss_scores(seq)[1]
    scores = float(np.where(each % tp == 0, each / tp, each).sum())
    extra = LOSS_BYTES * scores / 1e9
    if extra < LOSS_SAID * memory_gb:
        return None
    return (f"memory: the loss's fp32 log-softmax and gradient over its {number(scores)} "
            f"scores (up to {number(extra)} GB more) are not in the {number(memory_gb)} GB "
            "estimated")


def check_fit(p, limit_gb: float | None, what: str) -> None:
    """The one memory-fit rule, applied in place to the prediction `p` of a step estimated at
    `p.memory_gb` on `what` holding `limit_gb`: within `prediction.TIGHT` of it, a warning
    that it is tight; over it, a warning that the step may not fit; over `NO_FIT` times it,
    that it will not, and no band. Every timm RTX 3090 run (each of which fitted its 24 GB) is
    estimated below 1.7 times it."""
    need = p.memory_gb
    p.memory_limit_gb = limit_gb or None
    if limit_gb and p.tight:
        p.warnings.append(f"the step needs about {number(need)} GB, {percent(need / limit_gb)} "
                          f"of {what} ({number(limit_gb)} GB): tight; estimates of measured "
                          "peaks err by up to a fifth, so it may not fit")
    if not limit_gb or p.fits:
        return
    surely = need > NO_FIT * limit_gb
    p.warnings.append(f"the step needs about {number(need)} GB (parameters, gradients, optimizer "
                      f"state, activations), more than {what} ({number(limit_gb)} GB): it "
                      f"{'will' if surely else 'may'} not fit at this batch size")
    if surely:
        p.interval_ms = None
