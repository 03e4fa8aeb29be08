"""Figures a user would rather look at than read, each written atomically (a temporary file
beside the target, then a rename): one job's predictions over batch sizes or GPU counts
(`predictions`); where one prediction's time and memory go (`step`); the plans' time against
cost is `serving.plan_plot`'s, saved here."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mdot_jax import writers
from mdot_jax.readable import number
from mdot_jax.serving.memory import MEMORY_PARTS, MEMORY_SAID
from mdot_jax.serving.prediction import Prediction, by_layer


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
        fig.savefig(tmp, dpi=120, bbox_inches="tight")  # legends outside the axes too
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


DRAWN = 30  # operators a figure names legibly; more are listed, not drawn


def step(p: Prediction, path: str | Path, model: str = "", top: int = 0) -> None:
    """Where one prediction's iteration goes by phase (forward, backward, update,
    communication, ...; one bar with its 80% band where it has no phases) and its memory a
    GPU by what holds it against the device's; with `top`, its `top` costliest operators
    summed over the layers of a stack (`by_layer`), at most `DRAWN`."""
    ops = by_layer(p.operators)[:top] if top and p.operators else []
    listed, ops = len(ops), ops[:DRAWN]
    fig, axes = pyplot().subplots(1, 3 if ops else 2, figsize=(
        13 if ops else 9.5, max(3.8, 1.6 + 0.11 * len(ops))),
                                  gridspec_kw={"width_ratios": [1, 1, 1.3][:3 if ops else 2]})
    time, memory = axes[0], axes[1]
    _stacked(time, p.phases or {"iteration": p.iteration_ms}, "ms")
    if not p.phases and p.interval_ms:
        lo, hi = p.interval_ms
        time.errorbar([p.iteration_ms], [0], xerr=[[p.iteration_ms - lo], [hi - p.iteration_ms]],
                      color="k", capsize=4, label="80% band")
        time.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28),
                    frameon=False)
    time.set(title=f"an iteration: {number(p.iteration_ms)} ms", xlabel="ms")
    parts = {MEMORY_SAID[k]: v for k in MEMORY_PARTS if (v := p.memory_parts.get(k, 0)) > 0} \
        or {"memory": p.memory_gb}
    _stacked(memory, parts, "GB")
    if (limit := p.memory_limit_gb) is not None:
        memory.axvline(limit, ls="--", color="C3", lw=1)
        memory.annotate(f"the GPU's {limit:g} GB", (limit, 0.4), fontsize=7, color="C3",
                        ha="right", xytext=(-3, 0), textcoords="offset points")
        memory.set_xlim(0, 1.08 * max(limit, p.memory_gb))
    memory.set(title=f"memory a GPU: {number(p.memory_gb)} GB" + (
        ": does not fit" if not p.fits else ": tight" if p.tight else ""), xlabel="GB")
    if ops:
        names = [_short(o["name"]) + (f" (x{o['count']})" if o["count"] > 1 else "")
                 for o in ops]
        axes[2].barh(range(len(ops)), [o["ms"] for o in ops], color="C0")
        axes[2].set_yticks(range(len(ops)), names, fontsize=6)
        axes[2].invert_yaxis()
        axes[2].set(title=f"the {len(ops)} costliest operators" + (
            f" (of {listed} listed)" if listed > len(ops) else ""), xlabel="ms a micro-batch")
    fig.suptitle(f"{model or 'the model'} on {p.device}" + (
        f", {p.gpus} GPUs" if p.gpus > 1 else "") + f", batch {p.batch_size}", fontsize=10)
    fig.tight_layout()
    save(fig, path)


def _stacked(ax: Any, parts: dict[str, float], unit: str) -> None:
    """`parts` as one horizontal bar of segments, each named with its amount in the legend."""
    left = 0.0
    for i, (name, v) in enumerate(parts.items()):
        ax.barh([0], [v], left=left, height=0.5, color=f"C{i}",
                label=f"{name} {number(v)} {unit}")
        left += v
    ax.set_yticks([])
    ax.set_ylim(-0.6, 0.6)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2,
              frameon=False)


def _short(name: str, width: int = 36) -> str:
    """An operator's name within `width` characters: a graph path's end (its layer's part),
    words' start."""
    if len(name) <= width:
        return name
    return "..." + name[3 - width:] if "/" in name else name[:width - 3] + "..."
