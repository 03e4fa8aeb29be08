"""A training step compiled with `torch.compile` (TorchInductor, its default mode), as
`gpu.spec_sheet` prices it: the eager step's kernels (the module docstring there) but for the
memory-bound operators, which Inductor fuses into generated kernels.

- fusion groups (`groups`): in the graph's order, a memory-bound operator (elementwise,
  dropout, copies, softmax, normalisations, a row's mean, losses) joins the group of an
  operator it reads, directly or through views, unless it also reads an operator that ran
  after that group began (a GEMM's output between them: one kernel cannot hold both);
  otherwise it starts a group.
  GEMMs, convolutions, attention (SDPA's kernels), embeddings and our exporter's own fused
  kernels stay as eager runs them: Inductor's default mode calls the same libraries.
- each group's forward is one kernel per reduction it holds (at least one); they read what its
  operators read from outside it (activations, parameters, inputs) and write what leaves it (read
  by another operator, or the graph's output); nothing between them touches memory.
- its backward (where autograd runs one, `autograd.backward`): as many kernels and one more
  where it holds parameters (their gradients' reduction over the rows); they read the
  gradients of what left and, unless every operator's backward keeps nothing (additions,
  copies), what the forward read again (AOTAutograd's partitioner recomputes inside a group
  rather than saving), and write the gradients of what the forward read.
- a group's kernels: with a reduction, row-wise kernels over its first reduction's rows; else
  elementwise ones; each moving its share of the group's elements (`gpu.work`'s counts).
- autocast's casts of activations become the stores of those kernels; a weight's cast stays
  a kernel (`autocast.casts`).
- memory (`kept_bytes`): a group keeps for the backward what its operators would, or the
  fewest elements it can recompute those from (AOTAutograd's partitioner: the least vertex cut
  between what it reads from outside and what its backward reads, `least_cut`), never more
  than eager.
- the host: each kernel issued at the framework's fitted time (torch.compile's own host is not
  measured: `spec_sheet.price` says so).
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from converters import OperatorSequence
from converters.attention import Block
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from converters.traits import keeping, of_kind
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.classify import classified
from mdot_jax.gpu.fused import read_in_place

KEY = "compiled"  # a sequence's metadata: its step runs under torch.compile

FUSIBLE = frozenset({"elementwise", "dropout", "softmax", "ln"})  # `classify` kinds
REDUCTIONS = frozenset({"softmax", "ln"})
ROW_MEANS = frozenset({"ReduceMean"})  # a row's mean, as a norm written out in code takes it
_OWN = frozenset(of_kind("stream"))  # our exporter's fused kernels: not Inductor's to fuse
_KEEPING = keeping("input") | keeping("output")  # a backward that reads its forward's tensors
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_L = {name: i for i, name in enumerate(LOAD_FIELDS)}


@dataclass(frozen=True)
class Group:
    """Memory-bound operators one generated kernel pass runs (module docstring)."""

    members: tuple[int, ...]  # node indices, in order
    reductions: int  # its row-wise members
    rows: int  # its first reduction's rows (1: none)
    read: float  # elements its forward reads from outside it
    activations: float  # of those, other operators' outputs (not parameters, not inputs)
    left: float  # elements its forward writes that leave it
    params: int  # parameters its members hold
    keeping: bool  # a member's backward reads its forward's tensors
    reads: tuple[tuple[int, ...], ...] = ()  # each member's: the operators it reads (views passed)
    numel: tuple[tuple[int, float], ...] = ()  # (operator, elements) of members and what they read

    @property
    def last(self) -> int:
        return self.members[-1]


def fusing(seq: OperatorSequence, blocks: Sequence[Block]) -> list[Group]:
    """The fusion groups of a step `torch.compile` compiles (the sequence's metadata says so:
    `KEY`), else none; `blocks`: attention blocks run as fused kernels (their nodes theirs)."""
    if not seq.meta.get(KEY):
        return []
    return groups(seq, frozenset({i for b in blocks for i in b.inner} | read_in_place(seq)))


def said(fused: list[Group], host_ms: float, framework: str) -> str:
    """The warning of a compiled step's pricing."""
    n = sum(len(g.members) for g in fused)
    k = sum(max(g.reductions, 1) for g in fused)
    return (f"torch.compile: {n:,} memory-bound operators fused into {k:,} generated forward "
            "kernels, each priced by the bytes it moves; GEMMs, convolutions and attention as "
            f"eager runs them; each kernel issued at eager {framework}'s {1e3 * host_ms:.0f} us "
            "(torch.compile's own host time is not measured)")


def groups(seq: OperatorSequence, skip: frozenset[int] = frozenset()) -> list[Group]:
    """The fusion groups of `seq`'s memory-bound operators but `skip` (fused attention's
    pieces), in the graph's order (module docstring)."""
    kept = KEPT.get(("compiled", seq), dict)  # skip -> its groups, while `seq` is kept
    if skip not in kept:
        kept[skip] = _groups(seq, skip)
    return kept[skip]


def through_views(i: int, step: dict[int, list[int]], kinds: list[str]) -> list[int]:
    """The operators `i` reads (`step`: the producers) or feeds (the consumers), views passed
    through."""
    out, todo, seen = [], list(step.get(i, ())), set()
    while todo:
        j = todo.pop()
        if j in seen:
            continue
        seen.add(j)
        if kinds[j] == "free":
            todo.extend(step.get(j, ()))
        else:
            out.append(j)
    return out


def _groups(seq: OperatorSequence, skip: frozenset[int]) -> list[Group]:
    kinds = [k for k, _, _ in classified(seq)]
    names = seq.op_names
    preds, _ = seq.neighbours()
    fusible = [(k in FUSIBLE or names[i] in ROW_MEANS) and i not in skip
               and names[i] not in _OWN for i, k in enumerate(kinds)]
    group = np.full(seq.num_ops, -1)
    members: dict[int, list[int]] = {}  # group -> its nodes
    outside: dict[int, set[int]] = {}  # group -> the nodes outside it its nodes read

    def legal(gs: set[int], sources: list[int]) -> bool:  # nothing read from outside them
        start = min(members[g][0] for g in gs)  # ran after they began (it may depend on them)
        return all(k < start for k in {*sources, *(k for g in gs for k in outside[g])}
                   if group[k] not in gs)

    for i in range(seq.num_ops):
        if not fusible[i]:
            continue
        sources = through_views(i, preds, kinds)
        near = [int(group[j]) for j in sources if group[j] >= 0]
        tries = [set(near)] + [{g} for g in sorted(set(near), key=lambda g: -members[g][0])]
        into = next((gs for gs in tries if gs and legal(gs, sources)), None)
        if into is None:
            members[i], outside[i] = [], set()
            into = {i}  # a group is named by its first node
        g, *rest = sorted(into)
        for h in rest:  # merged into the first
            group[members[h]] = g
            members[g] += members.pop(h)
            outside[g] |= outside.pop(h)
        group[i] = g
        members[g].append(i)
        outside[g] = {k for k in outside[g] | set(sources) if group[k] != g}
    return made(seq, [ms for _, ms in sorted(members.items())])


def made(seq: OperatorSequence, members: Sequence[Sequence[int]]) -> list[Group]:
    """The groups of `members` (each a fused kernel pass's nodes, none in two): what each reads
    from outside it and writes that leaves it (module docstring)."""
    kinds = [k for k, _, _ in classified(seq)]
    names = seq.op_names
    preds, succs = seq.neighbours()
    group = np.full(seq.num_ops, -1)
    for g, ms in enumerate(members):
        group[list(ms)] = g
    c, load = seq.config, seq.load
    out = []
    for g, ms in enumerate(sorted(m) for m in members):
        other = left = 0.0  # parameters, inputs, constants: read; outputs leaving
        seen: dict[int, float] = {}  # an operator's output read from outside: once
        reads_of = []
        for i in ms:
            width = max(float(c[i, _C["elem_bytes"]]), 1.0)
            reads = float(load[i, _L["bytes_read"]]) / width
            sources = through_views(i, preds, kinds)
            reads_of.append(tuple(sources))
            other += max(reads - sum(float(c[j, _C["out_numel"]]) for j in sources), 0.0)
            for j in sources:
                if group[j] != g:
                    seen[j] = max(seen.get(j, 0.0), min(float(c[j, _C["out_numel"]]), reads))
            users = through_views(i, succs, kinds)
            if not users or any(group[j] != g for j in users):
                left += float(c[i, _C["out_numel"]])
        activations = sum(seen.values())
        reductions = [i for i in ms if kinds[i] in REDUCTIONS or names[i] in ROW_MEANS]
        rows = 1
        if reductions:  # a mean's rows are its outputs, one a row
            r = reductions[0]
            rows = int(c[r, _C["out_numel"]]) if names[r] in ROW_MEANS \
                else classified(seq)[r][2][0]
        out.append(Group(tuple(ms), len(reductions), max(rows, 1), activations + other,
                         activations, left, int(load[ms, _L["params"]].sum()),
                         any(names[i] in _KEEPING for i in ms), tuple(reads_of),
                         tuple({**{i: float(c[i, _C["out_numel"]]) for i in ms},
                                **seen}.items())))
    return out


def kernels(fused: list[Group], runs: np.ndarray, rowwise: GPU, elementwise: GPU
            ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """The generated kernels of `fused` groups as `spec_sheet.price` lists work (node, phase,
    operator, dims, GPU, 1.0), kept on each group's last member; `runs`: `[N]` whose backward
    autograd runs; `rowwise` / `elementwise`: the GPU as each kind of kernel sees it."""
    out = []
    for g in fused:
        backward = g.left + g.activations + g.params + g.read * g.keeping
        passes = [("fw", max(g.reductions, 1), g.read + g.left)]
        if runs[list(g.members)].any():
            passes.append(("bw", max(g.reductions + (g.params > 0), 1), backward))
        for phase, n, moved in passes:
            each = moved / n
            if g.reductions:  # a row-wise kernel moves 2 elements a (row, column)
                one = ("softmax", (g.rows, max(round(each / (2 * g.rows)), 1)), rowwise)
            else:  # an elementwise one 3 an output
                one = ("add", (1, max(round(each / 3), 1)), elementwise)
            out += [(g.last, phase, one[0], one[1], one[2], 1.0)] * n
    return out


def kept_bytes(saved: np.ndarray, scale: float, fused: Sequence[Group], cut: bool = True
               ) -> np.ndarray:
    """`saved` (`[N]` bytes eager keeps of each output) as a step running `fused` groups
    (`fusing`'s, or Megatron-LM's) keeps them: each group's at most what its backward can
    recompute them from (`cut`: the partitioner's least cut; else its inputs from outside, as a
    hand-written kernel keeps them), `scale` times fp32 bytes, on its last member."""
    out = saved.copy()
    for g in fused:
        ms = list(g.members)
        eager = float(out[ms].sum())
        out[ms] = 0.0
        needed = frozenset(int(i) for i in ms if saved[i] > 0)
        out[g.last] = min(eager, 4.0 * scale * (least_cut(g, needed) if cut and needed
                                                else g.activations))
    return out


@functools.lru_cache(maxsize=1 << 14)
def least_cut(g: Group, needed: frozenset[int]) -> float:
    """The fewest elements of tensors (the activations `g` reads from outside, its members'
    outputs) that every member of `needed` can be recomputed from inside `g`: the least vertex
    cut between them (max flow over each tensor split in two, its elements between)."""
    inner = {(v, 0): {(v, 1): n} for v, n in g.numel}  # [tensor in] -> [tensor out]: elements
    graph: dict = {"source": {}, **inner}
    for m, sources in zip(g.members, g.reads):
        for j in sources:
            graph.setdefault((j, 1), {})[(m, 0)] = math.inf
            if (j, 0) in graph and j not in g.members:  # read from outside
                graph["source"][(j, 0)] = math.inf
    for m in needed:
        graph.setdefault((m, 1), {})["sink"] = math.inf
    flow = 0.0
    while path := _augmenting(graph):
        push = min(graph[u][v] for u, v in path)
        for u, v in path:
            graph[u][v] -= push
            back = graph.setdefault(v, {})
            back[u] = back.get(u, 0.0) + push
        flow += push
    return flow


def _augmenting(graph: dict) -> list[tuple] | None:
    """The shortest path of edges with capacity left from "source" to "sink", if any."""
    before: dict = {"source": None}
    todo = collections.deque(["source"])
    while todo:
        u = todo.popleft()
        for v, left in graph.get(u, {}).items():
            if left > 1e-9 and v not in before:
                before[v] = u
                if v == "sink":
                    path = []
                    while before[v] is not None:
                        path.append((before[v], v))
                        v = before[v]
                    return path[::-1]
                todo.append(v)
    return None
