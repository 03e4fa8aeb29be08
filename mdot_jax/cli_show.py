"""How `mdot predict` shows its predictions: warnings, the table (or JSON), the lines under
it, where the time goes, the plot."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from mdot_jax import writers
from mdot_jax.cli_args import check_plot_format, write_plot
from mdot_jax.readable import count, gigabytes, hours, number, percent, plural, span
from mdot_jax.serving.memory import MEMORY_SAID
from mdot_jax.serving.prediction import TIGHT

if TYPE_CHECKING:
    from mdot_jax.serving.prediction import Prediction
    from mdot_jax.serving.request import TrainingJob


def claim_plot(path: str, force: bool) -> None:
    """A `--plot` file that can be drawn and written, claimed before any pricing."""
    check_plot_format(path)
    writers.prepare_file(path, force=force, flag="--plot")


def predictions(args: argparse.Namespace, job: TrainingJob, rows: list[Prediction]) -> None:
    """`mdot predict`'s predictions of `job`: warnings first (each once, said of the rows it
    is about), a table or JSON, then the plot asked for."""
    for warning in dict.fromkeys(w for r in rows for w in r.warnings):
        shared = all(warning in r.warnings for r in rows)
        where = [f"batch size {r.batch_size} x {r.gpus} GPUs: " for r in rows
                 if warning in r.warnings]
        print(f"mdot: warning: {'' if shared else where[0]}{warning}", file=sys.stderr)
    if args.json:
        out = [dict(r.to_json(), model=args.model) for r in rows]
        print(json.dumps(out if job.several else out[0]))
    else:
        by_gpus = args.gpus is not None or (args.nodes or 1) > 1  # a GPU count asked
        table(args.model, rows, by_batch=len(job.batch_sizes) > 1 or not by_gpus,
              by_gpus=by_gpus, top=args.top)
    if args.plot:  # after the table: it is said whatever the plot does
        from mdot_jax.serving import figures

        write_plot(args.plot, lambda path: figures.predictions(rows, path, args.model) if
                   job.several else figures.step(rows[0], path, args.model, args.top or 0),
                   args.json)


def memory_cell(p, over: str = "*") -> str:
    """A prediction's GB, marked `over` past its device's memory, `!` within `TIGHT` of it."""
    return number(p.memory_gb) + (over if not p.fits else "!" if p.tight else "")


def tight_note(where: str) -> str:
    """The footnote of `memory_cell`'s `!`: `where` is the memory."""
    return (f"! within {percent(1 - TIGHT)} of {where}, which estimates of measured peaks can "
            "miss by a fifth: may not fit")


def table(model: str, rows: list, by_batch: bool, by_gpus: bool, top: int | None):
    r = rows[0]
    trained = f", {count(r.trained_parameters)} trained" * (r.trained_parameters < r.parameters)
    print(f"{model} on {r.device} ({count(r.parameters)} parameters{trained}, {r.num_ops:,} "
          f"operators; {r.source})")
    job, tokens, mfu = r.job_s is not None, bool(r.tokens), r.mfu is not None
    each = tokens and any(r.gpus > 1 for r in rows)  # tokens/s a GPU, as LLM runs report
    print(f"{'batch':>7} " * by_batch + f"{'GPUs':>5} " * by_gpus
          + f"{'ms/iteration':>13} {'80% band ms':>15} {'samples/s':>10} {'memory GB':>9}"
          + f" {'tokens/s':>10}" * tokens + f" {'tok/s/GPU':>9}" * each + "   MFU" * mfu
          + " scaling" * by_gpus
          + (f" {'job h':>7} {'80% band h':>13}" if job else ""))
    for r in rows:
        print(f"{r.batch_size:>7} " * by_batch + f"{r.gpus:>5} " * by_gpus
              + f"{number(r.iteration_ms, 4):>13} {_range(r.interval_ms):>15} "
              f"{number(r.samples_per_s, 4):>10} {memory_cell(r):>9}"
              + f" {number(r.tokens_per_s or 0, 4):>10}" * tokens
              + f" {number(r.tokens_per_s_per_gpu or 0, 4):>9}" * each
              + f" {percent(r.mfu or 0):>5}" * mfu + f" {r.scaling_efficiency:>7.0%}" * by_gpus
              + (f" {hours(r.job_s / 3600):>7} {_range(r.job_interval_s, 1 / 3600, hours):>13}"
                 if job else ""))
    if over := [r for r in rows if not r.fits]:
        print(f"* more than the {r.device}'s {number(over[0].memory_limit_gb)} GB: may not fit"
              + (" (asked for one batch size and GPU count, the changes that would fit are "
                 "priced)" if len(rows) > 1 else ""))
    if tight := [r for r in rows if r.tight]:
        print(tight_note(f"the {r.device}'s {number(tight[0].memory_limit_gb)} GB"))
    # the lines below describe the last row
    at = "" if len(rows) == 1 else f"at {plural(r.gpus, 'GPU')}, " if by_gpus else \
        f"at batch {r.batch_size}, "
    if r.gpus > 1 or r.grad_accum > 1:  # the batch a GPU, an iteration's
        split = [f"{r.tp}-way tensor parallel"] * (r.tp > 1) + [plural(r.pp, "pipeline stage")] * (
            r.pp > 1) + [f"{r.cp}-way context parallel"] * (r.cp > 1)
        print(f"{at}each of {plural(r.replicas, 'data-parallel replica')}: "
              + "".join(f"{s} x " for s in split[:-1]) + "".join(f"{s}, " for s in split[-1:])
              + f"{plural(r.grad_accum, 'micro-batch')} of {r.batch_size}, "
              f"{plural(r.global_batch, 'sample')} an iteration; memory per GPU")
    if r.phases:
        print(at + r.phases_said(figures=4))
    if r.job_s is not None:
        print(f"{at}the job: {r.job_said()}")
    if r.memory_parts:
        said = dict(MEMORY_SAID, activations="activations") if r.memory_peak else MEMORY_SAID
        print(f"{at}memory" + (f" at its peak (in {r.memory_peak})" if r.memory_peak else "")
              + ": " + ", ".join(f"{said[k]} {gigabytes(v)} GB" for k, v in r.memory_parts.items())
              + (f"; the host's, a node: {number(r.host_memory_gb)} GB" if r.host_memory_gb
                 else ""))
    if r.fits_with is not None:
        fits_with(r)
    for said in dict.fromkeys(r.band_from for r in rows if r.interval_ms):
        print(f"80% band: where 80% of the measured times fell, for predictions like these, on "
              f"{said}")
    if top:
        top_operators(rows[-1], top)


def fits_with(p) -> None:
    """What would fit the GPU's memory (`serving.fits.suggest`), as the flags that ask it."""
    where = f"the {p.device}'s {number(p.memory_limit_gb)} GB"
    if not p.fits_with:
        print(f"\nnothing priced fits {where} on {plural(p.gpus, 'GPU')} (checkpointing, smaller "
              "micro-batches, sharding, 8-bit state, offloading, pure bf16): more GPUs or splits, "
              "`mdot plan --global-batch N` searches them")
        return
    one = len(p.fits_with[0]["change"]) == 1 or set(p.fits_with[0]["change"]) == {
        "batch_size", "grad_accum"}
    print(f"\nfits {where} with {'one change' if one else 'these changes together'} "
          "(each priced):")
    for f in p.fits_with:
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in f["change"].items())
        gb = number(f["memory_gb"]) + "!" * f["tight"]
        print(f"  {flags:<58} {gb:>7} GB {number(f['iteration_ms'], 4):>9} ms/iteration")
    if any(f["tight"] for f in p.fits_with):
        print(tight_note(where))


def top_operators(p, n: int) -> None:
    from mdot_jax.serving.prediction import by_layer

    if not p.operators:
        print(f"operators: {p.operators_from}")
        return
    ops = by_layer(p.operators)
    layers = max(o["count"] for o in ops) > 1  # a stack of layers: each row summed over it
    print(f"\nthe {min(n, len(ops))} most expensive operators at batch {p.batch_size}"
          + (", each summed over the layers of its stack (x: how many)" * layers)
          + f", priced by {p.operators_from}:")
    print(f"{'ms':>9} {'share':>6}  " + ("   x  " * layers) + f"{'type':<20} name" + (
        "  (share: of the operators listed, a micro-batch)" if p.gpus > 1 or p.grad_accum > 1
        else ""))
    total = sum(o["ms"] for o in ops)
    for o in ops[:n]:
        print(f"{o['ms']:>9.3g} {o['ms'] / total:>6.1%}  " + (f"{o['count']:>4}  " * layers)
              + f"{o['type']:<20} {o['name']}")


def _range(pair, scale: float = 1.0, num=number) -> str:
    return span(pair[0] * scale, pair[1] * scale, num) if pair else "-"
