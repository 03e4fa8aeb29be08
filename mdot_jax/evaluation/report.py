"""The report of an evaluation: each method's errors per fold, the ensembles of its members,
paired ablations, the gaps between views, an error analysis, plots, and the Markdown page."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from converters.vocab import VOCAB
from mdot_jax import writers
from mdot_jax.data.dataset import Dataset
from mdot_jax.evaluation.methods import ALL_METHODS, DEFAULT_METHOD, OP_METHODS, VIEW
from mdot_jax.metrics import regression_metrics


def check_ensembles(combos: Sequence[str]) -> None:
    """Each combo `"a+b"` names methods there are (a member without runs yet is no error: a
    resumed run will add it)."""
    for combo in combos:
        unknown = [n for n in combo.split("+") if n.split(VIEW)[0] not in ALL_METHODS + OP_METHODS]
        if unknown:
            raise ValueError(f"ensemble {combo!r}: unknown method {', '.join(unknown)}")


def ensemble_rows(rows: list[dict], labels: dict[str, float],
                  combos: Sequence[str] = ()) -> list[dict]:
    """Derived runs, nothing fitted: the geometric mean of several runs' predictions on one
    fold (the models regress log time, so members are averaged in log space, equal weights).

    - a method run with n >= 2 seeds on a fold: `ensemble(<method> x<n>)`, over its seeds;
    - each combo `"a+b"`: `ensemble(a+b)`, over methods a and b run with the same seed, on
      the folds where both have run (none yet: no row).
    """
    runs = {(r["method"], r["fold"], r["seed"]): r for r in rows}
    seeds: dict[tuple[str, int], list[int]] = {}
    for m, f, s in runs:
        seeds.setdefault((m, f), []).append(s)
    groups = [(f"ensemble({m} x{len(ss)})", f, 0, [runs[(m, f, s)] for s in sorted(ss)])
              for (m, f), ss in seeds.items() if len(ss) > 1]
    check_ensembles(combos)
    for combo in combos:
        names = combo.split("+")
        groups += [(f"ensemble({combo})", f, s, [runs[(n, f, s)] for n in names])
                   for (m, f, s) in sorted(runs) if m == names[0]
                   and all((n, f, s) in runs for n in names)]
    out = []
    for name, fold, seed, members in groups:
        keys = sorted(members[0]["test_keys"])
        preds = [dict(zip(r["test_keys"], r["pred_ms"])) for r in members]
        if any(sorted(p) != keys for p in preds):
            raise ValueError(f"{name}, fold {fold}: the members were tested on different samples")
        pred = np.exp(np.mean([np.log([p[k] for k in keys]) for p in preds], axis=0))
        out.append(dict(method=name, fold=fold, seed=seed, split=members[0]["split"],
                        metrics=regression_metrics(pred, [labels[k] for k in keys]),
                        fit_s=sum(r["fit_s"] for r in members),
                        predict_ms_per_sample=sum(r["predict_ms_per_sample"] for r in members),
                        test_keys=keys, pred_ms=pred.tolist(),
                        members=[[r["method"], r["seed"]] for r in members]))
    return out


def summarize(rows: list[dict], ds: Dataset, out: str | Path, command: str = "",
              commit: str = "", ensembles: Sequence[str] = ()) -> dict:
    """Mean +- std over folds and seeds per method -> table.md, results.json, plots.
    Seed ensembles and the method `ensembles` ("a+b") are added as derived rows; the folder
    remembers them (`results.json`), so a resumed run that names none, or others, keeps
    those asked for before (the first named is the per-fold table's)."""
    out = Path(out)
    try:
        asked = json.loads((out / "results.json").read_text()).get("ensembles", [])
    except (OSError, ValueError, AttributeError):
        asked = []
    ensembles = list(dict.fromkeys([*ensembles, *asked]))
    views = sorted({r["method"].split(VIEW)[1] for r in rows if VIEW in r["method"]})
    combos = [*ensembles, *("+".join(m + VIEW + v for m in combo.split("+"))
                            for v in views for combo in ensembles)]
    rows = rows + ensemble_rows(rows, {s.key: s.label_ms for s in ds.samples}, combos)
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    summary = {}
    for m, rs in by_method.items():
        keys = ["mae_ms", "rmse_ms", "mape", "median_ape", "p90_ape"]
        summary[m] = {k: float(np.mean([r["metrics"][k] for r in rs])) for k in keys}
        summary[m].update({f"{k}_std": float(np.std([r["metrics"][k] for r in rs]))
                           for k in keys})
        summary[m].update(runs=len(rs), seeds=len({r["seed"] for r in rs}),
                          folds=len({r["fold"] for r in rs}),
                          fit_s=float(np.mean([r["fit_s"] for r in rs])),
                          predict_ms_per_sample=float(np.mean([r["predict_ms_per_sample"]
                                                               for r in rs])))
    # the ablations (often on fewer folds) are compared with mdot in their own table; the
    # library's default is an ablation of the paper's model but belongs in the main one
    order = sorted((m for m in summary if (not m.startswith("mdot-") or m == DEFAULT_METHOD)
                    and VIEW not in m), key=lambda m: summary[m]["mape"])
    lines = [f"Dataset `{ds.root.name}` ({len(ds)} samples, {len(ds.families)} families, "
             f"fingerprint `{ds.fingerprint()}`), split `{rows[0]['split'] if rows else ''}`.",
             f"Command: `{command}`; commit `{commit}`.", "",
             "| method | MAE ms | RMSE ms | MAPE % | median APE % | p90 APE % | folds x seeds "
             "| fit s | predict ms/sample |", "|---|---|---|---|---|---|---|---|---|"]
    for m in order:
        s = summary[m]
        lines.append(f"| {m} | {s['mae_ms']:.2f} ± {s['mae_ms_std']:.2f} | "
                     f"{s['rmse_ms']:.2f} ± {s['rmse_ms_std']:.2f} | "
                     f"{s['mape']:.2f} ± {s['mape_std']:.2f} | {s['median_ape']:.2f} | "
                     f"{s['p90_ape']:.2f} | {s['folds']} x {s['seeds']} | {s['fit_s']:.1f} | "
                     f"{s['predict_ms_per_sample']:.2f} |")
    shipped = f"ensemble({ensembles[0]})" if ensembles else DEFAULT_METHOD
    folds = per_fold(rows, ds, shipped)
    lines += _per_fold_md(shipped, folds)
    ablations = paired_ablations(rows)
    lines += _ablation_md(ablations)
    gaps = view_gaps(rows, {s.key: s.label_ms for s in ds.samples})
    lines += _gaps_md(gaps)
    analyses = [error_analysis(rows, ds, m) for m in dict.fromkeys(["mdot"] + order[:1])
                if m in summary]
    for a in analyses:
        lines += _analysis_md(a)
    writers.replace_text(out / "table.md", "\n".join(lines) + "\n")
    result = dict(dataset=dict(path=str(ds.root), fingerprint=ds.fingerprint(),
                               samples=len(ds)), command=command, commit=commit,
                  neural_budget=rows[0].get("budget") if rows else None, ensembles=ensembles,
                  methods=summary,
                  per_fold={shipped: folds}, ablations=ablations, views=gaps,
                  error_analysis=analyses)
    writers.replace_text(out / "results.json", json.dumps(result, indent=1))
    _plots(rows, ds, out, order)
    return result


def view_gaps(rows: list[dict], labels: dict[str, float]) -> list[dict]:
    """Per method and view: MAPE predicting from the view, and from the training graphs of
    the same samples (a view may lack some), over the (fold, seed) runs of both; the gap."""
    runs = {(r["method"], r["fold"], r["seed"]): r for r in rows}
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for (name, fold, seed), r in runs.items():
        if VIEW not in name:
            continue
        view = name.split(VIEW)[1].split("+")[0].rstrip(")")
        method = name.replace(VIEW + view, "")
        base = runs.get((method, fold, seed))
        if base is None:
            continue
        ref = dict(zip(base["test_keys"], base["pred_ms"]))
        keys = [k for k in r["test_keys"] if k in ref]
        if not keys:
            continue
        truth = [labels[k] for k in keys]
        on_view = dict(zip(r["test_keys"], r["pred_ms"]))
        pairs.setdefault((method, view), []).append(
            (regression_metrics(np.asarray([on_view[k] for k in keys]), truth)["mape"],
             regression_metrics(np.asarray([ref[k] for k in keys]), truth)["mape"]))
    return [dict(method=m, view=v, runs=len(p), mape_view=float(np.mean([a for a, _ in p])),
                 mape_training=float(np.mean([b for _, b in p])),
                 gap=float(np.mean([a - b for a, b in p])))
            for (m, v), p in sorted(pairs.items())]


def _gaps_md(gaps: list[dict]) -> list[str]:
    if not gaps:
        return []
    lines = ["", "Predicting from other views of the same samples (the model trained on "
             "training graphs; MAPE on the samples the view has):", "",
             "| method | view | MAPE % from the view | MAPE % from the training graph | gap "
             "(points) | runs |", "|---|---|---|---|---|---|"]
    lines += [f"| {g['method']} | {g['view']} | {g['mape_view']:.2f} | "
              f"{g['mape_training']:.2f} | {g['gap']:+.2f} | {g['runs']} |" for g in gaps]
    return lines


def per_fold(rows: list[dict], ds: Dataset, method: str) -> list[dict]:
    """`method`'s MAE, RMSE and MAPE fold by fold (means over its seeds), with the number of
    test samples and of held-out families."""
    family = {s.key: s.family for s in ds.samples}
    out = []
    for f in sorted({r["fold"] for r in rows if r["method"] == method}):
        rs = [r for r in rows if r["method"] == method and r["fold"] == f]
        out.append(dict(fold=f, seeds=len(rs), samples=len(rs[0]["test_keys"]),
                        families=len({family[k] for k in rs[0]["test_keys"]}),
                        **{k: float(np.mean([r["metrics"][k] for r in rs]))
                           for k in ("mae_ms", "rmse_ms", "mape")}))
    return out


def _per_fold_md(method: str, folds: list[dict]) -> list[str]:
    if not folds:
        return []
    lines = ["", f"Per fold, `{method}` (mean over seeds):", "",
             "| fold | test samples | held-out families | seeds | MAE ms | RMSE ms | MAPE % |",
             "|---|---|---|---|---|---|---|"]
    for f in folds:
        lines.append(f"| {f['fold']} | {f['samples']} | {f['families']} | {f['seeds']} | "
                     f"{f['mae_ms']:.1f} | {f['rmse_ms']:.1f} | {f['mape']:.2f} |")
    return lines


def paired_ablations(rows: list[dict], reference: str = "mdot") -> list[dict]:
    """Each MDOT variant against `reference` on the (fold, seed) runs both have: MAPE, MAE
    and RMSE means over those runs (variants may cover fewer folds than the main table), and
    `wins`, on how many of them the variant's MAPE is lower."""
    runs = {(r["method"], r["fold"], r["seed"]): r["metrics"] for r in rows}
    ref = {(f, s): m for (name, f, s), m in runs.items() if name == reference}
    out = []
    for variant in sorted({r["method"] for r in rows if r["method"].startswith("mdot-")}):
        shared = sorted(k for (name, *k) in runs if name == variant and tuple(k) in ref)
        if not shared:
            continue
        row = dict(method=variant, runs=len(shared),
                   wins=sum(runs[(variant, *k)]["mape"] < ref[tuple(k)]["mape"] for k in shared))
        for key in ("mape", "mae_ms", "rmse_ms"):
            row[key] = float(np.mean([runs[(variant, *k)][key] for k in shared]))
            row[f"{reference}_{key}"] = float(np.mean([ref[tuple(k)][key] for k in shared]))
        out.append(row)
    return sorted(out, key=lambda r: r["mape"] - r["mdot_mape"])


def _ablation_md(ablations: list[dict]) -> list[str]:
    if not ablations:
        return []
    lines = ["", "Ablations, each against `mdot` on the same folds and seeds (negative delta: "
             "the variant is better):", "",
             "| variant | runs | better on | MAPE % | mdot MAPE % | delta MAPE | MAE ms "
             "| mdot MAE ms |", "|---|---|---|---|---|---|---|---|"]
    for a in ablations:
        lines.append(f"| {a['method']} | {a['runs']} | {a['wins']} | {a['mape']:.2f} | "
                     f"{a['mdot_mape']:.2f} | {a['mape'] - a['mdot_mape']:+.2f} | "
                     f"{a['mae_ms']:.2f} | {a['mdot_mae_ms']:.2f} |")
    return lines


def error_analysis(rows: list[dict], ds: Dataset, method: str, top: int = 8) -> dict:
    """Where `method` errs: MAPE by architecture family, and by operator type (MAPE of the
    test samples whose graph holds the type vs of those that do not, for types present in
    10-90% of the samples, largest difference first)."""
    by_key = {s.key: s for s in ds.samples}
    ape: dict[str, list[float]] = {}
    for r in rows:
        if r["method"] == method:
            for k, p in zip(r["test_keys"], r["pred_ms"]):
                ape.setdefault(k, []).append(100 * abs(p - by_key[k].label_ms) / by_key[k].label_ms)
    keys = sorted(ape)
    err = np.array([np.mean(ape[k]) for k in keys])
    families: dict[str, list[float]] = {}
    for k, e in zip(keys, err):
        families.setdefault(by_key[k].family, []).append(e)
    fam = sorted(({"family": f, "mape": float(np.mean(v)), "n": len(v)}
                  for f, v in families.items()), key=lambda r: -r["mape"])
    present = np.stack([np.bincount(by_key[k].seq.op_type, minlength=len(VOCAB))[:len(VOCAB)] > 0
                        for k in keys]) if keys else np.zeros((0, len(VOCAB)), bool)
    ops = []
    for t in range(2, len(VOCAB)):
        frac = present[:, t].mean() if keys else 0.0
        if 0.1 <= frac <= 0.9:
            ops.append({"op": VOCAB[t], "with": float(err[present[:, t]].mean()),
                        "without": float(err[~present[:, t]].mean()), "share": float(frac)})
    ops.sort(key=lambda r: r["without"] - r["with"])
    layouts: dict[str, list[float]] = {}
    for k, e in zip(keys, err):
        layouts.setdefault(by_key[k].workload.layout, []).append(e)
    return dict(method=method, samples=len(keys), worst_families=fam[:top],
                op_types=ops[:top],
                by_layout={x: dict(mape=float(np.mean(v)), n=len(v))
                           for x, v in sorted(layouts.items())})


def _analysis_md(a: dict) -> list[str]:
    lines = ["", f"Error analysis of `{a['method']}` ({a['samples']} test samples): worst "
             "families " + ", ".join(f"{r['family']} {r['mape']:.1f}% (n={r['n']})"
                                     for r in a["worst_families"]) + ".",
             "Operator types whose presence goes with the largest error: "
             + ", ".join(f"{r['op']} {r['with']:.1f}% vs {r['without']:.1f}% without "
                         f"({100 * r['share']:.0f}% of samples)" for r in a["op_types"]) + ".",
             "By memory layout: " + ", ".join(f"{x} {r['mape']:.1f}% (n={r['n']})"
                                              for x, r in a["by_layout"].items()) + "."]
    return lines


def _plots(rows, ds: Dataset, out: Path, order: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mdot_jax.serving import figures

    label = {s.key: s.label_ms for s in ds.samples}
    family = {s.key: s.family for s in ds.samples}
    n = len(order)
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 4 * ((n + cols - 1)
                                                                                   // cols)),
                             squeeze=False)
    for ax, m in zip(axes.flat, order):
        xs, ys = [], []
        for r in rows:
            if r["method"] == m:
                xs += [label[k] for k in r["test_keys"]]
                ys += r["pred_ms"]
        ax.loglog(xs, ys, ".", ms=3, alpha=0.5)
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_title(m)
        ax.set_xlabel("measured ms")
        ax.set_ylabel("predicted ms")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    figures.save(fig, out / "pred_vs_measured.png")

    best = order[:3]
    fams = sorted({family[k] for r in rows for k in r["test_keys"]})
    fig, ax = plt.subplots(figsize=(max(8, 0.25 * len(fams)), 4))
    width = 0.8 / max(len(best), 1)
    for j, m in enumerate(best):
        err: dict[str, list] = {f: [] for f in fams}
        for r in rows:
            if r["method"] == m:
                for k, p in zip(r["test_keys"], r["pred_ms"]):
                    err[family[k]].append(100 * abs(p - label[k]) / label[k])
        ax.bar(np.arange(len(fams)) + j * width, [np.mean(err[f]) if err[f] else 0
                                                  for f in fams], width, label=m)
    ax.set_xticks(np.arange(len(fams)) + 0.4)
    ax.set_xticklabels(fams, rotation=90, fontsize=6)
    ax.set_ylabel("MAPE %")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    figures.save(fig, out / "error_by_family.png")
