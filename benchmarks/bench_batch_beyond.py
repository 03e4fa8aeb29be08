"""Past the largest batch a checkpoint was trained on, how does a step grow? Scored on measured
labels alone ([study](../docs/studies/batch-beyond-trained.md)): in each dataset, the range is
taken to end at `E` and each model's measured time at `E/2` and `E` is extrapolated to each of
its measured larger batches, by two candidate rules (B is `serving.batch_edge`'s).

    python benchmarks/bench_batch_beyond.py
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.serving.batch_edge import growth

# dataset: the batch its range is taken to end at (its measured batches go 4x further); timm's
# RTX 3090 table measures each model at one batch: nothing to extrapolate from there
DATASETS = {"data/cpu-amd-epyc-f26m2-2t": 16, "data/cpu-amd-epyc-f25m17-2t": 16}


def linear(t_half: float, t_edge: float, ratio: float) -> float:
    """A: per sample as fast as at the edge."""
    return t_edge * ratio


def elastic(t_half: float, t_edge: float, ratio: float) -> float:
    """B: the last doubling's growth kept, its exponent clamped to [0, 1]."""
    return t_edge * growth(t_half, t_edge, ratio)


def scored(root: str, edge: int) -> dict[str, tuple[int, float]]:
    """Rows extrapolated and each rule's MAPE (%), for `root` with its range ending at `edge`."""
    steps: dict[tuple, dict[int, float]] = collections.defaultdict(dict)
    for s in load_dataset(root).samples:
        w = s.workload
        model = s.key.rsplit("/", 1)[0]
        steps[(model, w.input_size, w.precision, w.layout)][w.batch_size] = s.label_ms
    errors: dict[str, list[float]] = {"A linear": [], "B elastic": []}
    for times in steps.values():
        if edge not in times or edge // 2 not in times:
            continue
        for b, t in times.items():
            if b > edge:
                for name, rule in zip(errors, (linear, elastic)):
                    errors[name].append(abs(rule(times[edge // 2], times[edge], b / edge) / t - 1))
    return {k: (len(v), 100 * float(np.mean(v))) for k, v in errors.items()}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print("| dataset | range ends at | rows | A linear MAPE % | B elastic MAPE % |")
    print("|---|---|---|---|---|")
    for root, edge in DATASETS.items():
        r = scored(root, edge)
        n = r["A linear"][0]
        print(f"| {root} | {edge} | {n} | {r['A linear'][1]:.1f} | {r['B elastic'][1]:.1f} |")


if __name__ == "__main__":
    main()
