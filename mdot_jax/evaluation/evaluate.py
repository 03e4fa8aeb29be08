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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from converters.vocab import VOCAB
from mdot_jax import recipes
from mdot_jax.data.aggregates import aggregates
from mdot_jax.data.dataset import Dataset, Sample
from mdot_jax.data.features import MIN_STD, FeatureConfig
from mdot_jax.data.splits import make_splits, split_validation, with_novel
from mdot_jax.kernels.cost_model import OpSumLine
from mdot_jax.metrics import regression_metrics
from mdot_jax.models import ModelConfig
from mdot_jax.models.trained import MAX_Z
from mdot_jax.models.trees import TreeModel
from mdot_jax.storage import checkpoint
from mdot_jax.storage.calibration import Calibration, from_results
from mdot_jax.training.train import TrainConfig
from mdot_jax.training.train import train as train_model
from mdot_jax.training.workflow import score

RESULTS = "results.jsonl"


# ---------------------------------------------------------------------------- aggregates
def _totals(samples: Sequence[Sample]) -> np.ndarray:
    """`[N, 3]`: forward + backward FLOPs, bytes read + written, operator count."""
    out = []
    for s in samples:
        load = s.seq.load.astype(np.float64)
        out.append([load[:, 0].sum() + load[:, 1].sum(), load[:, 2].sum() + load[:, 3].sum(),
                    s.seq.num_ops])
    return np.asarray(out)


# ---------------------------------------------------------------------------- methods
@dataclass
class Method:
    name: str
    seed: int = 0
    budget: TrainConfig = field(default_factory=TrainConfig)
    # where a long fit keeps its per-epoch state (keyword-only: set by the harness)
    resume_dir: Path | None = field(default=None, kw_only=True)

    def fit(self, train: Sequence[Sample]) -> None:
        raise NotImplementedError

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        raise NotImplementedError


@dataclass
class NeuralMethod(Method):
    model_cfg: ModelConfig = field(default_factory=ModelConfig)

    def fit(self, train):
        self.trained = train_model(train, self.model_cfg, self.budget.replace(seed=self.seed),
                                   progress=False, resume_dir=self.resume_dir)

    def predict(self, samples):
        return score(self.trained, samples)[0]


@dataclass
class LightGBMMethod(Method):
    """Gradient-boosted trees on aggregates (`companion.TreeModel`, grid on validation)."""

    def fit(self, train):
        self.model = TreeModel.fit(train, seed=self.seed, val_fraction=self.budget.val_fraction,
                                   val_by=self.budget.val_by)

    def predict(self, samples):
        return self.model.predict(samples)


@dataclass
class AggregateMLPMethod(Method):
    """An MLP on standardised aggregates (Adam, early stopping on the validation part)."""

    hidden: int = 128
    steps: int = 3000

    def fit(self, train):
        import jax
        import jax.numpy as jnp
        import optax

        tr, val = split_validation(train, self.budget.val_fraction, self.seed,
                                   self.budget.val_by)
        self.devices = sorted({s.workload.device for s in train})
        x = np.stack([aggregates(s, self.devices) for s in tr])
        self.mean, self.std = x.mean(0), np.where(x.std(0) > MIN_STD, x.std(0), 1.0)
        self.ymean = float(np.log([s.label_ms for s in tr]).mean())
        self.ystd = float(np.log([s.label_ms for s in tr]).std() or 1.0)
        xs, ys = self._x(tr), np.log([s.label_ms for s in tr]) - self.ymean
        xv, yv = self._x(val), np.log([s.label_ms for s in val]) - self.ymean
        k1, k2 = jax.random.split(jax.random.key(self.seed))
        d = xs.shape[1]
        params = dict(w1=jax.random.normal(k1, (d, self.hidden)) / np.sqrt(d),
                      b1=jnp.zeros(self.hidden),
                      w2=jax.random.normal(k2, (self.hidden, 1)) / np.sqrt(self.hidden),
                      b2=jnp.zeros(1))
        tx = optax.adamw(1e-3, weight_decay=1e-4)
        opt = tx.init(params)

        def f(p, x):
            return (jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])[:, 0]

        @jax.jit
        def step(p, o):
            loss, g = jax.value_and_grad(lambda p: jnp.mean((f(p, xs) - ys) ** 2))(p)
            u, o = tx.update(g, o, p)
            return optax.apply_updates(p, u), o, loss

        best = (np.inf, params)
        for i in range(self.steps):
            params, opt, _ = step(params, opt)
            if i % 50 == 0:
                err = float(np.mean(np.abs(np.expm1(np.asarray(f(params, xv)) - yv))))
                if err < best[0]:
                    best = (err, params)
        self.params, self.f = best[1], f

    def _x(self, samples):
        return (np.stack([aggregates(s, self.devices) for s in samples]) - self.mean) / self.std

    def predict(self, samples):
        y = np.asarray(self.f(self.params, self._x(samples)), np.float64)
        # as for the neural methods (trained.predict_samples): never inf from extrapolation
        return np.exp(np.clip(y, -MAX_Z * self.ystd, MAX_Z * self.ystd) + self.ymean)


@dataclass
class FittedFormulaMethod(Method):
    """`analytic` or `roofline`: a formula in a few constants fitted with
    differential evolution on mean squared log error + a small L2 penalty on the constants."""

    kind: str = "analytic"
    l2: float = 1e-4

    def _predict(self, c, t):
        flops, nbytes, ops = t[:, 0], t[:, 1], t[:, 2]
        if self.kind == "roofline":  # c = log(1/peak), log(1/bandwidth)
            return np.exp(c[0]) * flops + np.exp(c[1]) * nbytes
        return np.exp(c[0]) + np.exp(c[1]) * flops + np.exp(c[2]) * nbytes + np.exp(c[3]) * ops

    def fit(self, train):
        from scipy.optimize import differential_evolution

        t, y = _totals(train), np.log([s.label_ms for s in train])
        n = 2 if self.kind == "roofline" else 4
        center = -20.0 if self.kind == "roofline" else -10.0

        def cost(c):
            pred = np.log(np.maximum(self._predict(c, t), 1e-12))
            return np.mean((pred - y) ** 2) + self.l2 * np.sum((c - center) ** 2) / n

        res = differential_evolution(cost, [(-50.0, 10.0)] * n, seed=self.seed, tol=1e-8,
                                     maxiter=300, polish=True)
        self.c = res.x

    def predict(self, samples):
        return self._predict(self.c, _totals(samples))


@dataclass
class OpSumMethod(Method):
    """`op-sum`: the summed predicted operator times of the graph (the kernel cost model,
    `--op-costs`) in the line `models.kernels.OpSumLine` fitted on the training samples: what an
    op-grounded checkpoint carries as its third member. `op-sum-params`: the line with a
    parameter term (docs/studies/op-sum-params.md)."""

    def fit(self, train):
        self.line = OpSumLine.fit(train, params=self.name == "op-sum-params")

    def predict(self, samples):
        return self.line.predict(samples)


def make_method(name: str, seed: int, budget: TrainConfig) -> Method:
    neural = recipes.method_models()
    base = neural["mdot"]
    if name in neural:
        return NeuralMethod(name, seed, budget, model_cfg=neural[name])
    other = {"lightgbm": lambda: LightGBMMethod(name, seed, budget),
             "mlp": lambda: AggregateMLPMethod(name, seed, budget),
             "analytic": lambda: FittedFormulaMethod(name, seed, budget, kind="analytic"),
             "roofline": lambda: FittedFormulaMethod(name, seed, budget, kind="roofline"),
             "op-sum": lambda: OpSumMethod(name, seed, budget),
             "op-sum-params": lambda: OpSumMethod(name, seed, budget),
             "mdot-relative": lambda: NeuralMethod(name, seed, budget.replace(loss="relative"),
                                                   model_cfg=base),
             "mdot-pe-none-l1": lambda: NeuralMethod(name, seed, budget.replace(loss="l1"),
                                                     model_cfg=ModelConfig())}
    if name not in other:
        raise ValueError(f"unknown method {name!r}: choose from {sorted([*neural, *other])}")
    return other[name]()


VIEW = "@"  # `<method>@<view>`: a method's predictions from another view of the samples
DEFAULT_METHOD = "mdot-pe-none"  # the MDOT row of the main table besides the paper's (`mdot`)
ALL_METHODS = ("mdot", "lightgbm", "mlp", "per_op", "gnn", "lstm", "analytic", "roofline",
               "mdot-pe-none", "mdot-pe-sinusoidal", "mdot-pe-depth", "mdot-pe-laplacian",
               "mdot-pe-random_walk", "mdot-pe-distance_bias", "mdot-concat", "mdot-per_op",
               "mdot-relative", "mdot-pe-none-l1")
# need operator times (`--op-costs`): not in "all"
OP_METHODS = ("op-sum", "op-sum-params")


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
    confirm on folds that a decision was not tuned on.
    """
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
    for combo in combos:
        names = combo.split("+")
        unknown = [n for n in names if n.split(VIEW)[0] not in ALL_METHODS + OP_METHODS]
        if unknown:  # a member without runs yet is no error: a resumed run will add it
            raise ValueError(f"ensemble {combo!r}: unknown method {', '.join(unknown)}")
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
    (out / "table.md").write_text("\n".join(lines) + "\n")
    result = dict(dataset=dict(path=str(ds.root), fingerprint=ds.fingerprint(),
                               samples=len(ds)), command=command, commit=commit,
                  neural_budget=rows[0].get("budget") if rows else None, ensembles=ensembles,
                  methods=summary,
                  per_fold={shipped: folds}, ablations=ablations, views=gaps,
                  error_analysis=analyses)
    (out / "results.json").write_text(json.dumps(result, indent=1))
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
    fig.savefig(out / "pred_vs_measured.png", dpi=90)
    plt.close(fig)

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
    fig.savefig(out / "error_by_family.png", dpi=90)
    plt.close(fig)


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
