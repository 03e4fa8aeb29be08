"""The device core set and the probe: fixed samples measured on every device.

- The **core set** (~150 (model, size, batch) samples over >= 40 families) is common ground:
  measured on every device, it lets devices be compared sample by sample and adapted to.
- The **probe** (12 of them, a few minutes on 2 cores) describes a device: its measured times
  are the device's features in a device-aware predictor and the first rows `mdot adapt` fits.

Both are chosen once, by the rules below, and stored with a version in
`mdot_jax/measure/core_set.json`; a device's measurements of them are ordinary samples of its
dataset (`mdot profile --core-set`, `mdot probe`), so a probe value is a label like any other.

Rules (version 1), from the keys measured on all three CPUs when it was chosen:
- core set: per family (sorted), up to three samples at 64 px (or the size with most samples)
  at the batch sizes nearest 2, 8 and 32, leaving out samples whose label exceeds
  CORE_MAX_MS on the slowest device (the whole set must measure in <= 45 min);
- probe: k-means (k = PROBE_SIZE, seed 0) over what the core set's batch-8 graphs compute (the
  share of forward FLOPs by kind of work and the log total; graphs only, never a device's
  times, so that no device's labels choose it), and the sample nearest each centre.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mdot_jax import writers
from mdot_jax.data.dataset import Sample

CORE_SET_VERSION = 1
CORE_SET_FILE = Path(__file__).with_name("core_set.json")  # package data
CORE_MAX_MS = 1500.0
PROBE_SIZE = 12
KINDS = (("conv", ("Conv", "ConvTranspose")), ("matmul", ("MatMul", "Gemm", "Einsum")),
         ("norm", ("BatchNormalization", "LayerNormalization", "GroupNormalization")),
         ("pool", ("MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean")))


def graph_profile(s: Sample) -> np.ndarray:
    """`[len(KINDS) + 2]`: the share of forward FLOPs by kind of work (the rest last) and the
    log10 total."""
    from converters.vocab import VOCAB

    flops = s.seq.column("fwd_flops")
    names = np.asarray(VOCAB)[np.minimum(s.seq.op_type, len(VOCAB) - 1)]
    total = max(flops.sum(), 1.0)
    shares = [flops[np.isin(names, ops)].sum() / total for _, ops in KINDS]
    return np.asarray([*shares, 1 - sum(shares), np.log10(total)])


def select(datasets: Mapping[str, Sequence[Sample]]) -> dict:
    """The core set and the probe by the module's rules, from samples keyed alike on every
    device (`datasets`: device -> samples; the sequences of the first are used)."""
    keyed = [{s.key: s for s in samples} for samples in datasets.values()]
    common = sorted(set.intersection(*(set(k) for k in keyed)))
    first = keyed[0]
    slowest = {k: max(d[k].label_ms for d in keyed) for k in common}
    by_family: dict[str, list[Sample]] = {}
    for k in common:
        if slowest[k] <= CORE_MAX_MS:
            by_family.setdefault(first[k].family, []).append(first[k])
    core = []
    for family in sorted(by_family):
        samples = by_family[family]
        sizes = [s.workload.input_size for s in samples]
        size = 64 if 64 in sizes else max(set(sizes), key=sizes.count)
        at = [s for s in samples if s.workload.input_size == size]
        arch = sorted({s.arch for s in at})[0]  # one architecture per family
        at = [s for s in at if s.arch == arch]
        picked = {min(at, key=lambda s: (abs(np.log2(s.workload.batch_size / b)),
                                         s.workload.batch_size)).key for b in (2, 8, 32)}
        core += sorted(picked)
    probe_pool = {}
    for k in core:  # one batch-8 (or nearest) sample per family
        s = first[k]
        best = probe_pool.get(s.family)
        if best is None or abs(np.log2(s.workload.batch_size / 8)) < abs(
                np.log2(best.workload.batch_size / 8)):
            probe_pool[s.family] = s
    pool = [probe_pool[f] for f in sorted(probe_pool)]
    x = np.stack([graph_profile(s) for s in pool])
    x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-9)
    probe = sorted({pool[i].key for i in _kmeans_nearest(x, PROBE_SIZE, seed=0)})
    return dict(version=CORE_SET_VERSION, core_set=core, probe=probe,
                devices=sorted(datasets), families=len(by_family),
                core_max_ms=CORE_MAX_MS,
                slowest_device_s=dict(core=round(sum(slowest[k] for k in core) / 1e3, 1),
                                      probe=round(sum(slowest[k] for k in probe) / 1e3, 1)))


def _kmeans_nearest(x: np.ndarray, k: int, seed: int, iters: int = 100) -> list[int]:
    """Indices of the rows of `x` `[N, D]` nearest each of `k` k-means centres (distinct)."""
    rng = np.random.default_rng(seed)
    centres = x[rng.choice(len(x), k, replace=False)]
    for _ in range(iters):
        assign = ((x[:, None] - centres[None]) ** 2).sum(-1).argmin(1)
        new = np.stack([x[assign == j].mean(0) if np.any(assign == j) else centres[j]
                        for j in range(k)])
        if np.allclose(new, centres):
            break
        centres = new
    chosen: list[int] = []
    for c in centres:
        order = ((x - c) ** 2).sum(-1).argsort()
        chosen.append(int(next(i for i in order if i not in chosen)))
    return chosen


def load(path: str | Path = CORE_SET_FILE) -> dict:
    """The stored selection: `core_set` and `probe` keys, with its version."""
    with open(path) as f:
        chosen = json.load(f)
    if chosen.get("version") != CORE_SET_VERSION:
        raise ValueError(f"{path}: core set version {chosen.get('version')}, this code reads "
                         f"{CORE_SET_VERSION}")
    return chosen


PROBE_FILE = "probe.json"  # in a device's dataset folder: its probe, as measured


def run_probe(root: str | Path, keys: Sequence[str], threads: int = 2, protocol=None,
              speed_check: bool = True) -> dict:
    """Measures the probe samples `keys` that the dataset folder `root` lacks (as
    `mdot profile` does, into that folder), then writes `root/PROBE_FILE`: version,
    fingerprint, key -> ms of those it holds. Returns that."""
    from mdot_jax.measure.device import cuda_available, fingerprint
    from mdot_jax.measure.profiler import Protocol, profile
    from mdot_jax.measure.zoo import ZOOS

    protocol = protocol or Protocol()
    if protocol.precision == "amp-fp16" and not cuda_available():
        raise ValueError("precision amp-fp16 on a CPU: PyTorch runs float16 there without fast "
                         "kernels (over twice the fp32 time a sample, no CPU trains so); "
                         "probe at fp32 or amp-bf16")
    profile(list(ZOOS), [], [], root, threads=threads, keys=keys, protocol=protocol,
            speed_check=speed_check)
    return write_probe(root, keys, fingerprint(threads, protocol.optimizer, protocol.precision))


def write_probe(root: str | Path, keys: Sequence[str], fingerprint: dict) -> dict:
    """Writes `root/PROBE_FILE` from the probe samples the folder holds; returns it."""
    from mdot_jax.data.dataset import has_samples, load_dataset

    held = load_dataset(root).samples if has_samples(root) else []
    ms = {s.key: s.label_ms for s in held}
    probe = dict(version=CORE_SET_VERSION, fingerprint=fingerprint,
                 ms={k: ms[k] for k in keys if k in ms})
    writers.replace_text(Path(root) / PROBE_FILE, json.dumps(probe, indent=1) + "\n")
    return probe


def adaptation_order(chosen: Mapping) -> list[str]:
    """The core-set samples `mdot adapt --budget-s` measures after the probe, in order: one
    per family not in the probe (the batch nearest 8; families in a seeded order), then the
    rest of the core set. Fixed by the stored selection, so that a resumed adaptation
    measures the same samples. (The core set holds one architecture per family.)"""
    probe = set(chosen["probe"])
    probed = {k.split("/")[0] for k in probe}
    by_arch: dict[str, list[str]] = {}
    for k in chosen["core_set"]:
        if k not in probe:
            by_arch.setdefault(k.split("/")[0], []).append(k)
    archs = sorted(a for a in by_arch if a not in probed)
    first = [min(by_arch[archs[i]], key=lambda k: abs(np.log2(int(k.rsplit("/b", 1)[1]) / 8)))
             for i in np.random.default_rng(0).permutation(len(archs))]
    taken = set(first)
    return first + [k for ks in by_arch.values() for k in ks if k not in taken]


def probe_of(samples: Sequence[Sample]) -> dict[str, float] | None:
    """The probe's measured ms among `samples` of one device (every probe key), or None."""
    ms = {s.key: s.label_ms for s in samples}
    try:
        keys = load()["probe"]
    except (OSError, ValueError):
        return None
    return {k: ms[k] for k in keys} if all(k in ms for k in keys) else None


def probe_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Mean |log ratio| of two probes over their common keys (inf if none): how differently
    two devices run the same reference samples."""
    common = sorted(set(a) & set(b))
    if not common:
        return float("inf")
    return float(np.mean([abs(np.log(a[k] / b[k])) for k in common]))


def probe_vector(samples: Sequence[Sample], probe: Sequence[str]) -> np.ndarray | None:
    """`[len(probe)]` log ms of the probe samples on one device, or None if any is missing."""
    ms = {s.key: s.label_ms for s in samples}
    if not all(k in ms for k in probe):
        return None
    return np.log(np.asarray([ms[k] for k in probe]))
