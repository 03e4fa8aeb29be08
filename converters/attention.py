"""Attention in an operator sequence: the scores of a batched MatMul, a Softmax over them and a
MatMul of the probabilities with the values, whatever elementwise work sits between (scale,
mask, NaN guards, dropout, casts). Exporters decompose `scaled_dot_product_attention` so;
PyTorch itself runs one fused kernel (FlashAttention, memory-efficient attention) for it on
GPUs at half precision, without the S x S tensors the decomposition shows.

A block is causal when a mask of its full S x S (queries x keys) enters the work between the
scores and the softmax, as decoders' causal masks do: made by an operator of the graph from no
parameter, or folded into a constant at export (short sequences), then seen as the condition of
the `Where` that applies it or as the constant operand of an `Add` over the scores as they are;
and ordering queries against keys (`meta["mask_patterns"]`: it reads a comparison as wide as the
scores, a folded constant that varies over both, or a buffer whose values a weight-free export
dropped). A padding mask ([B, 1, 1, S], which transformers expands to S x S for an encoder)
compares nothing: every key is attended, as for a mask the graph takes as a data input.
An S x S term a parameter reaches is a learned position bias (Swin's, LeViT's, T5's): an
additive mask, with which PyTorch's fused kernels compute every key, so not causal, as for T5's
decoder, whose causal mask is added to its bias.
A constant holding one value throughout masks nothing (T5's cross-attention adds its zero
position bias, [1, H, S, S]): the sequence names the Adds of one (`meta["fill_operands"]`).
A block is padded when the work between its scores and softmax applies a mask made of the batch
with no parameter (`meta["padding_masks"]`: an attention mask given as an input, which
transformers passes on to PyTorch's attention as a tensor), causal or not.

A block is cross-attention (an encoder-decoder's) when its queries and its keys are projected
from different tensors (the decoder's and the encoder's output), where self-attention projects
both from one (fused or not, rotated or not).

Host-side numpy over `OperatorSequence.edges`; nothing here is jitted.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

import numpy as np

from converters.fusion import VIEWS
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS, OperatorSequence

_BETWEEN = {"Add", "Sub", "Mul", "Div", "Where", "IsNaN", "Cast", "Dropout", "Neg", "Max", "Tanh",
            "Reshape",  # (Swin regroups its shifted windows to add their mask)
            "Concat", "Slice"}  # (gpt-oss's sinks: a logit a head joins to its scores, cut off)
_HOPS = 6  # elementwise operators between the scores' MatMul and the Softmax, or after it
_D = {f: CONFIG_FIELDS.index(f) for f in ("out_rank", "out_d2", "out_d3", "out_numel", "in_rank",
                                          "in_d2", "in_d3", "in_numel", "elem_bytes",
                                          "n_param_inputs")}
_L = {f: LOAD_FIELDS.index(f) for f in ("bytes_read", "params")}
_BIAS_HOPS = 12  # operators back from an S x S term to the parameter table it is gathered from
_PROJECTION_HOPS = 12  # operators back from the scores to the queries' and keys' projections


class Block(NamedTuple):
    scores: int  # the MatMul making Q K^T
    softmax: int
    output: int  # the MatMul of the probabilities with V
    inner: tuple[int, ...]  # the scores, the softmax and every operator between them and output
    causal: bool  # an S x S mask enters between the scores and the softmax
    cross: bool = False  # queries and keys projected from different tensors
    window: int = 0  # a sliding window's keys a query sees (the exporter's metadata; 0: all)
    local: bool = False  # the kernel visits the window's keys alone (the flash-attn package's)
    padded: bool = False  # a mask made of the batch (its attention mask) enters the scores
    biased: bool = False  # a learned S x S bias enters them (BEiT's, T5's positions)
    call: int = -1  # the first block's scores of the one call (the flash-attn package's
    # varlen kernel, `varlen`) that runs this block with others; -1: a call of its own


def _walk(start: int, step: dict[int, list[int]], names: np.ndarray
          ) -> tuple[int, list[int]] | None:
    """The first MatMul within `_HOPS` elementwise operators of `start` along `step`, and the
    operators passed on the way there."""
    frontier = {start: [start]}
    for _ in range(_HOPS):
        nxt: dict[int, list[int]] = {}
        for i, path in frontier.items():
            for j in step.get(i, []):
                if names[j] == "MatMul":
                    return j, path
                if names[j] in _BETWEEN:
                    nxt.setdefault(j, [*path, j])
        frontier = nxt
    return None


def attention_blocks(seq: OperatorSequence) -> list[Block]:
    """Every Softmax with a MatMul upstream and one downstream, in graph order."""
    return list(KEPT.get(("attention_blocks", seq), lambda: _blocks(seq)))


def calling_sdpa(seq: OperatorSequence, blocks: list[Block]) -> list[Block]:
    """Those of `blocks` whose code calls `scaled_dot_product_attention`, as the export records
    (`meta["sdpa_softmax"]`, `converters.from_torch`); all of them where it records none."""
    called = seq.meta.get("sdpa_softmax")
    return list(blocks) if called is None else [b for b in blocks if b.softmax in set(called)]


def causal_mask(seq: OperatorSequence, block: Block) -> tuple[int, ...]:
    """The causal mask the exporter builds for `block` from the shapes alone (operators fed by
    no tensor of the step that the block alone reads), where the block is causal and given no
    mask tensor (no sliding window, no padding, no bias): PyTorch's SDPA called with
    `is_causal`, whose fused kernels mask on chip and make no S x S tensor."""
    if not block.causal or block.window or block.padded or block.biased or not len(seq.edges):
        return ()
    return KEPT.each(("causal masks", seq), block,  # a plan asks at every layout
                     lambda: _causal_mask(seq, block))


def _causal_mask(seq: OperatorSequence, block: Block) -> tuple[int, ...]:
    preds, succs = seq.neighbours()
    inner, out = set(block.inner), []
    src, dst = seq.edges[:, 0], seq.edges[:, 1]
    for j in set(src[np.isin(dst, block.inner) & (dst != block.scores)].tolist()) - inner:
        built, frontier = {j}, [j]
        while frontier and len(built) <= _HOPS:  # back to operators fed by no tensor
            frontier = [k for i in frontier for k in preds.get(i, []) if k not in built]
            built.update(frontier)
        if not frontier and all(set(succs.get(i, [])) <= built | inner for i in built):
            out += sorted(built)
    return tuple(out)


def varlen(seq: OperatorSequence, blocks: list[Block]) -> tuple[list[Block], set[int]]:
    """`blocks` with those one call of the flash-attn package's varlen kernel runs marked
    (`Block.call`), and the operators that call leaves out: where transformers' SDPA path loops
    over the pieces of a split (Qwen-VL's encoder: `torch.split` of the queries, keys and values
    by each window's or image's length, attention a piece, `torch.cat` of the outputs), its
    flash_attention_2 path runs the whole in one call (`cu_seqlens`). Such a loop is two or more
    blocks whose outputs one Concat joins (through views); left out: that Concat and the
    Splits that cut the blocks' inputs."""
    names = seq.op_names
    preds, succs = seq.neighbours()
    joined: dict[int, list[int]] = {}
    for k, b in enumerate(blocks):
        j = b.output
        for _ in range(_HOPS):
            if len(succs.get(j, [])) != 1 or names[succs[j][0]] not in VIEWS:
                break
            j = succs[j][0]
        if len(after := succs.get(j, [])) == 1 and names[after[0]] == "Concat":
            joined.setdefault(after[0], []).append(k)
    out, left = list(blocks), set()
    for concat, group in joined.items():
        if len(group) < 2:
            continue
        left.add(concat)
        for k in group:
            b = blocks[k]
            out[k] = b._replace(call=blocks[group[0]].scores)
            frontier = [*preds.get(b.scores, []), *preds.get(b.output, [])]
            for _ in range(_HOPS):  # up through views and the scale to the Splits
                left.update(j for j in frontier if names[j] == "Split")
                frontier = [i for j in frontier if names[j] in VIEWS | {"Mul"}
                            for i in preds.get(j, [])]
    return out, left


def _blocks(seq: OperatorSequence) -> list[Block]:
    names = seq.op_names
    padding = set(seq.meta.get("padding_masks", ()))  # what applies the batch's masks
    preds, succs = seq.neighbours()
    blocks = []
    for i in np.flatnonzero(names == "Softmax").tolist():
        up, down = _walk(i, preds, names), _walk(i, succs, names)
        if up is None or down is None:
            continue
        (scores, before), (output, after) = up, down
        inner = {scores, *before, *after}
        for j in range(scores + 1, output):  # side work on the scores alone (NaN guards)
            if j not in inner and preds.get(j) and set(preds[j]) <= inner \
                    and set(succs.get(j, [])) <= inner:
                inner.add(j)
        order = tuple(sorted(inner))
        causal, biased = _masks(seq, scores, order, preds)
        blocks.append(Block(scores, i, output, order, causal, _cross(scores, preds, names),
                            padded=bool(padding.intersection(seq.node_names[list(order)])),
                            biased=biased))
    windows = seq.meta.get("sliding_window", [])  # a layer's each, in order
    own = [k for k, b in enumerate(blocks) if not b.cross]
    if len(windows) == len(own):
        for k, w in zip(own, windows):
            blocks[k] = blocks[k]._replace(window=int(w))
    return blocks


def needed(block: Block, keys: int) -> float:
    """Of `block`'s scores (`keys` a query), the share its queries need: all of them, the
    causal half, or those within its sliding window of W keys (W (S - W / 2) of S x S)."""
    if not block.causal:
        return 1.0
    w = min(block.window or keys, keys)
    return w * (keys - w / 2) / keys ** 2


def layers(blocks: list[Block]) -> list[Block]:
    """The blocks that start a transformer layer: all but cross-attention (a decoder layer of
    an encoder-decoder attends to itself, then to the encoder)."""
    return [b for b in blocks if not b.cross]


def layer_starts(seq: OperatorSequence, blocks: list[Block]) -> list[int]:
    """The first operator of each layer (`layers`): where the exporter's scopes show more layers
    in the stacks holding `blocks` than blocks (a hybrid: Qwen3.5's linear attention or Jamba's
    Mamba layers beside softmax attention), or a scoped layer holding several blocks (Qwen-VL's
    encoder looping over its windows and images), each scoped layer's first operator
    (`/model/layers.3/...`); otherwise each layer's attention scores. A language model without
    attention (token ids in: Mamba-2's state space layers) has the layers of its longest
    scoped stack (`/backbone/layers.k/`)."""
    def compute() -> list[int]:
        own = [b.scores for b in layers(blocks)]
        first: dict[tuple[str, str], int] = {}
        at: dict[int, tuple[str, str]] = {}  # an operator's scoped layer
        for stack, layer, i in _scoped(seq, blocks):
            first.setdefault((stack, layer), i)
            at[i] = (stack, layer)
        held = [at[i] for i in own if i in at]  # the scoped layer of each block's scores
        shared = len(set(held)) < len(held)
        return sorted(first.values()) if len(first) > max(len(own), 1) or shared else own
    return list(KEPT.get(("layer_starts", seq, *blocks), compute))


def in_layers(seq: OperatorSequence, blocks: list[Block]) -> np.ndarray:
    """`[N] bool`: the operators inside the layers (`layer_starts`' stacks, by the exporter's
    scopes), not the embedding, the final norm, the head or the loss; every operator where no
    scope says."""
    inside = np.zeros(seq.num_ops, bool)
    inside[[i for _, _, i in _scoped(seq, blocks)]] = True
    return inside if inside.any() else np.ones(seq.num_ops, bool)


def layer_ids(seq: OperatorSequence, blocks: list[Block]) -> np.ndarray:
    """`[N] int`: each operator's layer in the stacks of `in_layers` (numbered in the order of
    their first operators), -1 outside them or where no scope says. Read-only: kept."""
    return KEPT.each(("layer ids", seq), tuple(blocks), lambda: _layer_ids(seq, blocks))


def _layer_ids(seq: OperatorSequence, blocks: list[Block]) -> np.ndarray:
    ids = np.full(seq.num_ops, -1, np.int64)
    number: dict[tuple[str, str], int] = {}
    for stack, layer, i in _scoped(seq, blocks):
        ids[i] = number.setdefault((stack, layer), len(number))
    ids.setflags(write=False)
    return ids


def _scoped(seq: OperatorSequence, blocks: list[Block]) -> list[tuple[str, str, int]]:
    """(stack, layer, operator) of every operator in a scoped stack holding `blocks` (a token
    model without attention: its longest stack)."""
    scoped = KEPT.get(("scoped", seq.node_names), lambda: [
        (m.group(1), m.group(2), i) for i, name in enumerate(seq.node_names)
        if (m := _LAYER.search(str(name)))])
    stacks = {m.group(1) for b in blocks if (m := _LAYER.search(str(seq.node_names[b.scores])))}
    if not blocks and seq.input_kind == "tokens" and scoped:
        counts = Counter(stack for stack, _ in {(stack, layer) for stack, layer, _ in scoped})
        stacks = {max(counts, key=counts.__getitem__)}
    return [x for x in scoped if x[0] in stacks]


_LAYER = re.compile(r"^(/(?:[^/]+/)*?[^/.]+)\.(\d+)/")  # an exporter's scope: /model/layers.3/


def sublayers(seq: OperatorSequence, starts: list[int]) -> list[int]:
    """Each layer's sublayers (the layers from `layer_starts`): the residual adds in the layer's
    own scope (`/model/layers.3/Add`, `Add_1`: attention then the MLP; one in a layer of a
    single mixer, Nemotron-H's or Mamba-2's; three in a decoder's with cross-attention); two
    where the scopes say nothing."""
    return [len(adds) or 2 for adds in _residual_adds(seq, starts)]


def residuals(seq: OperatorSequence, starts: list[int]) -> list[int]:
    """Elements of each layer's residual stream (its first residual add's output: a
    vision-language model's encoder layers [patches, its width], its text's [tokens, theirs]);
    0 where the scopes say nothing."""
    return [int(seq.config[adds[0], _D["out_numel"]]) if adds else 0
            for adds in _residual_adds(seq, starts)]


def _residual_adds(seq: OperatorSequence, starts: list[int]) -> list[list[int]]:
    """Each layer's residual adds in its own scope (`sublayers`)."""
    return KEPT.each(("residual adds", seq), tuple(starts), lambda: _scoped_adds(seq, starts))


def _scoped_adds(seq: OperatorSequence, starts: list[int]) -> list[list[int]]:
    found, names = [], seq.op_names
    for start, end in zip(starts, [*starts[1:], seq.num_ops]):
        scope = _LAYER.search(str(seq.node_names[start]))
        own = re.compile(re.escape(scope.group(0)) + r"Add(_\d+)?$") if scope else None
        found.append([i for i in range(start, end) if own and names[i] == "Add"
                      and own.match(str(seq.node_names[i]))])
    return found


def _cross(scores: int, preds: dict[int, list[int]], names: np.ndarray) -> bool:
    """Whether the scores' two operands (queries, keys) were projected from disjoint tensors:
    what the MatMuls within `_PROJECTION_HOPS` operators upstream of each read, and the MatMuls
    upstream of those (a low-rank projection: DeepSeek's latent queries and keys, each a second
    projection of a normalised first one of the same hidden states)."""
    def sources(start: int, matmuls: int = 2) -> set[int]:
        out: set[int] = set()
        todo, seen = [start], set()
        for _ in range(_PROJECTION_HOPS):
            todo = [k for k in todo if k not in seen]
            seen.update(todo)
            for k in todo:
                if names[k] in ("MatMul", "Gemm"):
                    out.update(preds.get(k, []))
                    if matmuls > 1:
                        out.update(*(sources(p, matmuls - 1) for p in preds.get(k, [])))
            todo = [p for k in todo if names[k] not in ("MatMul", "Gemm")
                    for p in preds.get(k, [])]
        return out

    operands = preds.get(scores, [])
    if len(operands) != 2:
        return False
    q, k = (sources(j) for j in operands)
    return bool(q) and bool(k) and not q & k


def _masks(seq: OperatorSequence, scores: int, inner: tuple[int, ...],
           preds: dict[int, list[int]]) -> tuple[bool, bool]:
    """(causal, biased): whether a mask as wide as the scores' last two dims (queries x keys)
    enters `inner` (an operator's output no parameter reaches, or a constant a `Where` selects
    by (its first input's shape) or an `Add` adds to the scores (its second operand's bytes)),
    and whether such a term that a parameter reaches does (a learned bias, which SDPA is given
    as its mask)."""
    c, ld, names = seq.config, seq.load, seq.op_names
    side = (c[scores, _D["out_d2"]], c[scores, _D["out_d3"]])
    if side[0] != side[1]:
        return False, False
    numel = c[scores, _D["out_numel"]]

    def mask(j: int, io: str) -> bool:  # S x S, and fewer elements than the scores (as
        # many at one sequence of one head)
        return c[j, _D[f"{io}_rank"]] >= 2 and (c[j, _D[f"{io}_numel"]] < numel or numel ==
                                                side[0] * side[1]) and \
            (c[j, _D[f"{io}_d2"]], c[j, _D[f"{io}_d3"]]) == side

    def learned(j: int) -> bool:  # a parameter among the operators it is computed from
        seen, todo = set(), [j]
        for _ in range(_BIAS_HOPS):
            todo = [k for k in todo if k not in seen]
            seen.update(todo)
            if any(ld[k, _L["params"]] > 0 for k in todo):
                return True
            todo = [p for k in todo for p in preds.get(k, [])]
        return False

    marks = seq.meta.get("mask_patterns")
    marks = None if marks is None else set(marks)

    def ordered(j: int) -> bool:  # it reads a mask that compares queries with keys (a padding
        # mask alone does not; a sequence converted before such reads were recorded: any mask)
        return marks is None or seq.node_names[j] in marks

    fills = set(seq.meta.get("fill_operands", ()))

    def constant(i: int) -> bool:  # Add(scores, a folded S x S constant), at the scores' rank
        other = ld[i, _L["bytes_read"]] / max(c[i, _D["elem_bytes"]], 1) - c[i, _D["in_numel"]]
        return names[i] == "Add" and len(preds.get(i, [])) == 1 and \
            seq.node_names[i] not in fills and \
            c[i, _D["n_param_inputs"]] == 0 and c[i, _D["out_rank"]] == c[scores, _D["out_rank"]] \
            and 0 < other and (other < numel or numel == side[0] * side[1]) \
            and other % (side[0] * side[1]) == 0

    entering = [j for i in inner for j in preds.get(i, []) if j not in inner and mask(j, "out")]
    causal = any(not learned(j) and ordered(j) for j in entering) or \
        any((names[i] == "Where" and mask(i, "in") or constant(i)) and ordered(i) for i in inner)
    expanded = [j for i in inner for j in preds.get(i, [])  # a bias expanded over the batch
                if j not in inner and names[j] == "Expand" and mask(j, "in")]
    return causal, any(learned(j) for j in entering + expanded) or any(  # or the parameter
        names[i] == "Add" and c[i, _D["n_param_inputs"]] > 0 for i in inner)
