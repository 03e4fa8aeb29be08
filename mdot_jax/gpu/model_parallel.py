"""Tensor and pipeline parallelism of a transformer, as Megatron-LM runs them, priced from one
GPU's step on its spec sheet (`spec_sheet.price`).

Tensor parallel over T GPUs (`shard`, the sequence one GPU runs): every weight GEMM split T ways
(column-parallel by its output features, row-parallel by its input features: whichever is not the
model's width; the vocabulary-parallel head by its vocabulary), the attention heads and everything
between a column- and a row-parallel GEMM (scores, softmax, the MLP's activations, the logits and
the loss over them) T ways; the residual stream (tensors as wide as the model: norms, residual
adds, dropout on it) replicated, or cut T ways along the sequence with sequence parallelism. A
layer all-reduces its residual stream ([tokens, width]; a vision-language model's encoder layers'
[patches, theirs], `converters.attention.residuals`) once a sublayer in the forward and once in the
backward (`sublayers`: attention and MLP, twice in a transformer's layer; once in a layer of one
mixer, Nemotron-H's; with sequence parallelism an all-gather and a reduce-scatter each: the same
bytes), and once each the vocabulary-parallel embedding's output in the forward (first stage) and
the head's input gradient in the backward (last stage); nothing hides them. T must divide the heads
and the key-value heads (grouped-query attention, `heads`), and a Mamba-2 mixer's heads and groups
of B and C (`state_space` in the sequence's metadata), as Megatron-LM asserts.

Pipeline parallel over P stages (`pipeline`): the L layers (attention blocks) cut into P x V
chunks of L / (P V) consecutive layers (V = 1, or the virtual stages of the interleaved
schedule; where P V does not divide L, chunk c starts at layer floor(c L / (P V)), as uneven
splits give chunks one layer more or less), each chunk starting at its first layer's attention
scores; stage s runs chunks s, s + P, ...; the embedding goes with the first stage, the head
and the loss with the last. An iteration runs the accumulation's m micro-batches; with stages
taking t_s a micro-batch (forward, backward, recomputation, their tensor-parallel all-reduces,
and sending activations forward and gradients back, 1/T of them per GPU as Megatron's
scatter-gather does), 1F1B and GPipe take sum_s t_s + (m - 1) max t, the interleaved schedule m
max t + (sum t - max t) / V; beyond m max t is the bubble. A weight two stages hold (a tied
embedding and head) has its fp32 gradient all-reduced between them once an iteration, after the
flush (Megatron-LM's embedding group). Memory is the fullest stage's: its share of the
parameters, gradients and optimizer state, and the activations of the micro-batches in flight
(1F1B: min(P - s, m) on stage s; GPipe: m; interleaved: min(P, m) (1 + (P - 1) / (P V)) on the
first), with full checkpointing the layers' inputs of those and one layer's whole (what lies
outside the layers, the embedding's, the head's and the loss's, as without).

Context parallel over C GPUs (ring attention, as Megatron-LM's context parallelism runs it):
each sequence of S tokens cut into C pieces of S / C, each GPU running every operator over its
own piece (the model converted at S / C tokens), its attention over all S keys (`whole_keys`:
the scores' and the softmax's rows S long), the causal work balanced over the GPUs; the keys
and values of each piece passed round the ring, C - 1 sends a layer in the forward and twice
that in the backward (with the gradients of keys and values; once more for a recomputed
forward), each layer's hidden behind its attention's compute (`context_exchange`). The
gradients are reduced over the data-parallel and context-parallel GPUs together.

Data parallelism is what is left (`parallel.data_parallel`, over the fullest stage's
parameters), its gradients reduced after the backward as Megatron-LM does. Megatron's rank
order places the T GPUs of a tensor-parallel group next to each other, then the
context-parallel ones, then the data-parallel replicas, then the stages.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence

import numpy as np

from converters.attention import Block, in_layers, layer_ids, layer_starts, residuals, sublayers
from converters.dims import converted_batch
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS, OperatorSequence
from converters.traits import LOSSES
from mdot_jax import autograd
from mdot_jax.errors import RequestError
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.classify import classes_field, classified
from mdot_jax.gpu.parallel import LATENCY_US, Link, allreduce_ms, group_link, updating
from mdot_jax.serving.memory import HALF, activation_scale, param_bytes, saved, step_memory
from mdot_jax.serving.prediction import Prediction

_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_L = {name: i for i, name in enumerate(LOAD_FIELDS)}
_ALL_LOAD = [_L[f] for f in ("fwd_flops", "bwd_flops", "bytes_read", "bytes_written", "params")]
_KV_HOPS = 32  # operators between a projection and the scores (views, rotary, repeat_kv)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a job's GPUs split the model: T-way tensor parallel, P pipeline stages of V chunks
    each under `schedule`, the data-parallel replicas what is left of `gpus`."""

    gpus: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    sequence_parallel: bool = False

    @property
    def replicas(self) -> int:  # data-parallel
        return self.gpus // (self.tp * self.pp)


def width(seq: OperatorSequence) -> int:
    """The model's width: the most common inner dimension of its weight GEMMs."""
    ks = KEPT.get(("linear ks", seq), lambda: [int(c[_C["mm_k"]]) for c, (_, op, _) in zip(
        seq.config, classified(seq)) if op == "linear"])
    if not ks:
        raise RequestError("tp: the model has no weight GEMMs to split", "tp")
    values, counts = np.unique(ks, return_counts=True)
    return int(values[np.argmax(counts)])


def heads(seq: OperatorSequence, block: Block) -> tuple[int, int, int]:
    """A block's attention heads, key-value heads and head size. The key-value heads from
    the width of the projections its scores read (walking back through views, rotary and
    scaling to the first weight GEMM on each side): the narrowest is the keys' (grouped-query
    attention: fewer than the heads); one fused projection of queries, keys and values is as
    wide as heads + 2 x key-value heads. Where the graph says nothing clearer, as many as the
    heads."""
    c = seq.config[block.scores]
    n_heads, size = int(c[_C["mm_batch"]]) // converted_batch(seq), int(c[_C["mm_k"]])
    preds, _ = seq.neighbours()
    widths, todo, seen = [], [(j, 0) for j in preds.get(block.scores, [])], set()
    kinds = classified(seq)
    while todo:
        i, hops = todo.pop()
        if i in seen or hops > _KV_HOPS:
            continue
        seen.add(i)
        if kinds[i][1] == "linear":
            widths.append(int(seq.config[i, _C["mm_n"]]))
        else:
            todo += [(j, hops + 1) for j in preds.get(i, [])]
    kv = min(widths, default=0) // size if size else 0
    if kv > n_heads and (kv - n_heads) % 2 == 0:  # one fused projection
        kv = (kv - n_heads) // 2
    return n_heads, kv if 0 < kv <= n_heads and n_heads % kv == 0 else n_heads, size


def tokens_of(seq: OperatorSequence, blocks: Sequence[Block]) -> int:
    """Tokens of the batch: the elements of the rank-2 integer input ([batch, sequence]); a
    model without one (a ViT) the batch times the positions its attention runs over."""
    kind, shape = seq.kind_input
    if kind == "tokens":
        return int(np.prod(shape))
    positions = int(seq.config[blocks[0].scores][_C["mm_m"]]) if blocks else 1
    return converted_batch(seq) * positions


def layer_input(seq: OperatorSequence, blocks: Sequence[Block]) -> float:
    """Elements of a layer's input (what a checkpointed layer keeps), on average: its
    self-attention's output (a layer's blocks together where the exporter's scopes say which
    layer holds them: Qwen-VL's encoder attends a window a block), or a model without
    attention blocks [tokens, width]."""
    own = [b.output for b in blocks if not b.cross]
    if not own:
        return float(tokens_of(seq, blocks) * width(seq))
    sizes, ids = seq.config[own, _C["out_numel"]], layer_ids(seq, list(blocks))[own]
    if (ids < 0).any():  # no scope says
        return float(sizes.mean())
    return float(np.bincount(ids, sizes)[np.unique(ids)].mean())


def checkpointed(seq: OperatorSequence, blocks: list[Block]) -> tuple[np.ndarray, list[int]]:
    """`[N] bool` the operators full checkpointing runs again, and the first operator of each
    layer it checkpoints: the layers' (`converters.attention.in_layers`, not the embedding,
    final norm, head or loss), but for a layer autograd runs no backward through (its
    parameters and all before them frozen: nothing recorded to run again, no input kept)."""
    inside, first = in_layers(seq, blocks), layer_starts(seq, blocks)
    layer = layer_ids(seq, blocks)
    idle = autograd.without_backward(seq, layer)
    if not len(idle):
        return inside, first
    out = np.isin(layer, idle)
    return inside & ~out, [i for i in first if not out[i]]


def full_checkpoint_bytes(seq: OperatorSequence, blocks: list[Block], each: np.ndarray,
                          scale: float, stage: np.ndarray, pp: int
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Under full checkpointing, `[pp]` bytes a micro-batch keeps through the forward on each
    stage (`stage`: `[N]` an operator's) of `each` (`[N]` bytes kept of each operator's output
    without): a layer's input for each layer checkpointed, and what lies outside them (the
    embedding's, the head's, the loss's) as without; `[pp]` what one layer run again holds
    beside them (its activations but its input, which is the one kept); `[pp]` the layers
    checkpointed."""
    rerun, first = checkpointed(seq, blocks)
    layers = np.bincount(stage[first], minlength=pp)
    boundary = 4.0 * scale * layer_input(seq, blocks)
    kept = np.bincount(stage, each, pp)
    inside = np.bincount(stage, np.where(rerun, each, 0.0), pp)
    return layers * boundary + kept - inside, np.maximum(
        inside / np.maximum(layers, 1) - boundary, 0.0), layers


def check(seq: OperatorSequence, blocks: list[Block], layout: Layout, micro_batches: int,
          cp: int = 1) -> None:
    """The one-line errors of a layout the model cannot take."""
    tp, pp, v = layout.tp, layout.pp, layout.virtual
    if cp > 1 and not blocks:
        raise RequestError("cp: the model has no attention blocks to run over a cut sequence", "cp")
    if (pp > 1 or cp > 1) and (cross := sum(b.cross for b in blocks)):
        flag = "pp" if pp > 1 else "cp"
        raise RequestError(f"{flag}: cross-attention ({cross} of its {len(blocks)} attention "
                           "blocks attend to an encoder's states: an encoder-decoder's, an image "
                           f"read by text) is priced with tp, ddp or fsdp, not "
                           f"{'pipeline' if pp > 1 else 'context'} parallel", flag)
    ssm = seq.meta.get("state_space")
    if tp > 1 and not blocks and not ssm:
        raise RequestError("tp: the model has no attention blocks or state space layers whose "
                           "heads to split", "tp")
    count = len(layer_starts(seq, blocks)) if pp > 1 else 0  # the layers a pipeline cuts
    if pp > 1 and not count:
        raise RequestError("pp: the model has no transformer layers (attention blocks) or "
                           "stack of layers to split", "pp")
    if tp > 1:
        # the last block's: a vision-language model's language model (its encoder's blocks
        # hold every image's patches in one row: no batch to read its heads from)
        n_heads, kv, _ = heads(seq, blocks[-1]) if blocks else (0, 0, 0)
        counts = [(n_heads, "attention heads"), (kv, "key-value heads (grouped-query attention)")]
        if ssm:
            counts += [(ssm["heads"], "state space heads"),
                       (ssm["groups"], "state space groups of B and C")]
        for n, name in counts:
            if n % tp:  # as Megatron-LM asserts
                raise RequestError(f"tp {tp}: does not divide the model's {n} {name}", "tp")
    if pp > 1 and count < pp * v:
        what = f"{pp} stages" + (f" x {v} virtual stages" if v > 1 else "")
        raise RequestError(f"pp {pp}: {what} are more than the model's {count} layers", "pp")
    if layout.schedule == "interleaved" and micro_batches % pp:
        raise RequestError(f"schedule 'interleaved': the micro-batches (grad_accum "
                           f"{micro_batches}) must be a multiple of pp {pp}", "schedule")


def shard(seq: OperatorSequence, tp: int, sequence_parallel: bool = False,
          blocks: Sequence[Block] = ()) -> OperatorSequence:
    """The operators one GPU of a `tp`-way tensor-parallel group runs (module docstring);
    `blocks`: its attention blocks (where no token ids say how many tokens a batch holds)."""
    if tp == 1:
        return seq
    return KEPT.get((sys.intern(f"shard {tp} {sequence_parallel}"), seq, *blocks),
                    lambda: _shard(seq, tp, sequence_parallel, blocks))


def _shard(seq: OperatorSequence, tp: int, sequence_parallel: bool,
           blocks: Sequence[Block]) -> OperatorSequence:
    d, tokens, heads = width(seq), tokens_of(seq, blocks), {i for b in blocks for i in b.inner}
    config, load = seq.config.copy(), seq.load.copy()
    for i, (name, c, ld, (_, op, _)) in enumerate(zip(seq.op_names, seq.config, seq.load,
                                                      classified(seq))):
        n, rank, last = c[_C["out_numel"]], int(c[_C["out_rank"]]), int(c[_C["out_d3"]])
        if op == "linear":
            column = int(c[_C["mm_n"]]) != d or int(c[_C["mm_k"]]) == d
            weight = float(c[_C["mm_k"]] * c[_C["mm_n"]] * c[_C["elem_bytes"]])
            load[i, _ALL_LOAD] /= tp
            if column:  # the input whole, the weight's columns and the output split
                config[i, [_C["mm_n"], _C["out_numel"], _C["out_d3"]]] /= tp
                load[i, _L["bytes_read"]] = ld[_L["bytes_read"]] - weight * (1 - 1 / tp)
            else:  # the input's features and the weight's rows split, partial sums whole
                config[i, [_C["mm_k"], _C["in_numel"], _C["in_d3"]]] /= tp
                load[i, _L["bytes_written"]] = ld[_L["bytes_written"]]
        elif name in LOSSES and c[_C["in_numel"]] % tp == 0:  # vocabulary-parallel: the
            load[i, _ALL_LOAD] /= tp  # scores' classes split
            config[i, [_C["in_numel"], _C[classes_field(c)]]] /= tp
        elif ld[_L["params"]] > 2 * d:  # a weight matrix (however it reaches its GEMM), or
            load[i, _L["params"]] /= tp  # the vocabulary-parallel embedding: its rows split
        elif op == "bmm" or ((last != d or i in heads) and n >= tokens * d / 64 and n % tp == 0):
            load[i, _ALL_LOAD] /= tp  # heads (S keys = d too), or features between split GEMMs
            config[i, [_C["out_numel"], _C["in_numel"]]] /= tp
            if op == "bmm":
                config[i, _C["mm_batch"]] /= tp
            elif rank <= 3 and last % tp == 0:
                config[i, _C["out_d3"]] /= tp
        elif sequence_parallel and last == d and rank >= 2 and n % tp == 0:
            load[i, _ALL_LOAD] /= tp  # the residual stream, cut along the sequence
            config[i, [_C["out_numel"], _C["in_numel"]]] /= tp
    params = seq.params * math.fsum(load[:, _L["params"]]) / max(seq.total("params"), 1.0)
    return dataclasses.replace(seq, config=config, load=load,
                               meta=dict(seq.meta, params=int(round(params)), tp=tp,
                                         **autograd.sharded(seq, load[:, _L["params"]])))


def whole_keys(seq: OperatorSequence, blocks: Sequence[Block], cp: int) -> OperatorSequence:
    """`seq` (converted at S / cp tokens a sequence) as one GPU of a `cp`-way context-parallel
    group runs it: each attention block's queries its own, its keys all S (module docstring):
    the scores' keys, the rows between them and the output, and the output's reduction cp
    times as long, their work with them."""
    if cp == 1:
        return seq
    config, load = seq.config.copy(), seq.load.copy()
    work = [_L[f] for f in ("fwd_flops", "bwd_flops", "bytes_read", "bytes_written")]
    for b in blocks:
        for i in {*b.inner, b.output}:
            load[i, work] *= cp
            if i == b.output:  # P V: its inner dimension, the keys
                config[i, [_C["mm_k"], _C["in_numel"]]] *= cp
            else:  # the scores, mask, softmax, ...: rows of all the keys
                config[i, [_C["out_numel"], _C["out_d3"]]] *= cp
                config[i, _C["mm_n"] if i == b.scores else _C["in_numel"]] *= cp
    return dataclasses.replace(seq, config=config, load=load, meta=dict(seq.meta, cp=cp))


def context_exchange(p: Prediction, seq: OperatorSequence, blocks: Sequence[Block], cp: int,
                     tp: int, link: Link, act_bytes: int, passes: int) -> Prediction:
    """`p` (one micro-batch's step of the cut `seq`) with the exposed time of the ring's
    sends (module docstring): a layer's keys and values of the GPU's piece (its key-value
    heads, `heads`, 1 / tp of them on a GPU), (cp - 1) x (1 + 2 + recomputed forwards) sends
    of them over `link`, less that layer's attention time."""
    _, kv_heads, size = heads(seq, blocks[0])
    kv = 2.0 * tokens_of(seq, blocks) * kv_heads * size / tp * act_bytes
    sends = (cp - 1) * (passes + 1)  # forward, backward twice, a recomputed forward
    ring = sends * 1e3 * (kv / (link.gbs * 1e9) + link.latency_s)  # ms a layer
    by_node = p.node_ms(seq.num_ops)
    exposed = sum(max(0.0, ring - sum(by_node[i] for i in {*b.inner, b.output}))
                  for b in blocks)
    phases = dict(p.phases, communication=p.phases.get("communication", 0.0) + exposed)
    note = (f"context parallel over {cp} GPUs (ring attention): {sends} sends a layer of its "
            f"keys and values ({kv / 1e6:.3g} MB) over {link.name} ({link.gbs:g} GB/s), "
            f"{exposed:.3g} ms a micro-batch not hidden behind attention: not measured")
    return p.with_phases(phases, warnings=[*p.warnings, note])


def _experts(seq: OperatorSequence) -> np.ndarray:
    """`[N]` whether each operator is in a mixture's experts (their scope, as the exporter
    names nodes: `.../mlp/experts/MatMul`)."""
    return np.char.find(seq.node_names.astype(str), "/experts/") >= 0


def shard_experts(seq: OperatorSequence, ep: int) -> OperatorSequence:
    """The operators one GPU of an `ep`-way expert-parallel group runs: each GEMM of the
    experts over E / ep of them with ep times the rows (under balanced routing, what the ep
    GPUs send its experts), their weights split."""
    moe = seq.meta.get("experts")
    if ep == 1 or not moe:
        return seq
    if moe["experts"] % ep:
        raise RequestError(f"ep {ep}: does not divide the model's {moe['experts']} experts", "ep")
    config, load, kinds = seq.config.copy(), seq.load.copy(), classified(seq)
    for i in np.flatnonzero(_experts(seq)):
        c, ld = seq.config[i], seq.load[i]
        if kinds[i][1] == "bmm" and c[_C["mm_batch"]] % ep == 0:
            weights = float(c[_C["mm_batch"]] * c[_C["mm_k"]] * c[_C["mm_n"]] * c[_C["elem_bytes"]])
            config[i, _C["mm_batch"]] /= ep
            config[i, _C["mm_m"]] *= ep
            load[i, _L["bytes_read"]] = ld[_L["bytes_read"]] - weights * (1 - 1 / ep)
        load[i, _L["params"]] /= ep
    params = seq.params * math.fsum(load[:, _L["params"]]) / max(seq.total("params"), 1.0)
    return dataclasses.replace(seq, config=config, load=load,
                               meta=dict(seq.meta, params=int(round(params)), ep=ep,
                                         **autograd.sharded(seq, load[:, _L["params"]])))


def expert_params(seq: OperatorSequence) -> int:
    """Of `seq.params`, the experts'."""
    held = math.fsum(seq.load[_experts(seq), _L["params"]])
    return int(round(seq.params * held / max(seq.total("params"), 1.0)))


def _chunks(seq: OperatorSequence, first: list[int], layout: Layout) -> np.ndarray:
    """`[N]` the pipeline stage of every operator, the layers starting at `first` cut into
    chunks (module docstring)."""
    chunks = layout.pp * layout.virtual
    starts = [0] + [first[c * len(first) // chunks] for c in range(1, chunks)]
    chunk = np.searchsorted(np.asarray(starts), np.arange(seq.num_ops), side="right") - 1
    return chunk % layout.pp


def pipeline(one: Prediction, seq: OperatorSequence, blocks: list[Block], layout: Layout,
             gpu: GPU, micro_batches: int, precision: str, optimizer: str,
             checkpointing: str | None, network_gbs: float, interconnect: str | None,
             fused: list[Block], framework: str = "pytorch") -> tuple[Prediction, int]:
    """`one` (one GPU's step of one micro-batch of `seq`, sharded by `shard`, with its
    phases) as an iteration of `micro_batches` through the tensor- and pipeline-parallel
    `layout`, and the parameters of the fullest stage's GPU (for the data parallelism left).
    `framework`: what a parameter costs a GPU's memory (`memory.param_bytes`)."""
    tp, pp, v = layout.tp, layout.pp, layout.virtual
    first = layer_starts(seq, blocks)
    stage = _chunks(seq, first, layout) if pp > 1 else np.zeros(seq.num_ops, int)
    ms = one.node_ms(seq.num_ops)  # the update is on no node: it follows the stages' parameters
    share = np.bincount(stage, ms, pp) / max(ms.sum(), 1e-30)  # [pp] of the compute
    layers = np.bincount(stage[first], minlength=pp)  # [pp]
    bytes_ = 2.0 if precision in HALF else 4.0
    act = tokens_of(seq, blocks) * width(seq) * bytes_  # one [tokens, width] activation
    compute = {k: one.phases.get(k, 0.0) for k in ("forward", "backward", "recomputation")}
    compute["launch gaps"] = one.phases.get("launch gaps", 0.0) - (once := one.gaps("update"))
    passes = 2 + (checkpointing == "full")  # forward, backward, the forward again
    link = group_link(gpu, layout.gpus_per_node, layout.gpus // layout.gpus_per_node,
                      interconnect, network_gbs, tp, 1)
    whole = bytes_ * (tp if layout.sequence_parallel else 1)  # `shard` cut the stream so
    each = [k * allreduce_ms(n * whole or act, tp, link, 1)  # [layers] its sublayers' (0: no scope)
            for k, n in zip(sublayers(seq, first), residuals(seq, first))]
    edges = np.eye(pp)[0] + np.eye(pp)[-1]  # the embedding's forward, the head's backward
    tp_ms = np.bincount(stage[first], each, pp) * passes + edges * allreduce_ms(
        act, tp, link, 1) if tp > 1 else np.zeros(pp)
    p2p = _p2p_ms(act / tp, layout, gpu, network_gbs, interconnect) * 2 * v if pp > 1 else 0.0
    ring = share * one.phases.get("communication", 0.0)  # [pp] context parallelism's, exposed
    t = share * sum(compute.values()) + ring + tp_ms + p2p  # [pp] ms a micro-batch
    m, slow = micro_batches, int(np.argmax(t))
    fill = t.sum() - t[slow]
    iteration = m * t[slow] + (fill / v if layout.schedule == "interleaved" else fill)
    tied = _tied_ms(seq, layout, gpu, network_gbs, interconnect) if pp > 1 else 0.0
    held = param_bytes(precision, optimizer, framework)  # bytes a parameter
    every, trained, weights = _stage_params(seq, stage, pp, held.model)  # [pp] each
    state = weights + trained * (held.total - held.model)  # frozen: weights alone
    kept = _activation_bytes(seq, stage, blocks, layout, m, precision, checkpointing,
                             fused, framework)
    full = int(np.argmax(state + kept))  # the stage of most memory
    updates = float(trained[slow] / max(trained.sum(), 1.0))  # of those updated, the slowest's
    one = dataclasses.replace(one, operators=updating(one.operators, updates,
                                                      "the slowest stage's", gaps=True))
    phases = {k: float(m * share[slow] * c) for k, c in compute.items() if c}
    if once:  # the host's gaps of the update (the passes' in `compute`): the slowest stage's
        phases["launch gaps"] = phases.get("launch gaps", 0.0) + once * updates
    phases.update(**{"update": one.phases["update"] * updates} if "update" in one.phases else {},
                  communication=float(m * (ring[slow] + tp_ms[slow] + p2p) + tied))
    split, tail = [], []  # what the note says: a pipeline's parts only where there is one
    if tp > 1:
        split.append(f"{tp}-way tensor parallel" + (" with sequence parallelism" if
                                                     layout.sequence_parallel else ""))
        tail.append(f"tensor-parallel all-reduces {m * tp_ms[slow]:.3g} ms over {link.name}")
    if tied:
        tail.append(f"the gradients of the tied embedding's copies summed over the first "
                    f"and last stage {tied:.3g} ms")
    if pp > 1:
        phases["bubble"] = float(iteration - m * t[slow])
        split.append(f"{pp} pipeline stages ({layout.schedule}"
                     + (f", {v} virtual stages each" if v > 1 else "")
                     + f", {m} micro-batch{'es' if m > 1 else ''}): {int(layers[slow])} layers "
                     f"on the slowest stage, bubble {phases['bubble']:.3g} ms")
        if "update" in one.phases:  # the update's own note counts a tensor-parallel rank's
            tail.append(f"the update over the slowest stage's {int(trained[slow]):,} "
                        "parameters")
    note = ", ".join([" x ".join(split), *tail]) + " (Megatron-LM's rules; not measured)"
    working = step_memory(seq, precision, optimizer, fused=fused).working
    params = int(round(every[full]))
    few = [f"{m} micro-batch{'es' if m > 1 else ''} through {pp} pipeline stages: most of the "
           "iteration is the bubble (grad_accum sets the micro-batches; several times pp is "
           "usual)"] if 1 < pp and m < pp else []
    memory = dict(model_states=float(state[full]) / 1e9, activations=float(kept[full]) / 1e9,
                  working=working / 1e9)
    p = one.with_phases(phases, memory_gb=sum(memory.values()), memory_parts=memory,
                        grad_accum=m, warnings=[*one.warnings, note, *few])
    return dataclasses.replace(p, interval_ms=None), params  # the plan's parts: not measured


def _p2p_ms(nbytes: float, layout: Layout, gpu: GPU, network_gbs: float,
            interconnect: str | None) -> float:
    """One send of `nbytes` to the next stage, ms: over the node's links when a stage's
    tp x replicas GPUs leave room for the next in the node, else over the network, whose
    bandwidth every GPU of the node shares."""
    group = layout.tp * layout.replicas
    if group < layout.gpus_per_node:
        link = group_link(gpu, layout.gpus_per_node, 1, interconnect, network_gbs, 2, group)
        return 1e3 * (nbytes / (link.gbs * 1e9) + link.latency_s)
    net = Link("network", network_gbs / layout.gpus_per_node, LATENCY_US["network"] * 1e-6)
    return 1e3 * (nbytes / (net.gbs * 1e9) + net.latency_s)


def _tied_ms(seq: OperatorSequence, layout: Layout, gpu: GPU, network_gbs: float,
             interconnect: str | None) -> float:
    """The all-reduce, once an iteration after the flush, of the fp32 gradient of a weight two
    stages hold (a tied embedding: Megatron-LM's embedding group, the first and last stage's
    GPUs of one tensor-parallel rank and replica), ms; 0 where no weight is held twice."""
    shared = seq.total("params") - seq.params  # a weight's uses past its first
    if shared <= 0:
        return 0.0
    # the stages are outermost in the ranks: the two GPUs share a node only if all do, else
    # every GPU of the first stage's node reaches its peer over the node's network at once
    apart = 1 if layout.gpus <= layout.gpus_per_node else layout.gpus_per_node
    link = group_link(gpu, layout.gpus_per_node, layout.gpus // layout.gpus_per_node,
                      interconnect, network_gbs, 2, apart)
    return allreduce_ms(4.0 * shared, 2, link, 1)


def _stage_params(seq: OperatorSequence, stage: np.ndarray, pp: int, each: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`[pp]` parameters a stage's GPU holds, `[pp]` of them trained (not frozen), and `[pp]`
    bytes of their weights as held (`each` a trained one's; `autograd.weight_bytes`)."""
    # one stage holds a tied weight once; each of two stages that use it, a copy (Megatron)
    if pp == 1:
        return (np.asarray([seq.params], float), np.asarray([autograd.trainable(seq)], float),
                np.asarray([autograd.held_bytes(seq, each)]))
    every = seq.column("params")
    held = np.bincount(stage, every, pp).astype(float)
    return (held, np.bincount(stage, np.where(autograd.frozen_nodes(seq), 0.0, every), pp),
            np.bincount(stage, autograd.weight_bytes(seq, each), pp)
            if "frozen_weights" in seq.meta else held * each)


def _activation_bytes(seq: OperatorSequence, stage: np.ndarray, blocks: list[Block],
                      layout: Layout, m: int, precision: str, checkpointing: str | None,
                      fused: list[Block], framework: str) -> np.ndarray:
    """`[pp]` bytes of activations a stage's GPU keeps at its fullest (module docstring)."""
    pp, v, scale = layout.pp, layout.virtual, activation_scale(precision)
    core = blocks if checkpointing == "selective" else fused  # no S x S kept either way
    each = saved(seq, core, scale, framework=framework)  # [N] bytes kept of each output
    kept = np.bincount(stage, each, pp)  # one micro-batch's
    flight = np.minimum(pp - np.arange(pp), m).astype(float)
    if layout.schedule == "gpipe":
        flight[:] = m
    elif layout.schedule == "interleaved":
        flight[0] = min(pp, m) * (1 + (pp - 1) / (pp * v))
    if checkpointing != "full":
        return kept * flight
    held, again, _ = full_checkpoint_bytes(seq, blocks, each, scale, stage, pp)
    return held * flight + again
