"""`mdot` command line: parses arguments and calls the library; nothing else lives here.
The commands for predicting are here; those that build data and models are in `cli_build`.

Every expected failure (bad file, bad shape, ...) is printed as one line `mdot: error: ...`
with exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from converters.errors import ConversionError
from mdot_jax import cli_build, writers
from mdot_jax.cli_build import MAX_INT, NON_NEGATIVE_FLOAT, POSITIVE_FLOAT, POSITIVE_INT, _int_list
from mdot_jax.data.dataset import MEASURED_PRECISIONS, PRECISIONS
from mdot_jax.errors import MdotError, UsageError

USER_COMMANDS = {  # name -> one line for `mdot --help`
    "predict": "predict the training iteration (and job) time of a model",
    "convert": "ONNX model -> operator sequence (.npz) and summary",
    "adapt": "a checkpoint for another device: from this machine's probe, or step times",
    "probe": "measure the probe (12 samples, a few minutes) that describes this device",
    "devices": "the GPU catalog: spec sheets of the GPUs --device can name",
}


def _input_shapes(specs: list[str] | None) -> dict[str, list[int]]:
    """Parses repeated `NAME=D1,D2,...` into {name: [dims]}."""
    shapes = {}
    for spec in specs or []:
        name, sep, dims = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise UsageError(f"--input-shape {spec!r}: expected NAME=D1,D2,... "
                             "(e.g. x=1,3,224,224)") from None
        if max(shapes[name], default=0) > MAX_INT:
            raise UsageError(f"--input-shape {spec!r}: a dim is too large (at most {MAX_INT})")
    return shapes


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="concrete shape of a data input (repeatable)")
    p.add_argument("--batch-size", type=POSITIVE_INT, help="dim 0 of every data input")
    p.add_argument("--image-size", type=POSITIVE_INT, help="spatial size of rank-4 image inputs")
    p.add_argument("--seq-len", type=POSITIVE_INT, help="dim 1 of rank-2 token-id inputs")


def _shape_kwargs(args: argparse.Namespace) -> dict:
    return dict(input_shapes=_input_shapes(args.input_shape), batch_size=args.batch_size,
                image_size=args.image_size, seq_len=args.seq_len)


def cmd_convert(args: argparse.Namespace) -> int:
    from converters import convert

    if args.output:
        writers.prepare_file(args.output, source=args.model, force=args.force)
    seq = convert(args.model, **_shape_kwargs(args))
    if args.output:
        writers.write_file(args.output, seq.save)
    summary = dict(model=seq.name, num_ops=seq.num_ops, flops=seq.flops,
                   flops_bwd=float(seq.load[:, 1].astype("float64").sum()),
                   params=seq.params, inputs=seq.meta["inputs"],
                   op_types=seq.op_type_counts(), flops_by_type=seq.flops_by_type(),
                   unknown_ops=seq.unknown_ops,
                   dropped_nodes=seq.meta["dropped_nodes"], graph=seq.meta["graph"],
                   output=args.output)
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{seq.name}: {seq.num_ops} operators, {seq.flops / 1e9:.3f} GFLOPs forward, "
          f"{summary['flops_bwd'] / 1e9:.3f} GFLOPs backward (est.), "
          f"{seq.params / 1e6:.2f} M params")
    print(f"inputs: {', '.join(f'{k}={v}' for k, v in seq.meta['inputs'].items())}; "
          f"{seq.meta['dropped_nodes']} shape/constant nodes dropped")
    width = max(len(k) for k in summary["op_types"])
    for op, count in summary["op_types"].items():
        print(f"  {op:<{width}}  {count:6d}")
    if seq.unknown_ops:
        print(f"unknown op types (as <unk>): {seq.unknown_ops}")
    if args.output:
        print(f"wrote {args.output}")
    return 0


def _refuse_unused_flags(args: argparse.Namespace, sizes: list[int]) -> None:
    """`mdot predict` flags that would mean nothing as given: an error, never ignored."""
    for bad, message in (
            (not sizes, "--batch-size (or --batch-sizes) is required"),
            (args.batch_size and args.batch_sizes, "--batch-size and --batch-sizes: give one"),
            (args.device == "", "--device: empty; name a GPU of `mdot devices`"),
            (args.device_spec == "", "--device-spec: empty; name a JSON file"),
            (args.network_gbs is not None and args.nodes == 1,
             "--network-gbs: the link between nodes; give --nodes K (K > 1)"),
            ((args.interconnect or args.nodes > 1) and not args.gpus,
             "--interconnect and --nodes: links between GPUs; give --gpus N"),
            (args.strategy != "ddp" and not args.gpus, "--strategy: give --gpus N")):
        if bad:
            raise UsageError(message)


def cmd_probe(args: argparse.Namespace) -> int:
    from mdot_jax.measure import core_set
    from mdot_jax.measure.device import device_folder
    from mdot_jax.measure.zoo import Protocol

    out = args.out or str(device_folder(args.threads, precision=args.precision))
    keys = args.keys.split(",") if args.keys else core_set.load()["probe"]
    try:
        probe = core_set.run_probe(out, keys, args.threads,
                                   protocol=Protocol(precision=args.precision))
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
    kw = _shape_kwargs(args)
    sizes = args.batch_sizes or ([args.batch_size] if args.batch_size else [])
    _refuse_unused_flags(args, sizes)
    if (args.epochs is None) != (args.dataset_size is None):
        raise UsageError("--epochs and --dataset-size go together")
    from mdot_jax.serving.spec_sheet import spec_gpu

    try:
        gpu, folder = spec_gpu(args.device, args.device_spec, args.checkpoint) or (None, None)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if gpu is not None:
        from converters import convert
        from mdot_jax.serving import spec_sheet as spec
        from mdot_jax.serving.parallel import NETWORK_GBS, data_parallel, scaling_efficiency

        if args.layout != "nchw":
            raise UsageError("--layout: a GPU priced from its spec sheet has none (NCHW data)")
        model = spec.load_step_model(folder)
        source = f"priced from its spec sheet by {folder.name}" + (
            ", adapted to measured steps" if model.info.get("adaptation") else "")
        note = None

        def predict(b):
            seq = convert(args.model, **dict(kw, batch_size=b), fuse=True)
            return seq, spec.price(seq, gpu, model, precision=args.precision or "fp32",
                                   step=args.step or "train", optimizer=args.optimizer)
    else:
        from mdot_jax.serving.predict import Predictor, machine_note

        if args.step:
            raise UsageError("--step: a checkpoint predicts the step it was trained on; --step "
                             "is for a GPU priced from its spec sheet (--device NAME)")
        predictor = Predictor.load(args.checkpoint)
        source = f"checkpoint {predictor.path.name}" + (
            ", geometric mean of " + " x ".join(predictor.member_labels)
            if len(predictor.members) > 1 else "")
        note = machine_note([predictor.adaptation.device] if predictor.adaptation
                            else predictor.devices)

        def predict(b):
            seq = predictor.sequence(args.model, **dict(kw, batch_size=b))
            return seq, predictor.predict(seq, precision=args.precision, device=args.device,
                                          layout=args.layout, optimizer=args.optimizer,
                                          **dict(kw, batch_size=b))
    counts = args.gpus or [1]
    if (counts != [1] or args.nodes > 1) and gpu is None:
        raise UsageError("--gpus and --nodes price data-parallel steps of a GPU priced from its "
                         "spec sheet (--device NAME, --checkpoint gpu-spec-sheet)")
    if len(counts) > 1 and len(sizes) > 1:
        raise UsageError("--gpus N,M,... takes one --batch-size (per GPU)")
    rows = []
    for b in sizes:
        try:
            seq, one = predict(b)
            steps = [(n, one if gpu is None else data_parallel(
                one, seq.params, gpu, n, args.nodes, args.interconnect,
                args.network_gbs or NETWORK_GBS, args.strategy, args.optimizer)) for n in counts]
        except ValueError as e:
            if isinstance(e, ConversionError):
                raise
            raise UsageError(str(e)) from None
        for n, p in steps:
            n, g = n * args.nodes, b * n * args.nodes
            row = dict(model=args.model, iteration_ms=p.iteration_ms, device=p.device,
                       batch_size=b, gpus=n, global_batch=g, input_size=p.input_size,
                       samples_per_s=1e3 * g / p.iteration_ms,
                       scaling_efficiency=scaling_efficiency(p), source=source,
                       num_ops=p.num_ops, warnings=p.warnings, parts=p.parts, phases=p.phases,
                       interval_ms=p.interval_ms, memory_gb=p.memory_gb)
            if args.top:
                row["operators"], row["operators_from"] = (
                    (p.operators, f"the GPU operator model on the {p.device}") if gpu
                    else predictor.operators(seq, p, b))
            if args.epochs is not None:
                row["job_s"] = p.job_seconds(args.epochs, args.dataset_size, g)
                row["job_interval_s"] = p.job_interval_seconds(args.epochs, args.dataset_size, g)
            rows.append(row)
            for warning in p.warnings:
                print(f"mdot: warning: batch size {b} x {n} GPUs: {warning}" if len(rows) > 1
                      else f"mdot: warning: {warning}", file=sys.stderr)
    if note:  # after the predictions: an error stays one line
        print(f"mdot: warning: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows if args.batch_sizes or len(counts) > 1 else rows[0]))
        return 0
    r = rows[0]
    print(f"{args.model} on {r['device']} ({r['num_ops']} operators; {source})"
          + (f", {args.epochs:g} epochs x {args.dataset_size} samples" if "job_s" in r else ""))
    band = any(r["interval_ms"] for r in rows)
    many = args.gpus is not None
    print(f"{'batch':>7} " * (len(sizes) > 1 or not many) + f"{'GPUs':>5} " * many
          + f"{'ms/iteration':>13} {'80% band ms':>15} "
          f"{'samples/s':>10} {'memory GB':>9}" + (" scaling" if many else "")
          + (f" {'job h':>7} {'80% band h':>13}" if "job_s" in r else ""))
    for r in rows:
        print(f"{r['batch_size']:>7} " * (len(sizes) > 1 or not many)
              + f"{r['gpus']:>5} " * many + f"{r['iteration_ms']:>13.4g} "
              f"{_range(r['interval_ms']):>15} {r['samples_per_s']:>10.4g} "
              f"{r['memory_gb']:>9.3g}" + (f" {r['scaling_efficiency']:>7.0%}" if many else "")
              + (f" {r['job_s'] / 3600:>7.3g} "
                 f"{_range(r.get('job_interval_s'), 1 / 3600):>13}" if "job_s" in r else ""))
    if r["phases"]:
        print("of which " + ", ".join(f"{k} {v:.4g} ms" for k, v in r["phases"].items()))
    if band:
        print("80% band: where 80% of the measured times fell, for predictions like these, on "
              + ("model families the predictor had not seen" if gpu is None
                 else "GPUs the predictor had not seen"))
    if args.top:
        _print_top(rows[-1], args.top)
    return 0


def _print_top(row: dict, n: int) -> None:
    ops = row["operators"]
    if not ops:
        print(f"operators: {row['operators_from']}")
        return
    total = row["iteration_ms"]
    print(f"\nthe {min(n, len(ops))} most expensive operators at batch {row['batch_size']}, "
          f"priced by {row['operators_from']}:")
    print(f"{'ms':>9} {'share':>6}  {'type':<20} name")
    for o in sorted(ops, key=lambda o: -o["ms"])[:n]:
        print(f"{o['ms']:>9.3g} {o['ms'] / total:>6.1%}  {o['type']:<20} {o['name']}")


def _range(pair, scale: float = 1.0) -> str:
    def num(x):
        return f"{x:.0f}" if x >= 100 else f"{x:.3g}"

    return f"{num(pair[0] * scale)}-{num(pair[1] * scale)}" if pair else "-"


def cmd_adapt(args: argparse.Namespace) -> int:
    from mdot_jax.serving.adaptation import adapt_from_measurements, adapt_from_probe

    if bool(args.from_measurements) == bool(args.probe):
        raise UsageError("adapt: give --from-measurements CSV or --probe (one of them)")
    try:
        if args.probe:
            from mdot_jax.measure.device import device_folder
            from mdot_jax.measure.zoo import Protocol

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
    print(f"adapted {base} to {a.device} from {a.n_rows} measured rows ({a.fit} fit: "
          f"log t' = {a.a:.3f} + {a.b:.3f} log t)")
    print(f"expected error: {a.loo_mape:.1f}% MAPE (each row predicted by a fit on the others); "
          f"80% band x{math.exp(a.lo):.2f}-x{math.exp(a.hi):.2f}"
          + ("; with so few rows, a rough estimate" if a.n_rows < 20 else ""))
    print(f"checkpoint: {args.out} (mdot predict MODEL --checkpoint {args.out})")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from mdot_jax.data import gpus

    catalog = gpus.catalog()
    if args.json:
        print(json.dumps([g.to_json() for g in catalog.values()]))
        return 0
    print(f"{'name':<24} {'SMs':>4} {'MHz':>5} {'GB':>4} {'GB/s':>5} {'L2 MB':>5} "
          f"{'fp32':>6} {'tf32':>6} {'fp16':>6} {'bf16':>6} {'NVLink':>6}  (TFLOP/s dense)")

    def num(x) -> str:
        return "-" if not x else f"{x:g}"

    for g in catalog.values():
        t = g.tflops
        print(f"{g.name:<24} {g.sms:>4} {g.boost_mhz:>5g} {g.memory_gb:>4g} "
              f"{g.memory_gbs:>5g} {g.l2_mb:>5g} {num(t['fp32']):>6} {num(t['tf32']):>6} "
              f"{num(t['fp16']):>6} {num(t['bf16']):>6} {num(g.nvlink_gbs):>6}")
    print(f"{len(catalog)} GPUs; sources: `mdot devices --json` (each row's datasheet)")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (`mdot: error: argument --x: ...`), exit 2."""

    def error(self, message: str):
        print(f"mdot: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    def listing(commands: dict) -> str:
        return "\n".join(f"  {name:<10} {text}" for name, text in commands.items())

    parser = _Parser(
        prog="mdot", usage="mdot COMMAND [options]  (mdot COMMAND --help for its options)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Predict deep-learning training time before it runs.\n\n"
                    f"predicting:\n{listing(USER_COMMANDS)}\n\n"
                    f"building data and models:\n{listing(cli_build.BUILD_COMMANDS)}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help=argparse.SUPPRESS, prog="mdot")

    p = sub.add_parser("convert", description=USER_COMMANDS["convert"])
    p.add_argument("model", help="path to an .onnx file")
    _add_shape_args(p)
    p.add_argument("-o", "--output", help="write the operator sequence to this .npz")
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
    p.add_argument("--json", action="store_true", help="every field, with its source")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("predict", description=USER_COMMANDS["predict"])
    p.add_argument("model", help="path to an .onnx file (export it with converters.from_*)")
    _add_shape_args(p)
    p.add_argument("--checkpoint", help="shipped checkpoint name or directory (default: "
                                        "timm-rtx3090; gpu-spec-sheet: price the --device GPU "
                                        "from its spec sheet)")
    p.add_argument("--device", help="device to predict for: the checkpoint's (default), or a "
                                    "GPU of `mdot devices` (priced from its spec sheet)")
    p.add_argument("--device-spec", metavar="FILE.json",
                   help="a GPU the catalog lacks, described with its fields")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="default: the device's usual (fp32 on CPUs and GPUs priced from their "
                        "spec sheet, amp-fp16 on a GPU checkpoint)")
    p.add_argument("--layout", default="nchw", choices=["nchw", "nhwc"])
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"],
                   help="the training step's optimizer; sgd: with momentum (memory; time "
                        "where the checkpoint was trained on it or the GPU is priced from its "
                        "spec sheet)")
    p.add_argument("--gpus", type=_int_list, metavar="N[,M,...]",
                   help="data-parallel (DDP) over N GPUs per node, --batch-size per GPU; "
                        "several: a table with the scaling efficiency")
    p.add_argument("--nodes", type=POSITIVE_INT, default=1, help="nodes of --gpus GPUs each")
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp", "tp", "pp"],
                   help="with --gpus: DDP or FSDP (tensor and pipeline parallel: not priced)")
    p.add_argument("--interconnect", choices=["nvlink", "pcie"], help="within a node")
    p.add_argument("--network-gbs", type=POSITIVE_FLOAT, help="GB/s between nodes (default 25)")
    p.add_argument("--step", choices=["train", "fwd-bwd"],
                   help="a GPU priced from its spec sheet: the whole step (train, default) or "
                        "forward and backward without the optimizer update")
    p.add_argument("--batch-sizes", type=_int_list,
                   help="several batch sizes at once (a table; JSON: a list, as for several "
                        "--gpus), e.g. 16,32,64")
    p.add_argument("--epochs", type=POSITIVE_FLOAT, help="with --dataset-size: whole-job time")
    p.add_argument("--dataset-size", type=POSITIVE_INT, help="samples per epoch")
    p.add_argument("--top", type=POSITIVE_INT, metavar="N",
                   help="also show the N most expensive operators (with --json: every "
                        "operator's share of the time, in graph order)")
    p.add_argument("--json", action="store_true")
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
        print(f"mdot: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mdot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`mdot devices | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
