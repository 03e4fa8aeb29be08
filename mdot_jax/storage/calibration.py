"""Error bands for predictions, measured on held-out model families.

A leave-family-out evaluation (`mdot evaluate --split family`) predicts every sample of a
dataset with a model that never saw its family. `Calibration` keeps the spread of
log(measured / predicted) of those predictions, per memory layout (one layout can be harder
to predict than another) and, within a layout, in bins of the disagreement between the
members of the prediction (the network, its LightGBM companion and, op-grounded, the
operator sum): `companion.spread`, max |log(t_i / t_j)|, since the error is larger where
they disagree (docs/architecture.md, Error bands). A new
prediction `p` falls in a bin by its layout and its own disagreement and gets that bin's band
`[p * exp(lo), p * exp(hi)]`, which held `COVER` of the bin's held-out predictions; a layout
the evaluation did not have gets no band.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mdot_jax.data.dataset import Sample
from mdot_jax.models.ensemble import combine, spread

EDGES = (0.5, 0.9)  # quantiles of the disagreement at which the bins split
COVER = 0.8  # share of held-out predictions inside a band (10th to 90th percentile)


@dataclass(frozen=True)
class Band:
    upto: float | None  # the bin's largest disagreement (`companion.spread`); None: no limit
    lo: float  # 10th percentile of log(measured / predicted) in the bin
    hi: float  # 90th percentile
    median_ape: float  # median absolute percentage error in the bin
    n: int  # held-out predictions in the bin

    def interval(self, ms: float) -> tuple[float, float]:
        return ms * float(np.exp(self.lo)), ms * float(np.exp(self.hi))


@dataclass(frozen=True)
class Calibration:
    """Per layout, bands in increasing disagreement (one band when the prediction has one
    member, or the disagreement is not `binned`)."""

    bands: dict[str, tuple[Band, ...]]  # layout -> bands
    methods: tuple[str, ...]  # the evaluated methods whose (geometric-mean) prediction it is
    source: str = ""  # where the held-out predictions came from

    def band(self, layout: str, disagreement: float | None) -> Band | None:
        """The band of a prediction, or None for a layout without held-out predictions."""
        d = disagreement or 0.0
        bands = self.bands.get(layout, ())
        return next((b for b in bands if b.upto is None or d <= b.upto), None)

    def interval(self, ms: float, layout: str, disagreement: float | None = None
                 ) -> tuple[float, float] | None:
        b = self.band(layout, disagreement)
        return b.interval(ms) if b else None

    def labels(self, layout: str) -> list[str]:
        """Each band's range of disagreement, in percent: "<= 7%", "7-24%", "> 24%"."""
        pct = [f"{np.expm1(b.upto or 0.0) * 100:.0f}" for b in self.bands[layout][:-1]]
        if not pct:
            return ["any"]
        return [f"<= {pct[0]}%", *(f"{a}-{b}%" for a, b in zip(pct, pct[1:])), f"> {pct[-1]}%"]

    def to_json(self) -> dict:
        return dict(bands={k: [dataclasses.asdict(b) for b in v] for k, v in self.bands.items()},
                    methods=list(self.methods), source=self.source, cover=COVER)

    @classmethod
    def from_json(cls, d: dict) -> Calibration:
        return cls({k: tuple(Band(**b) for b in v) for k, v in d["bands"].items()},
                   tuple(d["methods"]), d["source"])


def fit_bands(pred_ms: np.ndarray, measured_ms: np.ndarray,
              disagreement: np.ndarray | None) -> tuple[Band, ...]:
    """Bands from held-out predictions `[N]`, their measurements `[N]` and (several members)
    their members' disagreement `[N]`."""
    r = np.log(np.asarray(measured_ms, np.float64) / np.asarray(pred_ms, np.float64))
    ape = np.abs(np.expm1(-r)) * 100  # |pred / measured - 1|
    d = np.zeros_like(r) if disagreement is None else np.asarray(disagreement, np.float64)
    # edges are observed values (no empty bin between two), below the largest
    edges = [] if disagreement is None else \
        [float(e) for e in np.unique(np.quantile(d, EDGES, method="inverted_cdf")) if e < d.max()]
    bands: list[Band] = []
    below = -np.inf
    for upto in [*edges, None]:
        m = (d > below) & (d <= (np.inf if upto is None else upto))
        lo, hi = np.quantile(r[m], [(1 - COVER) / 2, (1 + COVER) / 2])
        bands.append(Band(upto, float(lo), float(hi), float(np.median(ape[m])), int(m.sum())))
        below = np.inf if upto is None else upto
    return tuple(bands)


def held_out(rows: list[dict], methods: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per method, sample key -> predicted ms, from its result rows on its lowest seed."""
    preds: dict[str, dict[str, float]] = {m: {} for m in methods}
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        if not rs:
            raise ValueError(f"no results of {m!r} (have: "
                             f"{', '.join(sorted({r['method'] for r in rows})) or 'none'})")
        seed = min(r["seed"] for r in rs)
        for r in rs:
            if r["seed"] == seed:
                preds[m].update(zip(r["test_keys"], r["pred_ms"]))
    return preds


def from_results(rows: list[dict], samples: Sequence[Sample], methods: Sequence[str],
                 source: str = "", binned: bool = True) -> Calibration:
    """Bands from an evaluation's result rows (`evaluate.read_results`) on `samples` (their
    measured times and layouts): the geometric mean of `methods` (one to three), each on
    its lowest seed, over every held-out sample; one band per layout unless several methods
    are `binned` by their disagreement."""
    if not 1 <= len(methods) <= 3:
        raise ValueError(f"a calibration is of one to three methods, not {len(methods)}")
    preds = held_out(rows, methods)
    shared = set.intersection(*(set(p) for p in preds.values()))
    held = [s for s in samples if s.key in shared]
    if not held:
        raise ValueError(f"the results of {', '.join(methods)} share no measured sample")
    bands = {}
    for layout in sorted({s.workload.layout for s in held}):
        group = [s for s in held if s.workload.layout == layout]
        members = [np.array([preds[m][s.key] for s in group]) for m in methods]  # M x [N]
        bands[layout] = fit_bands(
            combine(*members), np.array([s.label_ms for s in group]),
            spread(*members) if len(methods) > 1 and binned else None)
    return Calibration(bands, tuple(methods), source)
