"""How a dataset's samples are split for training and evaluation: random and leave-family-out
folds, the validation carve-out, the batch-size split and the novel-architecture split."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from mdot_jax.data.dataset import Dataset, Sample, Split, graph_digest


def random_folds(ds: Dataset, k: int = 5, seed: int = 0) -> list[Split]:
    """k-fold over samples, shuffled with `seed`; `k=1`: one random 70/30 split (the MDOT
    paper's protocol: architectures seen in training)."""
    idx = np.random.default_rng(seed).permutation(len(ds))
    if k == 1:
        cut = round(0.7 * len(idx))
        return [(np.sort(idx[:cut]), np.sort(idx[cut:]))]
    return [(np.sort(np.concatenate([f for j, f in enumerate(np.array_split(idx, k)) if j != i])),
             np.sort(part)) for i, part in enumerate(np.array_split(idx, k))]


def split_groups(samples: Sequence[Sample]) -> list[str]:
    """Per sample, the group the leave-family-out split keeps together: its family, merged
    with every family that has an identical operator graph (DeiT and ViT, MnasNet-A1 and
    SemNASNet-100 are one network under two names); otherwise a test model could have its
    exact twin among the training samples."""
    parent: dict[str, str] = {}

    def root(f: str) -> str:
        while parent.setdefault(f, f) != f:
            f = parent[f]
        return f

    first_family: dict[str, str] = {}  # graph digest -> a family having it
    for s in samples:
        d = graph_digest(s.seq)
        a, b = root(first_family.setdefault(d, s.family)), root(s.family)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [root(s.family) for s in samples]


VAL_BY = ("sample", "family")  # the validation carve-out of `split_validation`


def split_validation(samples: Sequence[Sample], fraction: float, seed: int,
                     by: str = "sample") -> tuple[list[Sample], list[Sample]]:
    """(train, validation): a random `fraction` of the samples, or with `by="family"` whole
    families (merged as the leave-family-out split merges them) drawn at random until they
    hold `fraction` of the samples, so that early stopping scores unseen families, as the
    held-out test does."""
    n_val = max(1, int(round(fraction * len(samples)))) if fraction > 0 else 0
    rng = np.random.default_rng(seed)
    if by == "sample":
        is_val = np.zeros(len(samples), bool)
        is_val[rng.permutation(len(samples))[:n_val]] = True
    else:
        groups = np.array(split_groups(samples))
        names = rng.permutation(np.unique(groups))
        sizes = np.array([(groups == g).sum() for g in names])
        is_val = np.isin(groups, names[:int(np.searchsorted(np.cumsum(sizes), n_val)) + 1])
        if is_val.all():
            raise ValueError(f"a family validation carve-out needs samples of 2 families; "
                             f"these have 1 ({groups[0]})")
        if n_val == 0:
            is_val[:] = False
    return ([s for s, v in zip(samples, is_val) if not v],
            [s for s, v in zip(samples, is_val) if v])


def family_folds(ds: Dataset, k: int = 5, seed: int = 0) -> list[Split]:
    """Leave-family-out: families (merged by `split_groups`) are dealt to k folds (largest
    first, to the emptiest fold), so no family and no operator graph is in both the training
    and the test side of a fold."""
    groups = np.array(split_groups(ds.samples))
    names, counts = np.unique(groups, return_counts=True)
    rng = np.random.default_rng(seed)
    order = sorted(range(len(names)), key=lambda i: (-counts[i], rng.random()))
    load, assign = np.zeros(k), {}
    for i in order:
        j = int(np.argmin(load))
        assign[names[i]] = j
        load[j] += counts[i]
    fold_of = np.array([assign[g] for g in groups])
    return [(np.flatnonzero(fold_of != j), np.flatnonzero(fold_of == j)) for j in range(k)]


def batch_split(ds: Dataset, test_fraction: float = 0.25) -> list[Split]:
    """Extrapolation in batch size: samples in the top `test_fraction` of batch sizes are
    tested, the rest train."""
    bs = np.array([s.workload.batch_size for s in ds.samples])
    threshold = np.quantile(bs, 1 - test_fraction)
    test = np.flatnonzero(bs > threshold) if (bs > threshold).any() else \
        np.flatnonzero(bs >= threshold)
    train = np.setdiff1d(np.arange(len(ds)), test)
    return [(train, test)]


def is_random_zoo(arch: str) -> bool:
    return re.fullmatch(r"rnd\d+-s\d+-\d+", arch) is not None


def with_novel(ds: Dataset, novel: Dataset) -> Dataset:
    """`ds` and the samples of `novel` (marked `meta["novel"]`) as one dataset, for the novel
    split; refused where a novel architecture, or its graph, is among `ds`'s."""
    shared = set(ds.archs) & set(novel.archs)
    if shared:
        raise ValueError(f"{novel.root}: architectures also in {ds.root}: {sorted(shared)[:5]}")
    graphs = {graph_digest(s.seq): s.arch for s in ds.samples}
    twins = {(s.arch, graphs[d]) for s in novel.samples if (d := graph_digest(s.seq)) in graphs}
    if twins:
        raise ValueError(f"{novel.root}: graphs also in {ds.root}: {sorted(twins)[:5]}")
    marked = [dataclasses.replace(s, meta={**s.meta, "novel": True}) for s in novel.samples]
    return Dataset(root=ds.root, samples=[*ds.samples, *marked])


def novel_split(ds: Dataset, zoo_only: bool = False, held_out: float = 0.2,
                seed: int = 0) -> list[Split]:
    """One split: trained on the samples not marked novel (`with_novel`; with `zoo_only`, not
    of the random zoo either), less a held-out part that calibrates the bands: whole zoo
    families holding `held_out` of the zoo samples (`split_validation` by family) and that
    share of the random-zoo architectures; tested on the held-out part and every novel
    sample."""
    novel = np.array([bool(s.meta.get("novel")) for s in ds.samples])
    rnd = np.array([is_random_zoo(s.arch) for s in ds.samples])
    zoo = np.flatnonzero(~novel & ~rnd)
    _, val = split_validation([ds.samples[i] for i in zoo], held_out, seed, by="family")
    held = {s.key for s in val}
    if not zoo_only:
        archs = sorted({ds.samples[i].arch for i in np.flatnonzero(~novel & rnd)})
        drawn = np.random.default_rng(seed).permutation(len(archs))[:round(held_out * len(archs))]
        held |= {s.key for s in ds.samples
                 if not s.meta.get("novel") and s.arch in {archs[j] for j in drawn}}
    is_held = np.array([s.key in held for s in ds.samples])
    train = np.flatnonzero(~novel & ~is_held & (~rnd if zoo_only else True))
    return [(train, np.flatnonzero(novel | is_held))]


SPLITS = {"random": random_folds, "family": family_folds}


def make_splits(ds: Dataset, kind: str, k: int = 5, seed: int = 0) -> list[Split]:
    """`kind` in {random, family, batch, novel, novel-zoo}; `batch` gives one split (largest
    batch sizes test), so do the novel ones (`novel_split`)."""
    if kind == "batch":
        return batch_split(ds)
    if kind in ("novel", "novel-zoo"):
        return novel_split(ds, zoo_only=kind == "novel-zoo", seed=seed)
    if kind not in SPLITS:
        raise ValueError(f"unknown split {kind!r}: choose random, family or batch")
    return SPLITS[kind](ds, k, seed)
