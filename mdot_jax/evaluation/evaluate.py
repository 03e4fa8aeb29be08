"""Evaluation harness: every method on identical folds, one table, plots.

Methods (all see the same training samples, validation carve-out and seeds):
- MDOT and its ablations: `mdot` (the paper's model: positional encodings PAPER_PE),
  `mdot-pe-<kind>` (one positional encoding, or none: `mdot-pe-none` is the library's
  default model), `mdot-concat` (concat fusion), `mdot-per_op` (per-operator readout),
  `mdot-relative` (relative-error loss instead of squared log error), `mdot-pe-none-l1` (the
  default model with the absolute log error, the LightGBM companion's loss);
- neural baselines trained by the same trainer and budget: `lstm`, `gnn`, `per_op`;
- configuration-based on model-level aggregates: `lightgbm`, `mlp`;
- `analytic`: t = a + b * FLOPs + c * bytes + d * ops, constants fitted by
  `scipy.optimize.differential_evolution` on a regularised log-error cost;
- `roofline`: t = FLOPs / peak + bytes / bandwidth, peak and bandwidth fitted the same way.
Results go to `OUT/results.jsonl` one line per (method, fold, seed) as soon as it finishes,
so a re-run resumes; `summarize` turns them into `OUT/table.md`, `OUT/results.json` and plots.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mdot_jax import writers
from mdot_jax.data.dataset import Dataset
from mdot_jax.data.features import FeatureConfig
from mdot_jax.data.splits import make_splits, with_novel
from mdot_jax.evaluation.methods import ALL_METHODS, VIEW, make_method
from mdot_jax.metrics import regression_metrics
from mdot_jax.storage import checkpoint
from mdot_jax.storage.calibration import Calibration, from_results
from mdot_jax.training.train import TrainConfig

RESULTS = "results.jsonl"


# ---------------------------------------------------------------------------- harness
def run(ds: Dataset, out: str | Path, *, split: str = "family", folds: int = 5,
        seeds: int = 1, methods: Sequence[str] = ALL_METHODS,
        budget: TrainConfig = TrainConfig(), only_folds: Sequence[int] | None = None,
        op_samples: Sequence[dict] | None = None, views: Mapping[str, Dataset] | None = None,
        fold_seed: int = 0, progress: bool = True) -> list[dict]:
    """Runs every (method, fold, seed) not yet in `out/results.jsonl`; returns all rows.

    `only_folds` restricts the run to some of the `folds` folds (the split is unchanged): the
    ablations, for instance, when all folds would cost too much. With `op_samples` (operator
    samples of the dataset's device), every method is op-grounded: per fold, a kernel cost
    model fitted on the operators drawn from the fold's training families only (an operator
    first seen in a held-out family's graph is left out) prices every operator.

    `views` (name -> a copy of `ds` with other graphs of the same samples, e.g. inference
    exports, `mdot dataset resequence --view`): each fitted model also predicts its test
    samples from each view, as rows of method `<method>@<name>` on the samples the view has.

    `fold_seed` draws another partition into folds (0: the one every table so far uses), to
    confirm on folds that a decision was not tuned on. A second run into `out` at once is
    refused, as is a folder of other files.
    """
    out = Path(out)
    writers.refuse_others(out, (RESULTS,), "an evaluation's results")
    out.mkdir(parents=True, exist_ok=True)
    with writers.acquire(out / ".lock", str(out)):
        return _run(ds, out, split, folds, seeds, methods, budget, only_folds, op_samples,
                    views, fold_seed, progress)


def _run(ds: Dataset, out: Path, split: str, folds: int, seeds: int, methods: Sequence[str],
         budget: TrainConfig, only_folds: Sequence[int] | None,
         op_samples: Sequence[dict] | None, views: Mapping[str, Dataset] | None,
         fold_seed: int, progress: bool) -> list[dict]:
    """`run`'s work, under its lock."""
    from tqdm import tqdm

    path = out / RESULTS
    rows = _read(path)
    stale = {r["dataset"] for r in rows} - {ds.fingerprint()}
    if stale:  # the folds would differ: never mix results of two versions of a dataset
        raise ValueError(f"{out}: results of dataset version(s) {sorted(stale)}, but "
                         f"{ds.root} is version {ds.fingerprint()}; use a new --out")
    seqs = ds.sequences_fingerprint()
    stale = {r["sequences"] for r in rows if "sequences" in r and VIEW not in r["method"]} - {
        seqs}
    if stale:  # same measurements, converted differently (e.g. a resequenced copy)
        raise ValueError(f"{out}: results of operator sequences {sorted(stale)}, but "
                         f"{ds.root} has sequences {seqs}; use a new --out")
    stale = {r.get("fold_seed", 0) for r in rows} - {fold_seed}
    if stale:
        raise ValueError(f"{out}: results on the folds of fold seed {sorted(stale)}, this run "
                         f"has {fold_seed}; use a new --out")
    done = {(r["method"], r["fold"], r["seed"]) for r in rows}
    splits = make_splits(ds, split, folds, seed=fold_seed)  # identical folds for every method
    fold_keys = [{ds.samples[i].key for i in test} for _, test in splits]
    for r in rows:  # never one table over two sets of folds (another split, or a changed rule)
        if (r["split"] != split or r["fold"] >= len(fold_keys)
                or not set(r["test_keys"]) <= fold_keys[r["fold"]]):
            raise ValueError(f"{out}: {r['method']} fold {r['fold']} was tested on other "
                             f"samples than fold {r['fold']} of this {split} split (another "
                             "split, or a changed split rule); use a new --out")
    # the comparison first (every fold), the MDOT ablations after it: a stopped run has
    # complete folds of the main table
    ablation = [m for m in methods if m.startswith("mdot-")]
    main = [m for m in methods if m not in ablation]
    fold_ids = range(len(splits)) if only_folds is None else sorted(set(only_folds))
    if any(not 0 <= f < len(splits) for f in fold_ids):
        raise ValueError(f"folds {list(fold_ids)}: the split has folds 0-{len(splits) - 1}")
    if views and op_samples:
        raise ValueError("views are predicted without operator costs: run them apart")
    views = dict(views or {})
    view_index = {v: {s.key: s for s in vds.samples} for v, vds in views.items()}
    jobs = [(m, f, s) for group in (main, ablation) for s in range(seeds)
            for f in fold_ids for m in group
            if any((name, f, s) not in done for name in [m, *(m + VIEW + v for v in view_index)])]
    for m in methods:
        make_method(m, 0, budget)  # unknown names fail before any work
    longest = FeatureConfig().buckets[-1]  # what the sequence models can hold
    ops_id = _op_samples_id(op_samples) if op_samples else None
    stale = {r.get("op_costs") for r in rows} - {ops_id}
    if stale:
        raise ValueError(f"{out}: results with operator data {sorted(map(str, stale))}, this "
                         f"run has {ops_id}; use a new --out")
    attached = None
    for method_name, fold, seed in tqdm(jobs, desc="evaluate", disable=not progress):
        train_idx, test_idx = splits[fold]
        if op_samples and attached != fold:
            name = f"fold{fold}" if fold_seed == 0 else f"folds{fold_seed}-fold{fold}"
            _attach_fold_costs(ds, op_samples, {ds.samples[i].family for i in test_idx},
                               out / ".costs" / f"{name}.json.xz")
            attached = fold
        # every method sees the same samples: those the sequence models can hold
        train = [ds.samples[i] for i in train_idx if ds.samples[i].seq.num_ops <= longest]
        test = [ds.samples[i] for i in test_idx if ds.samples[i].seq.num_ops <= longest]
        method = make_method(method_name, seed, budget)
        method.resume_dir = out / ".resume" / f"{method_name}-fold{fold}-seed{seed}"
        t0 = time.perf_counter()
        method.fit(train)
        t1 = time.perf_counter()
        pred = np.asarray(method.predict(test), np.float64)
        t2 = time.perf_counter()
        row = dict(method=method_name, fold=fold, seed=seed, split=split,
                   metrics=regression_metrics(pred, [s.label_ms for s in test]),
                   fit_s=round(t1 - t0, 2), predict_ms_per_sample=1e3 * (t2 - t1) / len(test),
                   test_keys=[s.key for s in test], pred_ms=pred.tolist(),
                   excluded_too_long=len(test_idx) - len(test),
                   budget=dataclasses.asdict(budget),
                   dataset=ds.fingerprint(), sequences=seqs, op_costs=ops_id,
                   fold_seed=fold_seed)
        new = [row]
        for v, index in view_index.items():  # the same model, the samples' other graphs
            seen = [index[s.key] for s in test if s.key in index]
            seen = [s for s in seen if s.seq.num_ops <= longest]
            if not seen:  # this fold's samples all failed to export that way
                continue
            pred = np.asarray(method.predict(seen), np.float64)
            new.append(dict(row, method=method_name + VIEW + v, test_keys=[s.key for s in seen],
                            pred_ms=pred.tolist(), excluded_too_long=len(test) - len(seen),
                            metrics=regression_metrics(pred, [s.label_ms for s in seen]),
                            sequences=views[v].sequences_fingerprint()))
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in new if (r["method"], fold, seed) not in done)
        shutil.rmtree(method.resume_dir, ignore_errors=True)
    return list(_read(path))


def _op_samples_id(op_samples: Sequence[dict]) -> str:
    import hashlib

    keys = "\n".join(sorted(f"{d['key']}:{d['label_ms']:.6g}" for d in op_samples))
    return hashlib.sha256(keys.encode()).hexdigest()[:16]


def _attach_fold_costs(ds: Dataset, op_samples: Sequence[dict], test_families: set[str],
                       path: Path) -> None:
    """Prices every operator of `ds` with a cost model fitted without the operators first
    drawn from `test_families` (kept at `path`, reused on resume)."""
    from mdot_jax.data.dataset import family_of
    from mdot_jax.kernels.cost_model import CostModel, attach

    if path.exists():
        model = CostModel.load(path)
    else:
        keep = [d for d in op_samples if d["source"] == "loss"
                or family_of(d["source"].split("/")[0]) not in test_families]
        model = CostModel.fit(keep, seed=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
    attach([s.seq for s in ds.samples], model)


def source_commit() -> str:
    """The git commit of the code that ran, read from the repository the package was
    installed from (editable installs); "" where there is none."""
    git = Path(__file__).resolve().parents[2] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:8]
        ref = head.removeprefix("ref: ")
        if (git / ref).exists():
            return (git / ref).read_text().strip()[:8]
        packed = (git / "packed-refs").read_text().splitlines()
        return next((line.split()[0][:8] for line in packed if line.endswith(" " + ref)), "")
    except OSError:
        return ""


def read_results(out: str | Path) -> list[dict]:
    """The rows `run` has written to `out` so far."""
    return _read(Path(out) / RESULTS)


def _read(path: Path):
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # torn last line of a killed run
    return rows


def calibrate(path: str | Path, results_dir: str | Path, ds: Dataset,
              methods: tuple[str, ...] | None = None, novel: Dataset | None = None) -> Calibration:
    """Error bands for the checkpoint at `path` from a held-out evaluation of the same recipe
    on the same dataset: leave-family-out (`mdot evaluate --split family`), or the held-out
    part of the novel split (`--split novel`, with its `novel` dataset: whole zoo families and
    random-zoo architectures left out; its novel samples never calibrate). `methods` default
    to the checkpoint's members (`member_methods`; as many methods as members, or the bands
    would be another prediction's). Written into the checkpoint's metadata and model card."""
    meta = checkpoint.read_metadata(path)
    rows = read_results(results_dir)
    if not rows:
        raise ValueError(f"{results_dir}: no evaluation results")
    splits = {r["split"] for r in rows}
    if splits == {"novel"} and novel is None:
        raise ValueError(f"{results_dir}: results of a novel split: name its novel dataset "
                         "(--novel)")
    if splits not in ({"family"}, {"novel"}):
        raise ValueError(f"{results_dir}: results of a {'/'.join(sorted(splits))} split; the "
                         "bands are for unseen model families (evaluate with --split family "
                         "or novel)")
    evaluated = with_novel(ds, novel) if splits == {"novel"} else ds
    fingerprints = {ds.fingerprint(), meta["dataset"].get("fingerprint")}
    fingerprints |= {r["dataset"] for r in rows} - {evaluated.fingerprint()}
    if len(fingerprints) > 1:
        raise ValueError(f"the checkpoint, the dataset {ds.root} and the results in "
                         f"{results_dir} are not of one dataset (fingerprints "
                         f"{sorted(map(str, fingerprints))})")
    members = checkpoint.member_methods(meta)
    methods = methods or members
    if len(methods) != len(members):  # else the bands would describe another prediction
        raise ValueError(f"{path} predicts with {' x '.join(members)}: give as many methods, "
                         f"not {', '.join(methods)}")
    how = "leave-family-out" if splits == {"family"} else "held-out part of the novel split"
    cal = from_results(rows, ds.samples, methods,  # ds's samples: never a novel one
                       source=f"{Path(results_dir).name}, {how}")
    checkpoint.attach_calibration(path, cal)
    return cal
