"""Does the price pick the parallel plan that measured fastest? vTrain's splits, ranked.

    python benchmarks/bench_plan_choice.py ../shared/datasets/vtrain \
        --predictions benchmarks/results/vtrain-megatron/predictions.jsonl \
        --out benchmarks/results/plan-choice

`mdot plan --global-batch` ranks every split of a GPU count (tensor x pipeline x data
parallel, micro-batch x accumulation). vTrain measured exactly that: for a model, a GPU count
and a global batch, many TP x DP x PP splits and micro-batches, each an iteration time
(VIA-Research/vTrain, MICRO 2024; read in place, see its README).

The rule, written before this script ran:
- Rows: vTrain's single-node and multi-node rows, priced by `--framework megatron` as
  `bench_vtrain.py` prices them (the committed predictions, made before this rule; nothing
  here prices or fits anything). The Megatron host was chosen on the calibration models
  (hidden x layers 1024 x 12 and 2048 x 24, `bench_machine_host.CALIBRATION`): their groups
  are reported apart; the held-out groups are the number to quote.
- Groups: rows of one model (hidden, heads, layers, sequence), GPU count and global batch;
  groups of at least 3 rows.
- Per group: Spearman's rho between predicted and measured times; regret = the measured time
  of the predicted-fastest row / the measured-fastest - 1; hit = the predicted-fastest row is
  the measured-fastest (ties in measured time count as hits).
- Reported, single-node and multi-node apart: median rho, median and 90th-percentile regret,
  hit rate; beside two choices a user could make without a predictor on the same groups:
  "least model parallelism" (the largest data parallelism, then the smallest TP x PP, then the
  largest micro-batch) and a random row (its expected regret: the group's mean measured time /
  the fastest - 1). Whatever it shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_machine_host import CALIBRATION  # noqa: E402
from bench_vtrain import _rows  # noqa: E402


def _rho(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def groups(rows: list[dict], predicted: dict[str, float]) -> list[dict]:
    """Per group (module docstring): its scope, whether calibration, and the three scores for
    the price and the two baselines."""
    by = defaultdict(list)
    for r in rows:
        if r["key"] in predicted:
            by[(r["multi"], r["hidden"], r["heads"], r["layers"], r["seq"], r["gpus"],
                r["global_batch"])].append(r)
    out = []
    for (multi, hidden, _, layers, *_), g in sorted(by.items()):
        if len(g) < 3:
            continue
        measured = np.array([r["ms"] for r in g])
        price = np.array([predicted[r["key"]] for r in g])
        best = measured.min()
        simple = min(range(len(g)), key=lambda i: (-g[i]["dp"], g[i]["tp"] * g[i]["pp"],
                                                   -g[i]["mb"]))
        chosen = int(np.argmin(price))
        out.append(dict(
            scope="multi" if multi else "single", rows=len(g),
            calibration=not multi and (hidden, layers) in CALIBRATION,
            rho=_rho(price, measured), regret=float(measured[chosen] / best - 1),
            hit=bool(measured[chosen] <= best),
            simple_regret=float(measured[simple] / best - 1),
            simple_hit=bool(measured[simple] <= best),
            random_regret=float(measured.mean() / best - 1)))
    return out


def summary(gs: list[dict]) -> dict:
    if not gs:
        return {}
    col = lambda k: np.array([g[k] for g in gs], np.float64)  # noqa: E731
    return dict(groups=len(gs), rows=int(col("rows").sum()),
                median_rho=float(np.median(col("rho"))),
                median_regret=float(np.median(col("regret"))),
                p90_regret=float(np.percentile(col("regret"), 90)),
                hit_rate=float(col("hit").mean()),
                simple=dict(median_regret=float(np.median(col("simple_regret"))),
                            p90_regret=float(np.percentile(col("simple_regret"), 90)),
                            hit_rate=float(col("simple_hit").mean())),
                random=dict(median_regret=float(np.median(col("random_regret"))),
                            p90_regret=float(np.percentile(col("random_regret"), 90))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="vTrain's folder (../shared/datasets/vtrain)")
    ap.add_argument("--predictions", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    predicted = {}
    for line in args.predictions.read_text().splitlines():
        d = json.loads(line)
        predicted[d["key"]] = float(d["predicted_ms"])
    gs = groups(_rows(args.data), predicted)
    result = dict(
        command="python benchmarks/bench_plan_choice.py ../shared/datasets/vtrain "
                "--predictions benchmarks/results/vtrain-megatron/predictions.jsonl "
                "--out benchmarks/results/plan-choice",
        source="vTrain (VIA-Research/vTrain, MICRO 2024), measured Megatron-DeepSpeed "
               "iterations on A100s, read in place",
        summary={f"{scope}/{part}": summary([g for g in gs if g["scope"] == scope
                                             and g["calibration"] == (part == "calibration")])
                 for scope in ("single", "multi") for part in ("held-out", "calibration")})
    result["summary"] = {k: v for k, v in result["summary"].items() if v}
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "results.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out / "results.json")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
