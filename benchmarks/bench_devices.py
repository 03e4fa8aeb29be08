"""Leave one device out: how well a device nobody trained on is predicted from its probe and
k measured samples, against the usual remedies.

    python benchmarks/bench_devices.py --out benchmarks/results/devices-cpu
    python benchmarks/bench_devices.py --compare data/cpu-amd-epyc-2t data/cpu-amd-epyc-f26m2-2t

For each device d of the CPU datasets: the predictors are fitted on the other devices' samples
and adapted with d's probe (the 12 samples of `mdot_jax/measure/core_set.json`, measured on every
device) plus k samples of k other random families (seeded draws); the error is measured on d's
samples of every family outside that adaptation set. LightGBM on the companion's model
aggregates throughout (minutes on 2 cores), so the strategies differ only in what they know:

- `nearest`: the model of the other device whose probe is nearest d's, unadapted;
- `scale`: the same with one factor fitted on the adaptation samples;
- `adapt`: the same with `mdot adapt`'s fit (scale or a line in log time, by leave-one-out);
- `device-aware`: one model of all other devices, each sample also described by its device's
  probe (every probe time, centred, and the time of the probe samples nearest in what the
  graph computes, scaled by FLOPs), then `adapt`'s fit on the adaptation samples;
- `scratch`: a model fitted on the adaptation samples alone;
- `ceiling`: d's own full data, leave-family-out (5 family folds of d: each sample predicted
  by the model fitted on d's other families), what a checkpoint trained on d would err;
- `shipped adapt`: what a user gets: the shipped checkpoint of the nearest device by probe,
  its own left out (GNN + LightGBM, trained on all of that device's data), with
  `mdot adapt`'s fit. For k = 10 (first draw) the same samples are also written as a
  measurements CSV and given to `mdot adapt --from-measurements`: the row records whether
  that reproduces the fit.

Labels are the devices' measurements; nothing is measured here.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from mdot_jax.data.aggregates import aggregates
from mdot_jax.data.dataset import load_dataset
from mdot_jax.measure import core_set
from mdot_jax.models.trees import fit_boosters
from mdot_jax.serving.adaptation import fit as fit_adaptation

DEVICES = ("cpu-amd-epyc-2t", "cpu-amd-epyc-f26m2-2t", "cpu-amd-epyc-f25m17-2t")
NEAREST_PROBES = 3


def _ape(pred, true):
    return 100 * np.abs(np.asarray(pred) / np.asarray(true) - 1)


class Device:
    """One device's samples with the features every strategy reads."""

    def __init__(self, slug: str, probe: list[str], profiles: dict[str, np.ndarray]):
        self.slug = slug
        self.samples = load_dataset(f"data/derived/{slug}-fused").samples
        self.by_key = {s.key: s for s in self.samples}
        self.probe = core_set.probe_vector(self.samples, probe)
        self.x = np.stack([aggregates(s, ()) for s in self.samples])
        self.y = np.log([s.label_ms for s in self.samples])
        self.family = np.array([s.family for s in self.samples])
        self.profile = np.stack([profiles[s.key] for s in self.samples])

    def device_features(self, probe_profiles: np.ndarray, probe_flops: np.ndarray,
                        flops: np.ndarray) -> np.ndarray:
        """`[N, 12 + NEAREST_PROBES]`: the centred probe, and per sample the log time of its
        nearest probe samples (by what the graph computes) scaled by the FLOPs ratio."""
        assert self.probe is not None
        d = ((self.profile[:, None, :-1] - probe_profiles[None, :, :-1]) ** 2).sum(-1)
        nearest = np.argsort(d, axis=1)[:, :NEAREST_PROBES]
        phi = self.probe[nearest] + np.log(flops[:, None] / probe_flops[nearest])
        centred = np.broadcast_to(self.probe - self.probe.mean(), (len(flops), len(self.probe)))
        return np.concatenate([centred, phi], axis=1)


def _fit(x, y, seed):
    rng = np.random.default_rng(seed)
    val = rng.random(len(y)) < 0.1
    if val.sum() < 2 or (~val).sum() < 2:
        val = np.zeros(len(y), bool)
        val[:: max(2, len(y) // 3)] = True
    boosters = fit_boosters(x[~val], y[~val], x[val], y[val], seed=seed, seeds=1)
    return lambda z: np.mean([b.predict(z) for b in boosters], axis=0)


def _family_cv(dev: Device, folds: int = 5) -> np.ndarray:
    """`[N]` log ms: each sample predicted by a model fitted on the device's other families."""
    families = np.array(sorted(set(dev.family)))
    fold_of = dict(zip(families, np.random.default_rng(0).permutation(len(families)) % folds))
    fold = np.array([fold_of[f] for f in dev.family])
    out = np.empty(len(dev.y))
    for f in range(folds):
        model = _fit(dev.x[fold != f], dev.y[fold != f], 0)
        out[fold == f] = model(dev.x[fold == f])
    return out


def _shipped(target: Device) -> tuple[Path, np.ndarray]:
    """The shipped checkpoint whose device's probe is nearest the target's (its own left
    out): what `mdot adapt --probe` adapts; and its predictions `[N]` ms of `target`."""
    from mdot_jax.serving.adaptation import nearest_checkpoint
    from mdot_jax.serving.predict import Predictor
    from mdot_jax.storage.shipped import resolve_checkpoint

    mine = {s.key: s.label_ms for s in target.samples}
    path = resolve_checkpoint(nearest_checkpoint(mine, exclude=(target.slug,))[0])
    predictor = Predictor.load(path)
    here = predictor.devices[0]  # the checkpoint's own device: what it was trained on
    preds = predictor.predict_many([(s.seq, dataclasses.replace(s.workload, device=here))
                                    for s in target.samples])
    return path, np.asarray([p.iteration_ms for p in preds])


def _file_reproduces(path: Path, target: Device, idx: list[int], pred: np.ndarray) -> bool:
    """Whether `mdot adapt --from-measurements` on a CSV of the samples `idx` fits what the
    in-process adaptation of the checkpoint's predictions `pred` fits."""
    from mdot_jax.serving.adaptation import adapt_from_measurements

    mine = fit_adaptation(pred[idx], np.exp(target.y[idx]), target.slug)
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / "mine.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "batch_size", "image_size", "seq_len", "precision", "ms"])
            for i in idx:
                s = target.samples[i]
                size = s.workload.input_size
                text = s.seq.input_kind == "tokens"
                seq = Path(tmp) / f"{i}.npz"  # the dataset's sequences are packed
                s.seq.save(seq)
                w.writerow([seq, s.workload.batch_size,
                            "" if text else size, size if text else "", "fp32", s.label_ms])
        theirs = adapt_from_measurements(Path(tmp) / "mine.csv", path, Path(tmp) / "ck")
    return bool(theirs.fit == mine.fit and np.allclose([theirs.a, theirs.b, theirs.loo_mape],
                                                       [mine.a, mine.b, mine.loo_mape]))


def ratios(a_dir: str, b_dir: str) -> dict[str, float]:
    """key -> label on `a` / label on `b`, for the keys both measured."""
    a = {s.key: s.label_ms for s in load_dataset(a_dir).samples}
    b = {s.key: s.label_ms for s in load_dataset(b_dir).samples}
    return {k: a[k] / b[k] for k in sorted(a.keys() & b.keys())}


def compare(a: str, b: str) -> None:
    """How two measured devices differ: the ratio of their labels on the samples both measured,
    overall and by family (whether one scale factor would carry a checkpoint across). Two
    passes of one device compare the same way: how well its labels repeat."""
    r = ratios(a, b)
    if not r:
        raise SystemExit("no common samples")
    v = np.array(list(r.values()))
    q = np.percentile(v, [10, 50, 90])
    log_sd = float(np.std(np.log(v)))
    print(f"{len(v)} common samples: {a} / {b} = {q[1]:.2f} (median), "
          f"p10-p90 {q[0]:.2f}-{q[2]:.2f}, min {v.min():.2f}, max {v.max():.2f}; "
          f"one scale factor leaves {100 * np.mean(np.abs(v / q[1] - 1)):.1f}% MAPE "
          f"(log sd {log_sd:.3f}); within 10%: {100 * np.mean(np.abs(v - 1) <= 0.1):.0f}% "
          f"({100 * np.mean(np.abs(v / q[1] - 1) <= 0.1):.0f}% after the factor)")
    by_family = defaultdict(list)
    for s in load_dataset(a).samples:
        if s.key in r:
            by_family[s.family].append(r[s.key])
    rows = sorted(((float(np.median(x)), f, len(x)) for f, x in by_family.items()))
    print("| family | samples | median ratio |\n|---|---|---|")
    for med, f, n in rows[:8] + [(None, "...", None)] + rows[-8:]:
        print(f"| {f} | {n or ''} | {'' if med is None else f'{med:.2f}'} |")



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out")
    p.add_argument("--k", type=int, nargs="+", default=[0, 5, 10, 20, 50])
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="only compare two measured devices' labels on their common samples")
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        p.error("--out is required (or --compare A B)")

    chosen = core_set.load()
    probe = chosen["probe"]
    first = {s.key: s for s in load_dataset(f"data/derived/{DEVICES[0]}-fused").samples}
    profiles: dict[str, np.ndarray] = {}
    devices = []
    for slug in DEVICES:
        ds = load_dataset(f"data/derived/{slug}-fused").samples
        profiles.update({s.key: core_set.graph_profile(s) for s in ds if s.key not in profiles})
        devices.append(Device(slug, probe, profiles))
    probe_profiles = np.stack([profiles[k] for k in probe])
    probe_flops = np.asarray([first[k].seq.flops for k in probe])

    def flops(dev: Device) -> np.ndarray:
        return np.asarray([s.seq.flops for s in dev.samples])

    rows = []
    for target in devices:
        others = [d for d in devices if d is not target]
        dist = [np.mean(np.abs(d.probe - target.probe)) for d in others]
        nearest = others[int(np.argmin(dist))]
        near_model = _fit(nearest.x, nearest.y, 0)
        xa = np.concatenate([d.x for d in others])
        xa = np.concatenate([xa, np.concatenate(
            [d.device_features(probe_profiles, probe_flops, flops(d)) for d in others])], 1)
        ya = np.concatenate([d.y for d in others])
        aware_model = _fit(xa, ya, 0)
        x_target = np.concatenate([target.x, target.device_features(
            probe_profiles, probe_flops, flops(target))], 1)
        pred = dict(nearest=near_model(target.x), aware=aware_model(x_target),
                    ceiling=_family_cv(target))
        shipped_path, shipped = _shipped(target)
        probe_idx = [target.samples.index(target.by_key[k]) for k in probe]
        probe_families = set(target.family[probe_idx])
        pool = sorted(set(target.family) - probe_families)
        for k in [k for k in args.k if k <= len(pool)]:  # the older CPU has 42 to draw from
            for draw in range(args.draws if k else 1):  # the probe alone: nothing to draw
                rng = np.random.default_rng(draw)
                extra = rng.choice(pool, k, replace=False) if k else []
                idx = probe_idx + [int(rng.choice(np.flatnonzero(target.family == f)))
                                   for f in extra]
                held = set(probe_families) | set(extra)
                test = ~np.isin(target.family, sorted(held))
                true = np.exp(target.y[test])
                res = {"nearest": _ape(np.exp(pred["nearest"][test]), true)}
                base = np.exp(pred["nearest"])
                factor = np.exp(np.mean(target.y[idx] - pred["nearest"][idx]))
                res["scale"] = _ape(base[test] * factor, true)
                for name, key in (("adapt", "nearest"), ("device-aware", "aware")):
                    a = fit_adaptation(np.exp(pred[key][idx]), np.exp(target.y[idx]), target.slug)
                    adapted = a.apply(np.exp(pred[key][test]))
                    res[name] = _ape(adapted, true)
                    inside = (true >= adapted * np.exp(a.lo)) & (true <= adapted * np.exp(a.hi))
                    res[name + " band held %"] = np.array([100 * inside.mean()])
                res["scratch"] = _ape(np.exp(_fit(target.x[idx], target.y[idx], draw)(
                    target.x[test])), true)
                res["ceiling"] = _ape(np.exp(pred["ceiling"][test]), true)
                a = fit_adaptation(shipped[idx], np.exp(target.y[idx]), target.slug)
                res["shipped adapt"] = _ape(a.apply(shipped[test]), true)
                rows.append(dict(device=target.slug, nearest_device=nearest.slug,
                                 shipped_base=shipped_path.name, k=k,
                                 draw=draw, test_samples=int(test.sum()),
                                 **{m: float(v.mean()) for m, v in res.items()}))
                if k == 10 and draw == 0:
                    rows[-1]["file reproduces"] = _file_reproduces(shipped_path, target, idx,
                                                                   shipped)
                print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(probe=probe, rows=rows), indent=1))
    methods = ["nearest", "scale", "adapt", "device-aware", "scratch", "ceiling",
               "shipped adapt"]
    lines = ["| device | k | " + " | ".join(f"{m} MAPE %" for m in methods)
             + " | adapt band held % | device-aware band held % |",
             "|---|---|" + "---|" * (len(methods) + 2)]
    for dev in DEVICES:
        for k in args.k:
            rs = [r for r in rows if r["device"] == dev and r["k"] == k]
            if not rs:
                continue
            mean = {m: np.mean([r[m] for r in rs]) for m in rs[0] if isinstance(rs[0][m], float)}
            lines.append(f"| {dev} | probe + {k} | " + " | ".join(
                f"{mean[m]:.1f}" for m in methods) + f" | {mean['adapt band held %']:.0f} | "
                f"{mean['device-aware band held %']:.0f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(rows, args.k, methods, out)


def _plot(rows, ks, methods, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DEVICES), figsize=(5 * len(DEVICES), 4), sharey=True)
    for ax, dev in zip(axes, DEVICES):
        for m in methods:
            done = [k for k in ks if any(r["device"] == dev and r["k"] == k for r in rows)]
            ax.plot(done, [np.mean([r[m] for r in rows if r["device"] == dev and r["k"] == k])
                           for k in done], marker="o", label=m)
        ax.set_title(f"held out: {dev}")
        ax.set_xlabel("k measured samples besides the probe")
    axes[0].set_ylabel("MAPE % on the device's other families")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "mape_vs_k.png", dpi=120)


if __name__ == "__main__":
    main()
