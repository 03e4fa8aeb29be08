"""`mdot plan` (which GPUs, how many, what it costs, by when) and `mdot serve` (the prediction
service): they parse and print; `serving.plan` and `serving.service` decide."""

from __future__ import annotations

import argparse
import json
import os
import sys

from mdot_jax import cli_job, writers
from mdot_jax.cli_args import (
    POSITIVE_FLOAT,
    POSITIVE_INT,
    _int_list,
    as_flags,
    check_plot_format,
    port,
    write_plot,
)
from mdot_jax.cli_show import memory_cell, tight_note
from mdot_jax.errors import UsageError
from mdot_jax.options import STRATEGIES
from mdot_jax.readable import hours, number, percent, span

COMMANDS = {
    "plan": "rank GPU types and counts for a training job by cost, under a deadline",
    "serve": "an HTTP JSON prediction service (predict, plan, devices)",
}


def read_prices(path: str | None) -> dict[str, float] | None:
    """`{"prices": {device: USD per GPU-hour}}` (the example in docs/prices.json), a plain
    mapping, or given inline: `h100-sxm=2.99,a100-sxm-80gb=1.79` (not a file's name)."""
    if path is None:
        return None
    if "=" in path and not os.path.exists(path):
        return inline("--prices", path, float, "NAME=USD per GPU-hour (h100-sxm=2.99)")
    try:
        data = json.loads(open(path).read())
    except (OSError, ValueError) as e:
        raise UsageError(f"--prices {path}: not a readable JSON file ({e}); or inline, "
                         "h100-sxm=2.99,l40s=0.99") from None
    prices = data.get("prices", data) if isinstance(data, dict) else None
    if not isinstance(prices, dict):
        raise UsageError(f"--prices {path}: expected {{\"prices\": {{\"h100-sxm\": 2.99, ...}}}}"
                         " (USD per GPU-hour)")
    for k, v in prices.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise UsageError(f"--prices {path}: {k!r} is {json.dumps(v)}: expected a number "
                             "(USD per GPU-hour)")
    return {str(k): float(v) for k, v in prices.items()}


def inline(flag: str, given: str, value: type, expected: str) -> dict:
    """`NAME=VALUE,NAME=VALUE` given as `flag`, each value read as `value`."""
    pairs = []
    for part in given.split(","):
        name, _, v = part.partition("=")
        try:
            pairs.append((name.strip(), value(v)))
        except ValueError:
            raise UsageError(f"{flag} {given}: {part!r}: expected {expected}") from None
    if len({k for k, _ in pairs}) < len(pairs):
        raise UsageError(f"{flag} {given}: a device given twice")
    return dict(pairs)


def cmd_plan(args: argparse.Namespace) -> int:
    from mdot_jax.serving import plan as planning
    from mdot_jax.serving import plan_plot
    if args.batch_size is None:
        raise UsageError("--batch-size is required (per data-parallel replica; with "
                         "--global-batch, the largest micro-batch tried)")
    if args.plot and not args.prices:
        raise UsageError("--plot: draws the plans' cost against their time; give --prices")
    if args.plot:
        check_plot_format(args.plot)
    cps = args.cp  # several: the layout search's (`Plan.cps`), the job's own cp 1
    if len(cps) > 1 and args.global_batch is None:
        raise UsageError(f"--cp {','.join(map(str, cps))}: several context-parallel degrees are "
                         "tried by the layout search; give --global-batch, or one --cp")
    args.cp = cps[0] if len(cps) == 1 else 1
    job = planning.job_for_plan(model=args.model, batch_size=args.batch_size,
                                **cli_job.job_fields(args))
    request = planning.Plan(job, devices=args.devices, gpus=args.gpus,
                            prices=read_prices(args.prices), deadline_h=args.deadline,
                            budget_usd=args.budget, global_batch=args.global_batch,
                            cps=tuple(cps) if len(cps) > 1 else (),
                            strategies=args.strategies or (), roomy=args.roomy,
                            available=args.available and inline(
                                "--available", args.available, int, "NAME=GPUs (l40s=16)"))
    if args.plot:  # before the search: a plot that cannot be written is said at once
        writers.prepare_file(args.plot, force=args.force, flag="--plot")
    try:
        options = planning.plan(request, progress=not args.json and sys.stderr.isatty())
        _print(args, options)
        if args.plot:  # after the table: a plot with nothing to draw leaves the table said
            write_plot(args.plot, lambda path: plan_plot.plot(options, path, request),
                       args.json)
    finally:
        if args.plot:
            writers.release(args.plot)
    return 0


def _print(args: argparse.Namespace, options: list) -> None:
    from mdot_jax.serving import plan as planning

    for warning in planning.said(options):  # each option's own: in its JSON
        print(f"mdot: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps([o.to_json() for o in options]))
        return
    feasible = [o for o in options if o.feasible]
    front = {id(o) for o in planning.pareto(options)}
    print(f"{args.model}: {len(feasible)} of {len(options)} plans feasible"
          + (" (* on the time / cost Pareto front)" if front else ""))
    split = args.global_batch is not None or bool(args.strategies)  # say how each count runs
    w = max([22] + [len(o.device) + 1 for o in options])  # a name and the front's `*`
    tokens = any(o.prediction and o.prediction.tokens for o in options)  # a token model's
    rows = _unpriced_together(options[:args.top] if args.top else options)
    g = max([5] + [len(counts) for _, counts in rows])
    print(f"{'device':<{w}} {'GPUs':>{g}} " + (f"{'layout':<24} " if split else "")
          + f"{'job h':>8} {'80% band h':>13} {'cost USD':>10} {'memory GB':>9}"
          + f" {'tok/s/GPU':>9}" * tokens + f" {'MFU':>5}  why not")
    for o, counts in rows:
        p = o.prediction
        band = o.hours_band and span(*o.hours_band, hours)
        mfu = percent(p.mfu) if p and p.mfu is not None else "-"
        print(f"{o.device + ('*' if id(o) in front else ''):<{w}} {counts:>{g}} "
              + (f"{str(o.layout or '-'):<24} " if split else "")
              + f"{'-' if o.hours is None else hours(o.hours):>8} {band or '-':>13} "
              f"{'-' if o.cost_usd is None else number(o.cost_usd):>10} "
              f"{memory_cell(p, over='') if p else '-':>9}"  # why not says it; `*`: the front
              + f" {number(p.tokens_per_s_per_gpu, 4) if p and p.tokens else '-':>9}" * tokens
              + f" {mfu:>5}  {as_flags('; '.join(o.reasons), '')}")
    if any(o.prediction and o.prediction.tight for o in options):
        print(tight_note("the GPU's memory"))
    if split:
        print("layout: tensor- and pipeline-parallel degrees (cp: context, ep: expert), a "
              "micro-batch x micro-batches an iteration, the data-parallel strategy (none: "
              "ddp), ckpt-: activation checkpointing")


def _unpriced_together(options: list) -> list[tuple]:
    """(option, its GPU counts as printed): a GPU's counts that were not priced for one reason
    (no bf16 on the board: every count) share one row, `2,4,8`."""
    rows: list[tuple] = []
    for o in options:
        last = rows[-1][0] if rows else None
        if (o.prediction is None and last is not None and last.prediction is None
                and (last.device, last.reasons) == (o.device, o.reasons)):
            rows[-1] = (last, f"{rows[-1][1]},{o.gpus}")
        else:
            rows.append((o, str(o.gpus)))
    return rows


def cmd_serve(args: argparse.Namespace) -> int:
    from mdot_jax.serving import service

    service.run(host=args.host, port=args.port, cache_dir=args.cache_dir,
                max_upload_mb=args.max_upload_mb)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("plan", description=COMMANDS["plan"])
    p.add_argument("model", help="an .onnx file, an .npz, a Hugging Face model's config.json, "
                   "or a name of `mdot models`")
    cli_job.add_shape_args(p)
    cli_job.add_job_args(p, plan=True)
    g, out = p.add_argument_group("the plan"), p.add_argument_group("output")
    g.add_argument("--devices", default="all",
                   help="comma-separated GPUs of `mdot devices` (h100: each H100), or all "
                        "(default)")
    g.add_argument("--gpus", type=_int_list, default=[1, 2, 4, 8], metavar="N[,M,...]",
                   help="GPU counts per node to try (default 1,2,4,8)")
    g.add_argument("--prices", metavar="FILE.json",
                   help="USD per GPU-hour by device (an example: docs/prices.json), or "
                   "inline: h100-sxm=2.99,l40s=0.99")
    g.add_argument("--available", metavar="NAME=N[,...]", help="GPUs free by device, in "
                   "all (l40s=16,h100-sxm=8): plans needing more listed infeasible, the GPUs free "
                   "priced too")
    g.add_argument("--deadline", type=POSITIVE_FLOAT, metavar="HOURS")
    g.add_argument("--budget", type=POSITIVE_FLOAT, metavar="USD")
    out.add_argument("--plot", metavar="FILE.png", help="time against cost, the Pareto front "
                     "(with --prices)")
    out.add_argument("--force", action="store_true", help="replace an existing --plot file")
    g.add_argument("--global-batch", type=POSITIVE_INT, metavar="G",
                   help="samples an iteration, held fixed: split each GPU count every way "
                        "(tensor, pipeline, data parallel, each --cp; micro-batches up to "
                        "--batch-size x accumulation; checkpointing where it would not fit)")
    g.add_argument("--roomy", action="store_true",
                   help="a feasible plan leaves a tenth of the GPU's memory free (a tight one, "
                   "!, may not fit: listed with why)")
    g.add_argument("--strategies", metavar="S[,S,...]",
                   help="the data-parallel strategies each GPU count (each layout, with "
                        f"--global-batch) is priced with, the best kept ({', '.join(STRATEGIES)};"
                        " e.g. ddp,fsdp,hsdp)")
    out.add_argument("--top", type=POSITIVE_INT, metavar="N", help="print the N best only")
    out.add_argument("--json", action="store_true", help="every plan, with its reasons")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("serve", description=COMMANDS["serve"])
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--cache-dir", help="uploaded models (default: ~/.cache/mdot/serve)")
    p.add_argument("--max-upload-mb", type=POSITIVE_FLOAT, default=64.0)
    p.set_defaults(func=cmd_serve)
