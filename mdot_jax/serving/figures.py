"""Figures a user would rather look at than read, each written atomically (a temporary file
beside the target, then a rename): one job's predictions over batch sizes or GPU counts
(`predictions`); the plans' time against cost is `serving.plan_plot`'s, saved here."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mdot_jax import writers
from mdot_jax.serving.prediction import Prediction


def pyplot() -> Any:
    """matplotlib's pyplot drawing off screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain_log(axis: Any, values: Sequence[float]) -> None:
    """`axis` on a log scale, ticked in plain numbers within `values`' range: at 1, 2 and 5
    times the powers of ten it spans, finer where that gives fewer than three (an axis
    spanning less than a decade read "10^5" alone)."""
    from matplotlib import ticker

    lo, hi = min(values), max(values)
    if lo <= 0:  # nothing to draw on a log scale: left linear
        return
    ticks: list[float] = []
    for subs in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 7)):
        ticks = [s * 10.0 ** e for e in range(math.floor(math.log10(lo)),
                                              math.ceil(math.log10(hi)) + 1)
                 for s in subs if lo <= s * 10.0 ** e <= hi]
        if len(ticks) >= 3:
            break
    else:  # a narrow range: four steps across it, to two figures
        ticks = sorted({float(f"{lo * (hi / lo) ** (i / 3):.2g}") for i in range(4)})
    axis.axes.set(**{f"{axis.axis_name}scale": "log"})
    axis.set_ticks(ticks, [f"{t:,.6g}" for t in ticks])
    axis.set_minor_locator(ticker.NullLocator())


def save(fig: Any, path: str | Path) -> None:
    """`fig` written to `path` in the format its suffix names, replacing it in one step."""
    tmp = writers.temporary(path, Path(path).suffix)  # the format by its name; then renamed
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
    finally:
        pyplot().close(fig)
        tmp.unlink(missing_ok=True)


def predictions(rows: Sequence[Prediction], path: str | Path, model: str = "") -> None:
    """Throughput and memory a GPU of one job's predictions over its batch sizes, or its GPU
    counts where those vary (each count's scaling efficiency written by it): the 80% band
    where the predictions carry one, the device's memory drawn and the steps past it
    marked."""
    over = "gpus" if len({r.gpus for r in rows}) > 1 else "batch_size"
    rows = sorted(rows, key=lambda r: getattr(r, over))
    xs = [getattr(r, over) for r in rows]
    tokens = all(r.tokens for r in rows)
    per = [r.tokens if tokens else 1 for r in rows]  # what a sample counts
    rate = [r.samples_per_s * k for r, k in zip(rows, per)]
    what = "GPUs" if over == "gpus" else "batch size (per GPU)"
    fig, (speed, memory) = pyplot().subplots(1, 2, figsize=(9.5, 3.8))
    speed.plot(xs, rate, "o-", color="C0", label="predicted")
    bands = [r.interval_ms for r in rows]
    if all(bands):  # a slower step is a lower rate
        speed.fill_between(xs, *([1e3 * r.global_batch * k / band[end]
                                  for r, k, band in zip(rows, per, bands) if band]
                                 for end in (1, 0)), color="C0", alpha=0.2, label="80% band")
    if over == "gpus":  # the share not waiting on communication or a bubble; log-log, linear
        for x, y, r in zip(xs, rate, rows):  # scaling a straight line
            speed.annotate(f"{r.scaling_efficiency:.0%}", (x, y), fontsize=7,
                           xytext=(0, 6), textcoords="offset points", ha="center")
        plain_log(speed.yaxis, rate)
    memory.plot(xs, [r.memory_gb for r in rows], "o-", color="C1", label="predicted peak")
    late = [i for i, r in enumerate(rows) if not r.fits]
    for ax, ys in ((speed, rate), (memory, [r.memory_gb for r in rows])):
        if late:
            ax.scatter([xs[i] for i in late], [ys[i] for i in late], marker="x", s=60,
                       color="C3", zorder=3, label="does not fit")
    if (limit := rows[0].memory_limit_gb) is not None:
        memory.axhline(limit, ls="--", color="C3", lw=1, label=f"the GPU's {limit:g} GB")
    speed.set(xlabel=what, ylabel="tokens/s" if tokens else "samples/s", title="throughput")
    memory.set(xlabel=what, ylabel="GB per GPU", title="memory")
    for ax in (speed, memory):
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    fig.suptitle(f"{model or 'the model'} on {rows[0].device}", fontsize=10)
    fig.tight_layout()
    save(fig, path)
