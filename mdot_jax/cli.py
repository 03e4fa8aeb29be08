"""`mdot` command line: parses arguments and calls the library; nothing else lives here.
The commands for predicting are here; those that build data and models are in `cli_build`.

Every expected failure (bad file, bad shape, ...) is printed as one line `mdot: error: ...`
with exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import os
import re
import sys
from pathlib import Path

from converters.errors import ConversionError
from converters.substitutes import described
from mdot_jax import __version__, cli_args, cli_build, cli_job, cli_plan, cli_show, writers
from mdot_jax.cli_args import NON_NEGATIVE_FLOAT, POSITIVE_INT, _int_list
from mdot_jax.errors import MdotError, RequestError, UsageError
from mdot_jax.options import CHOICE_HINTS, MEASURED_PRECISIONS
from mdot_jax.readable import count, plural
from mdot_jax.serving import named_models

USER_COMMANDS = {  # name -> one line for `mdot --help`
    "predict": "predict the training iteration (and job) time of a model",
    "convert": "ONNX model or a language model's config.json -> operator sequence (.npz), summary",
    "adapt": "a checkpoint for another device: from this machine's probe, or step times",
    "probe": "measure the probe (12 samples, a few minutes) that describes this device",
    "devices": "the GPU catalog: spec sheets of the GPUs --device can name",
    "models": "well-known models a MODEL argument can name instead of a file (llama-3.1-8b)",
}


def _shape_kwargs(args: argparse.Namespace) -> dict:
    return dict(input_shapes=cli_job.input_shapes(args.input_shape), batch_size=args.batch_size,
                image_size=args.image_size, seq_len=args.seq_len)


def cmd_convert(args: argparse.Namespace) -> int:
    from converters import convert
    from mdot_jax import autograd
    from mdot_jax.serving.model_source import (
        check_lora,
        config_graph_at,
        config_name,
        config_said,
        is_config,
    )
    from mdot_jax.serving.request import too_many_tokens

    args.model = named_models.resolve(args.model)  # a name of `mdot models`: its config.json
    if args.output:
        writers.prepare_file(args.output, source=args.model, force=args.force)
    if why := too_many_tokens(args.batch_size, args.seq_len):
        raise RequestError(why, "batch_size")  # said with the flags' names (`cli_args.as_flags`)
    if args.target_len and not is_config(args.model):
        raise UsageError("--target-len: an encoder-decoder's config.json takes it (an ONNX "
                         "file's targets are an input: give its --input-shape)")
    if args.video_frames and not is_config(args.model):
        raise UsageError("--video-frames: a vision-language model's config.json takes it (an "
                         "ONNX file's frames are an input: give its --input-shape)")
    if args.audio_seconds and not is_config(args.model):
        raise UsageError("--audio-seconds: an audio model's config.json takes it (an ONNX "
                         "file's audio is an input: give its --input-shape)")
    targets = cli_job.lora_targets(args.lora_targets)
    check_lora(args.model, args.lora_rank, targets)
    config = is_config(args.model)
    shape = _shape_kwargs(args)
    model, shape["image_size"] = config_graph_at(  # at the batch: its images, if it holds them
        args.model, args.batch_size or 1, args.seq_len, args.target_len, args.lora_rank,
        targets, args.image_size, args.video_frames, args.audio_seconds) if config else (
        args.model, args.image_size)
    seq = convert(model, name=config_name(args.model) if config else Path(args.model).stem,
                  **shape,
                  fuse=True if args.fuse is None else args.fuse, label=args.model)
    if args.output:
        writers.write_file(args.output, seq.save)
    summary = dict(model=seq.name, num_ops=seq.num_ops, flops=seq.flops,
                   flops_bwd=float(autograd.backward_flops(seq).sum()),
                   params=seq.params, trained_params=autograd.trainable(seq),
                   inputs=seq.meta["inputs"],
                   op_types=seq.op_type_counts(), flops_by_type=seq.flops_by_type(),
                   unknown_ops=seq.unknown_ops,
                   dropped_nodes=seq.meta["dropped_nodes"], graph=seq.meta["graph"],
                   output=args.output, **{k: seq.meta[k] for k in (
                       "experts", "defaulted", "head", "linear_attention", "sparse_attention")
                       if k in seq.meta})
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{seq.name}: {seq.num_ops:,} operators, {seq.flops / 1e9:.3f} GFLOPs forward, "
          f"{summary['flops_bwd'] / 1e9:.3f} GFLOPs backward (est.), "
          f"{count(seq.params)} parameters"
          + (f" ({count(summary['trained_params'])} trained, the rest frozen)"
             if summary["trained_params"] < seq.params else ""))
    print(f"inputs: {', '.join(f'{k}={v}' for k, v in seq.meta['inputs'].items())}; "
          f"{seq.meta['dropped_nodes']} shape/constant nodes dropped")
    for said in config_said(seq):
        print(said)
    if moe := seq.meta.get("experts"):
        print(f"experts: {moe['experts']}, top {moe['top_k']}, in "
              f"{plural(moe['layers'], 'layer')}, {count(moe['params'])} of the parameters "
              "(exported as balanced routing)")
    for s in described(seq.meta.get("linear_attention", "")):
        print(f"{s.what}: exported as {s.kernels}")
    if k := seq.meta.get("sparse_attention"):
        print(f"sparse attention: each query's top {k:,} keys, exported dense and masked")
    width = max(len(k) for k in summary["op_types"])
    for op, n in summary["op_types"].items():
        print(f"  {op:<{width}}  {n:6d}")
    if seq.unknown_ops:
        print(f"unknown op types (as <unk>): {seq.unknown_ops}")
    if args.output:
        print(f"wrote {args.output}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from mdot_jax.measure import core_set
    from mdot_jax.measure.device import device_folder
    from mdot_jax.measure.profiler import Protocol

    out = args.out or str(device_folder(args.threads, precision=args.precision))
    keys = args.keys.split(",") if args.keys else core_set.load()["probe"]
    try:
        probe = core_set.run_probe(out, keys, args.threads,
                                   protocol=Protocol(precision=args.precision))
    except MdotError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None
    width = max(map(len, keys))
    for k, ms in probe["ms"].items():
        print(f"  {k:<{width}}  {ms:9.2f} ms")
    missing = [k for k in keys if k not in probe["ms"]]
    print(f"probe: {len(probe['ms'])} of {len(keys)} samples, in {out}/{core_set.PROBE_FILE}"
          + (f"; not measured (noisy or skipped: {out}/noisy.jsonl, report.json): "
             f"{', '.join(missing)}" if missing else ""))
    return 0 if not missing else 1


def cmd_predict(args: argparse.Namespace) -> int:
    from mdot_jax.serving import fits
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    if args.batch_size is None and args.batch_sizes is None and not args.input_shape:
        raise UsageError("--batch-size (or --batch-sizes) is required")
    if args.batch_size and args.batch_sizes:
        raise UsageError("--batch-size and --batch-sizes: give one")
    gpus = args.gpus or [1]
    try:
        job = TrainingJob(
            model=args.model, device=args.device, device_spec=args.device_spec,
            checkpoint=args.checkpoint, operators=bool(args.top),
            batch_size=tuple(args.batch_sizes) if args.batch_sizes else args.batch_size,
            gpus=gpus[0] if len(gpus) == 1 else tuple(gpus), **cli_job.job_fields(args))
    except RequestError as e:  # the list came with --batch-sizes: say so
        if e.field != "batch_size" or not args.batch_sizes:
            raise
        raise RequestError("batch_sizes" + str(e)[len("batch_size"):], "batch_sizes") from None
    if args.plot:  # said before any pricing, as a plot that cannot be written
        cli_show.claim_plot(args.plot, args.force)
    try:
        result = predict(job)
        if not job.several:  # where it does not fit: what would
            result = fits.suggest(job, result, progress=sys.stderr.isatty())
        cli_show.predictions(args, job, result if isinstance(result, list) else [result])
    finally:
        if args.plot:
            writers.release(args.plot)
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    from mdot_jax.serving.adaptation import adapt_from_measurements, adapt_from_probe, at_the_edge

    if bool(args.from_measurements) == bool(args.probe):
        raise UsageError("adapt: give --from-measurements CSV or --probe (one of them)")
    try:
        if args.probe:
            from mdot_jax.measure.device import device_folder
            from mdot_jax.measure.profiler import Protocol

            root = args.data or str(device_folder(args.threads, precision=args.precision))
            a, base = adapt_from_probe(root, args.base, args.out, threads=args.threads,
                                       device=args.device_name, force=args.force,
                                       budget_s=args.budget_s,
                                       protocol=Protocol(precision=args.precision))
        else:
            a = adapt_from_measurements(args.from_measurements, args.base, args.out,
                                        device=args.device_name, force=args.force)
            base = args.base or "the default checkpoint"
    except ValueError as e:
        if isinstance(e, ConversionError):
            raise
        raise UsageError(str(e)) from None
    print(f"adapted {base} to {a.device} from {a.n_rows} measured rows ({a.said()})")
    print(f"expected error: {a.loo_mape:.1f}% MAPE (each row predicted by a fit on the other "
          f"jobs); 80% band x{math.exp(a.lo):.2f}-x{math.exp(a.hi):.2f}"
          + ("; with so few rows, a rough estimate" if a.n_rows < 20 else ""))
    if edge := at_the_edge(a):
        print(f"mdot: warning: {edge}", file=sys.stderr)
    if a.base_mape is not None:
        print(f"unadapted, {base} erred by {a.base_mape:.1f}% on these rows"
              + (": the adaptation does not beat it here; more rows, or keep the base"
                 if a.base_mape <= a.loo_mape else ""))
    print(f"checkpoint: {args.out} (mdot predict MODEL --checkpoint {args.out})")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from mdot_jax.gpu import catalog as gpus

    try:
        catalog = gpus.named(args.names) if args.names else gpus.catalog()
    except ValueError as e:  # a name that means no GPU: the close ones
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps([g.to_json() for g in catalog.values()]))
        return 0
    w = max(len(g.name) for g in catalog.values())
    print(f"{'name':<{w}} {'SMs':>4} {'MHz':>5} {'GB':>4} {'GB/s':>5} {'L2 MB':>5} "
          f"{'fp32':>6} {'tf32':>6} {'fp16':>6} {'bf16':>6} {'fp8':>6} {'NVLink':>6} "
          f"{'net':>4} {'max W':>5}  (TFLOP/s dense; net: GB/s a node of its DGX or rack)")

    def num(x) -> str:
        return "-" if not x else f"{x:g}"

    for g in catalog.values():
        t = g.tflops
        print(f"{g.name:<{w}} {g.sms:>4} {g.boost_mhz:>5g} {g.memory_gb:>4g} "
              f"{g.memory_gbs:>5g} {g.l2_mb:>5g} {num(t['fp32']):>6} {num(t['tf32']):>6} "
              f"{num(t['fp16']):>6} {num(t['bf16']):>6} {num(t['fp8']):>6} "
              f"{num(g.nvlink_gbs):>6} {num(g.network_gbs):>4} {num(g.power_w):>5}")
    print(f"{plural(len(catalog), 'GPU')}; sources: `mdot devices --json` (each row's datasheet)")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from mdot_jax.serving.named_models import named

    models = [m for m in named().values() if not args.names or any(
        k.lower() in f"{m.name} {m.repo}".lower() for k in args.names)]
    if not models:
        raise UsageError(f"no named model matches {' or '.join(map(repr, args.names))} "
                         "(`mdot models` lists them all)")
    if args.json:
        print(json.dumps([dict(m.to_json(), config=str(m.config)) for m in models]))
        return 0
    width = max(len(m.name) for m in models)
    print(f"{'name':<{width}}  {'parameters':>10}  {'kind':<20}  {'positions':>9}  "
          "Hugging Face repository")
    for m in models:
        print(f"{m.name:<{width}}  {count(m.parameters):>10}  {m.kind:<20}  "
              f"{m.positions or '-':>9}  {m.repo}")
    print(f"{plural(len(models), 'model')}: each its repository's config.json, shipped "
          "(`--json`: the file); a repository's name or its -Instruct variant names it too")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (`mdot: error: argument --x: ...`), exit 2."""

    def error(self, message: str):
        bad = re.match(r"argument --([\w-]+): invalid choice: '([^']*)'", message)
        if bad:  # a value another tool's vocabulary gives the flag: what it is called here
            message += CHOICE_HINTS.get((bad[1].replace("-", "_"), bad[2]), "")
        listed = re.match(r"argument (--[\w-]+): expected .*, got '([^']*,[^']*)'", message)
        if listed and any(f"{listed[1]}s" in a.option_strings for a in self._actions):
            message += f"; several: {listed[1]}s {listed[2]}"  # --batch-size 1,2
        print(f"mdot: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """Arguments no flag takes are said by the command's parser, with the flag a
        misspelt one is nearest (`--batchsize`: `--batch-size`)."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(self, "commands", {}).get(getattr(ns, "command", None), self)
            flags = [o for a in command._actions for o in a.option_strings]
            near = [m for t in extra if t.startswith("--")
                    for m in difflib.get_close_matches(t.split("=")[0], flags, 1, 0.7)]
            command.error(f"unrecognized arguments: {' '.join(extra)}"
                          + (f"; did you mean {', '.join(near)}?" if near else ""))
        return ns


@functools.lru_cache(maxsize=1)
def build_parser() -> argparse.ArgumentParser:
    """The `mdot` parser (built once a process: parsing reads it, never changes it)."""
    def listing(commands: dict) -> str:
        return "\n".join(f"  {name:<10} {text}" for name, text in commands.items())

    parser = _Parser(
        prog="mdot", usage="mdot COMMAND [options]  (mdot COMMAND --help for its options)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Predict deep-learning training time before it runs.\n\n"
                    f"predicting:\n{listing({**USER_COMMANDS, **cli_plan.COMMANDS})}\n\n"
                    f"building data and models:\n{listing(cli_build.BUILD_COMMANDS)}")
    parser.add_argument("--version", action="version", version=f"mdot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help=argparse.SUPPRESS, prog="mdot")
    parser.commands = sub.choices  # type: ignore[attr-defined]

    p = sub.add_parser("convert", description=USER_COMMANDS["convert"])
    p.add_argument("model", help="an .onnx file, a Hugging Face model's config.json (with"
                   " --seq-len), or a name of `mdot models`")
    cli_job.add_shape_args(p)
    p.add_argument("-o", "--output", help="write the operator sequence to this .npz")
    p.add_argument("--fuse", type=int, metavar="V", help="kernel fusion version (default: the "
                   "latest, read by GPUs priced from spec sheets and by a checkpoint where its "
                   "own converts the same; 0: the graph's operators as they are)")
    p.add_argument("--force", action="store_true", help="replace an existing -o file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("probe", description=USER_COMMANDS["probe"])
    p.add_argument("--out", help="dataset directory (default: this machine's folder in "
                                        "$MDOT_DATA, else ~/.local/share/mdot)")
    p.add_argument("--threads", type=POSITIVE_INT, default=2)
    p.add_argument("--keys", help=argparse.SUPPRESS)  # tests: a smaller probe
    p.add_argument("--precision", choices=MEASURED_PRECISIONS,
                   default="fp32", help="the training step's precision (a GPU's AMP)")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("devices", description=USER_COMMANDS["devices"])
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these GPUs (a name, an alias, or its start: h100)")
    p.add_argument("--json", action="store_true", help="every field, with its source")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("models", description=USER_COMMANDS["models"])
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only those whose name or repository holds it (qwen3, meta-llama)")
    p.add_argument("--json", action="store_true", help="every field, with its config.json")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("predict", description=USER_COMMANDS["predict"])
    p.add_argument("model", help="path to an .onnx file (export it with converters.from_*), "
                                 "a Hugging Face model's config.json (with --seq-len), or a name "
                                 "of `mdot models` (llama-3.1-8b)")
    cli_job.add_shape_args(p).add_argument(
        "--batch-sizes", type=_int_list,
        help="several batch sizes at once (a table; JSON: a list, as for several --gpus), "
             "e.g. 16,32,64")
    g = p.add_argument_group("the device")
    g.add_argument("--checkpoint", help="shipped checkpoint name or directory (default: "
                                        "timm-rtx3090; gpu-spec-sheet: price the --device GPU "
                                        "from its spec sheet)")
    g.add_argument("--device", help="device to predict for: the checkpoint's (default), or a "
                                    "GPU of `mdot devices` (priced from its spec sheet)")
    g.add_argument("--device-spec", metavar="FILE.json",
                   help="a GPU the catalog lacks, described with its fields")
    cli_job.add_job_args(p)["parallel"].add_argument(
        "--gpus", type=_int_list, metavar="N[,M,...]",
        help="data-parallel (DDP) over N GPUs per node, --batch-size per GPU; several: a "
             "table with the scaling efficiency")
    g = p.add_argument_group("output")
    g.add_argument("--top", type=POSITIVE_INT, metavar="N",
                   help="also show the N most expensive operators (with --json: every "
                        "operator's share of the time, in graph order)")
    g.add_argument("--plot", metavar="FILE.png", help="throughput and memory per GPU against "
                   "the --batch-sizes or --gpus asked, the GPU's memory drawn; one prediction: "
                   "where its time and memory go (with --top: its costliest operators)")
    g.add_argument("--force", action="store_true", help="replace an existing --plot file")
    g.add_argument("--json", action="store_true", help="every field, as the library's "
                                                       "Prediction holds it")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("adapt", description=USER_COMMANDS["adapt"])
    p.add_argument("--probe", action="store_true",
                   help="measure this machine's probe (12 reference samples, a few minutes; "
                        "resumable) and adapt to it")
    p.add_argument("--from-measurements", metavar="CSV",
                   help="columns model (.onnx or .npz, relative to the CSV), batch_size, "
                        "image_size or seq_len, precision, ms; nothing is run")
    p.add_argument("--base", help="shipped checkpoint name or directory to adapt (default: "
                                  "with --probe the one whose device ran the probe most alike, "
                                  "else the default checkpoint)")
    p.add_argument("--data", help="--probe: the dataset folder the probe is measured into "
                                  "(default: this machine's folder in $MDOT_DATA, else "
                                  "~/.local/share/mdot)")
    p.add_argument("--budget-s", type=NON_NEGATIVE_FLOAT, default=300.0,
                   help="--probe: seconds of measuring, the probe's included; what is left "
                        "measures more core-set samples (0: the probe only)")
    p.add_argument("--threads", type=POSITIVE_INT, default=2)
    p.add_argument("--precision", choices=MEASURED_PRECISIONS,
                   default="fp32", help="--probe: the precision the probe is measured at "
                                        "(a GPU's AMP: that of the kit's folder)")
    p.add_argument("--out", required=True, help="the adapted checkpoint's directory")
    p.add_argument("--device-name", help="what to call the device (default: derived)")
    p.add_argument("--force", action="store_true", help="replace the checkpoint in --out")
    p.set_defaults(func=cmd_adapt)

    cli_plan.add_commands(sub)
    cli_build.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a bad argument (already printed in one line)
        return int(e.code or 0)
    try:
        return args.func(args)
    except (ConversionError, MdotError) as e:
        message = named_models.said(str(e))  # a named model by its name, not the package's file
        said = cli_args.as_flags(message, getattr(e, 'field', ''))
        print(f"mdot: error: {said}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mdot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`mdot devices | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the file system said no (read-only, full, permissions)
        where = f"{e.filename}: " if e.filename else ""
        print(f"mdot: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
