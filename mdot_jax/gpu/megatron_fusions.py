"""The kernels Megatron-LM runs fused where a Hugging Face export writes them out as several
operators (`spec_sheet.price` and the step's memory under framework megatron), each group
priced and kept as `gpu.compiled` prices and keeps a generated kernel's: by the bytes it moves,
one kernel a pass (a row-wise one where it reduces), its parameters' gradients reduced as
eager's are.

- a normalisation written out in the model's code (`_norms`: a row's mean of a square, as a
  Llama's RMSNorm takes it, with the upcast, the epsilon, the reciprocal root, the scaling and
  the weight around it): Transformer Engine's norm (`--normalization RMSNorm`), one kernel;
- a rotary embedding applied as x cos + rotate_half(x) sin (`_rotaries`: the halves cut, one
  negated and joined again, the two products, their sum): the fused RoPE kernel, one a tensor
  (Megatron-LM's arguments fuse it unless `--no-rope-fusion`);
- a gated activation act(a) x b (`_gated`: SwiGLU's SiLU, GeGLU's GELU): the fused
  bias-SwiGLU kernel (unless `--no-bias-swiglu-fusion`);
- what a fused attention block's call does on chip but an export writes outside it
  (`in_attention`): the keys and values a grouped-query model repeats for each query head (the
  Expands feeding the block's two products), the scale of the queries and keys (a `Mul` of one
  tensor that the scores alone read), a causal mask built from the shapes (operators fed by no
  tensor of the step that the block alone reads): Transformer Engine's attention reads grouped
  keys in place and scales and masks on chip;
- linear layers that read one tensor (`projections`: the queries', keys' and values', a gated
  MLP's gate and up): one GEMM of their outputs side by side (Megatron's `linear_qkv`,
  `linear_fc1`), forward and backward, priced on the first of them.

A GPT graph as vTrain's rows export it (a LayerNorm one operator, GELU one, no rotary, no
gate, keys and values a head) holds none of these, so its pricing, on which the Megatron host
was chosen, is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from converters import OperatorSequence
from converters.attention import Block
from converters.kept import KEPT
from mdot_jax import autograd
from mdot_jax.gpu import compiled
from mdot_jax.gpu.classify import classified
from mdot_jax.gpu.compiled import Group, made, through_views

NORM_OPS = frozenset({"Cast", "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal"})
GATES = frozenset({"Silu", "Gelu"})
PIECES = frozenset({"Split", "Slice"})
MASK_OPS = 6  # the most operators a causal mask made of the shapes takes (a Where, its inputs)


def fusing(seq: OperatorSequence, blocks: Sequence[Block], framework: str) -> list[Group]:
    """The fused groups of `seq` under `framework` (none but under megatron), apart from the
    nodes of `blocks` (attention run as fused kernels)."""
    if framework != "megatron":
        return []
    skip = frozenset(i for b in blocks for i in b.inner)
    kept = KEPT.get(("megatron", seq), dict)  # skip -> its groups, while `seq` is kept
    if skip not in kept:
        kinds = [k for k, _, _ in classified(seq)]
        preds, succs = seq.neighbours()
        found, taken = [], set(skip)
        for ms in (*_norms(seq, kinds, preds, succs), *_rotaries(seq, kinds, preds),
                   *_gated(seq, kinds, preds, succs)):
            if taken.isdisjoint(ms):
                found.append(sorted(ms))
                taken |= ms
        kept[skip] = made(seq, found)
    return kept[skip]


def in_attention(seq: OperatorSequence, blocks: Sequence[Block]) -> set[int]:
    """The nodes outside `blocks` (fused attention) that their calls run on chip under
    Megatron-LM (module docstring): grouped keys' and values' copies, the scores' scale, a
    causal mask made of the shapes."""
    kept = KEPT.get(("in_attention", seq), dict)  # blocks -> their nodes, while `seq` is kept
    if (key := tuple(blocks)) not in kept:
        kept[key] = frozenset(_in_attention(seq, blocks))
    return set(kept[key])


def _in_attention(seq: OperatorSequence, blocks: Sequence[Block]) -> set[int]:
    kinds = [k for k, _, _ in classified(seq)]
    preds, succs = seq.neighbours()
    names, out = seq.op_names, set()
    for b in blocks:
        inner = set(b.inner)
        todo = [*through_views(b.scores, preds, kinds), *through_views(b.output, preds, kinds)]
        while todo:  # back through the scale an export multiplies keys by
            j = todo.pop()
            if names[j] == "Expand":
                out.add(j)
            elif names[j] == "Mul" and j not in inner:
                feeds = through_views(j, preds, kinds)
                if through_views(j, succs, kinds) == [b.scores] and len(feeds) == 1:
                    out.add(j)  # the scale
                todo.extend(k for k in feeds if k not in inner)
        if b.causal and not (b.window or b.padded or b.biased):  # is_causal: no mask tensor
            for j in {i for k in inner for i in preds.get(k, ()) if i not in inner}:
                built, frontier = {j}, [j]
                while frontier and len(built) <= MASK_OPS:
                    frontier = [k for i in frontier for k in preds.get(i, ()) if k not in built]
                    built.update(frontier)
                if not frontier and all(set(succs.get(i, ())) <= built | inner for i in built):
                    out |= built  # made of the shapes alone, read by the block alone
    return out


def projections(seq: OperatorSequence) -> dict[int, int]:
    """Linear layers of `seq` that read one tensor and run as one GEMM (module docstring): the
    first of each -> the GEMM's output features (their sum); the others -> 0 (no GEMM of its
    own). Only layers of the same rows and inputs, trained alike."""
    def build() -> dict[int, int]:
        found = classified(seq)
        kinds = [k for k, _, _ in found]
        _, succs = seq.neighbours()
        grads = autograd.backward(seq)
        out: dict[int, int] = {}
        for x in range(seq.num_ops):
            readers: dict[tuple, list[int]] = {}
            for j in through_views(x, succs, kinds):
                if found[j][1] == "linear" and j not in out:
                    _, m, _, k = found[j][2]
                    readers.setdefault((m, k, bool(grads.data[j]), bool(grads.weights[j])),
                                       []).append(j)
            for js in readers.values():
                if len(js) > 1:
                    first, *rest = sorted(js)
                    out[first] = sum(found[j][2][2] for j in js)
                    out.update((j, 0) for j in rest)
        return out
    return KEPT.get(("projections", seq), build)


def kept_bytes(seq: OperatorSequence, saved: np.ndarray, scale: float, groups: list[Group]
               ) -> np.ndarray:
    """`saved` (`[N]` bytes eager keeps of each output) as Megatron-LM's fused kernels keep
    them: a group its inputs from outside (`compiled.kept_bytes`), and what leaves it for a
    GEMM, which keeps its input (a norm's output, for the weights' gradient)."""
    out = compiled.kept_bytes(saved, scale, groups, cut=False)
    kinds = [k for k, _, _ in classified(seq)]
    _, succs = seq.neighbours()
    for g in groups:
        for i in g.members:
            if any(kinds[j] in ("linear", "bmm") for j in through_views(i, succs, kinds)):
                out[i] += saved[i]
    return out


def said(groups: list[Group]) -> str:
    """The warning of a step priced with Megatron-LM's fused kernels."""
    n = sum(len(g.members) for g in groups)
    return (f"framework megatron: {n:,} operators the model's code writes out (RMSNorm, rotary "
            f"embedding, gated activation) run as {len(groups):,} fused kernels, each priced "
            "by the bytes it moves; linear layers reading one tensor as one GEMM (queries, "
            "keys and values; gate and up), priced on the first; attention's scale, causal "
            "mask and grouped keys on chip (not measured)")


def _norms(seq: OperatorSequence, kinds: list[str], preds: dict, succs: dict) -> list[set]:
    names, out = seq.op_names, []
    for r in np.flatnonzero(names == "ReduceMean").tolist():
        square = through_views(r, preds, kinds)
        if len(square) != 1 or names[square[0]] not in ("Pow", "Mul"):
            continue
        x = set(through_views(square[0], preds, kinds))  # the row (or its upcast)
        if len(x) != 1:
            continue
        ms, todo = {r, square[0]}, through_views(r, succs, kinds)
        while todo:  # what computes on the mean and the row alone, to the weight's product
            u = todo.pop()
            if u not in ms and names[u] in NORM_OPS \
                    and set(through_views(u, preds, kinds)) <= ms | x:
                ms.add(u)
                todo.extend(through_views(u, succs, kinds))
        (row,) = x
        if names[row] == "Cast":  # the upcast: the norm reads the half-type row itself
            ms.add(row)
        if len(ms) > 3:
            out.append(ms)
    return out


def _rotaries(seq: OperatorSequence, kinds: list[str], preds: dict) -> list[set]:
    names, out = seq.op_names, []
    for a in np.flatnonzero(names == "Add").tolist():
        products = through_views(a, preds, kinds)
        if len(products) != 2 or any(names[m] != "Mul" for m in products):
            continue
        for rotated, direct in (products, products[::-1]):
            joined = [j for j in through_views(rotated, preds, kinds) if names[j] == "Concat"]
            if len(joined) != 1:
                continue
            parts = through_views(joined[0], preds, kinds)
            negated = [j for j in parts if names[j] == "Neg"]
            if len(negated) != 1:
                continue
            pieces = {j for j in (*parts, *through_views(negated[0], preds, kinds))
                      if names[j] in PIECES}
            sources = {s for p in pieces for s in through_views(p, preds, kinds)}
            if pieces and len(sources) == 1 and sources <= set(
                    through_views(direct, preds, kinds)):
                out.append({a, rotated, direct, joined[0], negated[0], *pieces})
                break
    return out


def _gated(seq: OperatorSequence, kinds: list[str], preds: dict, succs: dict) -> list[set]:
    names, out = seq.op_names, []
    for s in np.flatnonzero(np.isin(names, sorted(GATES))).tolist():
        users = through_views(s, succs, kinds)
        if len(users) != 1 or names[users[0]] != "Mul":
            continue
        other = [j for j in through_views(users[0], preds, kinds) if j != s]
        if len(other) == 1:  # the up projection, gated
            out.append({s, users[0]})
    return out
