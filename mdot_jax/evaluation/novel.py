"""The novel split's summary (`mdot evaluate --split novel|novel-zoo --novel DIR`): every
method's error on the held-out part of the training data (whole zoo families, random-zoo
architectures) beside its error on the novel architectures, and how often 80% bands hold
there: a band of constant width, and one that widens with the distance to the training data
(`data.novelty`), both fitted on the held-out part only.

Outputs in OUT: `results.json` (per method `mape` and `coverage` on the novel samples, and the
rest), `table.md`, `error_vs_distance.png`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mdot_jax import writers
from mdot_jax.data.dataset import Dataset
from mdot_jax.data.novelty import DistanceBand, Novelty
from mdot_jax.data.splits import is_random_zoo, make_splits
from mdot_jax.evaluation.report import ensemble_rows

PARTS = ("held-out zoo families", "held-out random", "novel hand-written", "novel random")


def part_of(sample) -> str:
    if sample.meta.get("novel"):
        return PARTS[3] if is_random_zoo(sample.arch) else PARTS[2]
    return PARTS[1] if is_random_zoo(sample.arch) else PARTS[0]


def _mape(pred, label) -> float | None:
    return float(100 * np.mean(np.abs(pred / label - 1))) if len(label) else None


def novel_summary(rows: list[dict], ds: Dataset, out: str | Path, command: str = "",
                  ensembles: Sequence[str] = ()) -> str:
    """Writes the novel split's results (module docstring), with the `ensembles` ("a+b") of
    its methods as methods of their own; returns the table."""
    out = Path(out)
    by_key = {s.key: s for s in ds.samples}
    rows = rows + ensemble_rows(rows, {k: s.label_ms for k, s in by_key.items()}, ensembles)
    [(train_idx, _)] = make_splits(ds, rows[0]["split"])  # what every method trained on
    train = [ds.samples[i] for i in train_idx]
    novelty = Novelty.fit(train)
    far = novelty.far([s.family if not is_random_zoo(s.arch) else s.arch for s in train])
    keys = sorted({k for r in rows for k in r["test_keys"]})
    dist = dict(zip(keys, novelty.distance([by_key[k] for k in keys])))
    methods: dict[str, dict] = {}
    plot = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        preds: dict[str, list[float]] = {}
        for r in rows:
            if r["method"] == m:  # seeds: the geometric mean of their predictions
                for k, p in zip(r["test_keys"], r["pred_ms"]):
                    preds.setdefault(k, []).append(np.log(p))
        ks = sorted(preds)
        pred = np.exp([np.mean(preds[k]) for k in ks])
        label = np.asarray([by_key[k].label_ms for k in ks])
        d = np.asarray([dist[k] for k in ks])
        part = np.asarray([part_of(by_key[k]) for k in ks])
        held, new = np.isin(part, PARTS[:2]), np.isin(part, PARTS[2:])
        err = np.log(pred / label)
        wide = DistanceBand.fit(d[held], err[held])
        plain = DistanceBand.fit(d[held], err[held], bins=1)
        plain_w = plain.widths[0]
        lo, hi = wide.interval(pred, d)
        flagged = new & (d > far)  # the warning: how it separates (symmetric) errors
        e = np.abs(err)
        methods[m] = dict(
            mape=_mape(pred[new], label[new]),
            coverage=float(np.mean((label[new] >= lo[new]) & (label[new] <= hi[new]))),
            coverage_constant_band=float(np.mean(np.abs(err[new]) <= plain_w)),
            coverage_held_out=float(np.mean((label[held] >= lo[held]) & (label[held] <= hi[held]))),
            constant_band_halfwidth=float(np.expm1(plain_w)),
            n_novel=int(new.sum()), n_held_out=int(held.sum()),
            **{f"mape {p}": _mape(pred[part == p], label[part == p]) for p in PARTS},
            **{f"n {p}": int((part == p).sum()) for p in PARTS},
            band=dict(edges=wide.edges, widths=wide.widths),
            warned=dict(
                share_of_novel=float(flagged.sum() / max(new.sum(), 1)),
                error_warned=float(100 * np.mean(np.expm1(e[flagged])))
                if flagged.any() else None,
                error_not_warned=float(100 * np.mean(np.expm1(e[new & ~flagged])))
                if (new & ~flagged).any() else None))
        plot[m] = (d, e, part)
    is_far = {k: dist[k] > far for k in keys}
    for combo in ensembles:  # the band a checkpoint of these members ships with
        if f"ensemble({combo})" in methods:  # (its members have all run)
            cov, near = _shipped_band(rows, ds, combo.split("+"), is_far)
            methods[f"ensemble({combo})"].update(coverage_shipped_band=cov,
                                                 coverage_shipped_band_near=near)
    novel_d = np.asarray([dist[k] for k in keys if by_key[k].meta.get("novel")])
    result = dict(command=command, split=rows[0]["split"], train_samples=len(train),
                  dataset=ds.fingerprint(), methods=methods,
                  distance=dict(far=far, novel_median=float(np.median(novel_d)),
                                novel_beyond_far=float(np.mean(novel_d > far))))
    out.mkdir(parents=True, exist_ok=True)
    writers.replace_text(out / "results.json", json.dumps(result, indent=1) + "\n")
    order = sorted(methods, key=lambda m: methods[m]["mape"])
    lines = [f"Split `{result['split']}`: trained on {len(train)} samples; command `{command}`.",
             "", "| method | novel MAPE % | 80% band holds (distance / constant) | "
             + " | ".join(f"{p} MAPE %" for p in PARTS) + " |",
             "|---|---|---|" + "---|" * len(PARTS)]
    for m in order:
        r = methods[m]
        lines.append(f"| {m} | {r['mape']:.1f} | {100 * r['coverage']:.0f}% / "
                     f"{100 * r['coverage_constant_band']:.0f}% | " + " | ".join(
                         "-" if r[f"mape {p}"] is None else f"{r[f'mape {p}']:.1f} ({r[f'n {p}']})"
                         for p in PARTS) + " |")
    shipped = [m for m in order if "coverage_shipped_band" in methods[m]]
    for m in shipped:
        r = methods[m]
        near = r["coverage_shipped_band_near"]
        lines += ["", f"{m}: the band it would ship with (calibrated on the held-out part, "
                  f"binned by disagreement, holding every member) holds on "
                  f"{100 * r['coverage_shipped_band']:.0f}% of the novel samples"
                  + ("" if near is None else f", {100 * near:.0f}% of those not far from "
                     "the training data")]
    writers.replace_text(out / "table.md", "\n".join(lines) + "\n")
    _plot(plot, order[:3], out / "error_vs_distance.png")
    return "\n".join(lines)


def _shipped_band(rows: list[dict], ds: Dataset, members: list[str],
                  far: dict[str, bool]) -> tuple[float, float | None]:
    """How often, on the novel samples, the band a checkpoint of `members` ships with holds:
    calibrated on the held-out part (`calibration.from_results`, binned by the members'
    disagreement), widened to hold every member's prediction, as `Predictor` does; over all
    novel samples, and over those not `far` from the training data (`Novelty.far`)."""
    from mdot_jax.models.ensemble import combine, spread
    from mdot_jax.storage.calibration import from_results, held_out

    cal = from_results(rows, [s for s in ds.samples if not s.meta.get("novel")], members)
    preds = held_out(rows, members)
    novel = [s for s in ds.samples if s.meta.get("novel") and all(s.key in preds[m]
                                                                  for m in members)]
    parts = np.asarray([[preds[m][s.key] for m in members] for s in novel])  # [N, M]
    holds = np.zeros(len(novel), bool)
    for i, (s, p, mid, d) in enumerate(zip(novel, parts, combine(*parts.T), spread(*parts.T))):
        lo, hi = cal.interval(float(mid), s.workload.layout, float(d))
        holds[i] = min(lo, *p) <= s.label_ms <= max(hi, *p)
    near = ~np.asarray([far[s.key] for s in novel])
    return float(holds.mean()), float(holds[near].mean()) if near.any() else None


def _plot(plot: dict, methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mdot_jax.serving import figures

    fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 4), squeeze=False)
    for ax, m in zip(axes.flat, methods):
        d, e, part = plot[m]
        for p in PARTS:
            if (part == p).any():
                ax.plot(d[part == p], 100 * np.expm1(e[part == p]), ".", ms=4, alpha=0.6,
                        label=p)
        ax.set_yscale("log")
        ax.set_xlabel("distance to the nearest training sample")
        ax.set_ylabel("|error| %  (of the log ratio)")
        ax.set_title(m)
        ax.legend(fontsize=7)
    fig.tight_layout()
    figures.save(fig, path)
