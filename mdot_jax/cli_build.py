"""The `mdot` commands that build data and models (dataset, profile, kernels, train,
calibrate, evaluate), and the argument types both command modules share. Parsing and
printing only: the work is the library's. The entry point is `mdot_jax.cli`."""

from __future__ import annotations

import argparse
import math
import os
import sys

from mdot_jax import writers
from mdot_jax.cli_args import (
    INDEX_LIST,
    NON_NEGATIVE_INT,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    _config,
    _dataset,
    _int_list,
)
from mdot_jax.cli_dataset import (
    cmd_dataset_check,
    cmd_dataset_info,
    cmd_dataset_pack,
    cmd_dataset_resequence,
    cmd_dataset_timm,
)
from mdot_jax.errors import MdotError, UsageError
from mdot_jax.options import GPU_PRICERS, LAYOUTS, MEASURED_OPTIMIZERS, MEASURED_PRECISIONS

BUILD_COMMANDS = {  # name -> one line for `mdot --help`
    "profile": "measure training iterations (or single operators) of zoo models here",
    "kernels": "fit a kernel cost model (operator -> ms) on measured operators",
    "train": "train a predictor on a dataset, write a checkpoint",
    "evaluate": "MDOT and every baseline on identical leave-family-out folds",
    "calibrate": "give a checkpoint the error bands of an evaluation of its recipe",
    "dataset": "build, inspect or check a training-time dataset",
    "gpu-fit": "fit the GPU step model (any NVIDIA GPU from its spec sheet) on NeuSight's data",
}


def cmd_profile(args: argparse.Namespace) -> int:
    from mdot_jax.measure.device import device_folder
    from mdot_jax.measure.profiler import Protocol, profile
    from mdot_jax.measure.zoo import ZOOS

    if args.ops:
        return _profile_ops(args)
    keys = None
    if args.core_set:  # the device core set: common ground with every other device
        from mdot_jax.measure import core_set

        keys, args.zoo = core_set.load()["core_set"], args.zoo or ",".join(ZOOS)
    if not args.zoo:
        raise UsageError("profile: --zoo is required (or --core-set, or --ops to measure "
                         "single operators)")
    out = args.out or str(device_folder(args.threads, args.optimizer, args.precision,
                                        args.layout))
    protocol = Protocol(warmup=args.warmup, repeats=args.repeats, max_iter_s=args.max_iter_s,
                        budget_s=args.budget_s, optimizer=args.optimizer,
                        precision=args.precision, layout=args.layout, trace=args.trace)
    zoos = [f"random:{args.n}:{args.seed}" if z == "random" else z for z in args.zoo.split(",")]
    try:
        report = profile(zoos, args.batch_sizes, args.image_sizes, out,
                         seq_lens=args.seq_lens, threads=args.threads,
                         models=args.models.split(",") if args.models else None,
                         protocol=protocol, retry_skipped=args.retry_skipped,
                         retry_noisy=args.retry_noisy, keys=keys)
    except MdotError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None
    noisy = f"; {report['noisy']} noisy (kept apart in noisy.jsonl)" if report.get("noisy") else ""
    print(f"{report['samples']} samples in {out}{noisy}; skipped by reason: "
          f"{report['skipped_by_reason']}")
    return 0


def _profile_ops(args: argparse.Namespace) -> int:
    from mdot_jax.kernels.op_profile import OpProtocol, profile_ops
    from mdot_jax.measure.device import device_folder

    out = args.out or str(device_folder(args.threads, precision=args.precision) / "ops")
    if bool(args.ops_more) != bool(args.ops_kinds):
        raise UsageError("--ops-more and --ops-kinds go together: how many more operators, "
                         "of which kinds (e.g. --ops-more 4000 --ops-kinds "
                         "Conv:depthwise,Conv:grouped)")
    try:
        report = profile_ops(out, n=args.ops_n, threads=args.threads,
                             sources=args.ops_from.split(",") if args.ops_from else None,
                             protocol=OpProtocol(warmup=args.warmup, repeats=args.repeats,
                                                 precision=args.precision),
                             max_minutes=args.max_minutes, more=args.ops_more or 0,
                             kinds=args.ops_kinds.split(",") if args.ops_kinds else ())
    except MdotError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None
    noisy = f"; {report['noisy']} noisy (kept apart in noisy.jsonl)" if report["noisy"] else ""
    print(f"{report['samples']} of {report['planned']} planned operators measured in {out}"
          f"{noisy}; skipped by reason: {report['skipped_by_reason']}")
    return 0


def cmd_kernels(args: argparse.Namespace) -> int:
    from mdot_jax.kernels.cost_model import CostModel
    from mdot_jax.kernels.op_profile import read_op_samples

    records = read_op_samples(args.ops)
    if len(records) < 20:
        raise UsageError(f"{args.ops}: {len(records)} operator samples; measure more first "
                         "(`mdot profile --ops`)")
    writers.prepare_file(args.out, force=args.force, flag="--out")
    try:
        model = CostModel.fit(records, seed=args.seed)
    except ValueError as e:
        raise UsageError(f"{args.ops}: {e}") from None
    writers.write_file(args.out, model.save, flag="--out")
    print(f"kernel cost model of {model.device} from {len(records)} operator samples: "
          f"{args.out} (held-out accuracy: benchmarks/bench_kernels.py)")
    return 0


def cmd_gpu_fit(args: argparse.Namespace) -> int:
    from mdot_jax.gpu import cnn_kernels, gpu_fit, neusight, streaming, tensor_cores
    from mdot_jax.gpu.tensor_cores import TensorCoreGemms
    from mdot_jax.measure import kernel_sweep
    from mdot_jax.storage import checkpoint

    if bool(args.host_steps) != bool(args.host_device):
        raise UsageError("--host-steps and --host-device go together: the steps, and the GPU "
                         "they ran on")
    try:  # the folder and tables first: a bad one fails before --out is made and the long fit
        neusight.folders(args.neusight)
        gemms = TensorCoreGemms.fit(args.tensor_core_gemms) if args.tensor_core_gemms else None
        fits = {  # a step model's key <- a lent GPU's kernel sweep, by the flag of its name
            "fused_attention": tensor_cores.fit_attention,
            "fp8_gemms": lambda rows: tensor_cores.fit_sweep_gemms(rows, "fp8"),
            "unaligned_gemms": tensor_cores.fit_unaligned,
            "channels_last": cnn_kernels.fit_layout,
            "streaming_kernels": streaming.fit_sweep_rows}
        swept = {k: dict(fit(kernel_sweep.read(path)), source=path)
                 for k, fit in fits.items() if (path := getattr(args, k))}
        out = checkpoint.prepare_out(args.out, force=args.force, shipped=True)  # its default
        model = gpu_fit.fit(args.neusight, tables=args.tables, pricer=args.pricer,
                            seed=args.seed, progress=print)
        if gemms:
            model.info["tensor_core_gemms"] = gemms.to_json()
            print("tensor-core GEMMs: " + "; ".join(
                f"{k} {c.share_compute:.0%} of the peak, {1e3 * c.fixed_ms:.1f} us fixed "
                f"({c.mape:.1f}% MAPE over {c.rows} GEMMs of the {gemms.gpu})"
                for k, c in gemms.constants.items()))
        model.info.update(swept)  # before the host: its fit prices kernels with them
        if args.host_steps:
            model.info["host_ms_per_kernel"] = gpu_fit.fit_host(
                model, args.host_steps, args.host_device, progress=print)
            model.info["host_source"] = f"{', '.join(args.host_steps)} ({args.host_device})"
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from None
    model.info["command"] = f"mdot gpu-fit {args.neusight} --out {args.out}" + (
        f" --tables {args.tables}" if args.tables else "") + f" --pricer {args.pricer}" + (
        f" --tensor-core-gemms {args.tensor_core_gemms}" if args.tensor_core_gemms else "") + (
        "".join(f" --{k.replace('_', '-')} {v['source']}" for k, v in swept.items())) + (
        f" --host-steps {' '.join(args.host_steps)} --host-device '{args.host_device}'"
        if args.host_steps else "")
    checkpoint.save_step_model(model, out)
    print(f"GPU step model fitted on {', '.join(model.info['fitted_gpus'])}: {out} (80% band "
          f"{math.exp(model.band[0]):.2f}x-{math.exp(model.band[1]):.2f}x of a prediction)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from mdot_jax import recipes
    from mdot_jax.training.workflow import train_and_save

    try:
        recipe = recipes.get(args.recipe)
    except ValueError as e:
        raise UsageError(f"--recipe: {e}") from None
    ds = _dataset(args.dataset)
    model_cfg = _config(recipe.model, args.model_config)
    train_cfg = _config(recipe.train, args.train_config)
    result = train_and_save(ds, args.out, split=args.split, fold=args.fold,
                            model_cfg=model_cfg, train_cfg=train_cfg,
                            companion=recipe.companion and not args.no_companion,
                            cost_model=_cost_model(args.op_costs), force=args.force,
                            log=lambda line: print(line, file=sys.stderr, flush=True))
    m = result["test_metrics"]
    if m:
        print(f"test ({args.split} split, fold {args.fold}): MAE {m['mae_ms']:.3g} ms, "
              f"RMSE {m['rmse_ms']:.3g} ms, MAPE {m['mape']:.2f}% on {m['n']} samples")
    if m.get("model_only"):
        print(f"  of which {model_cfg.label} alone: MAPE {m['model_only']['mape']:.2f}%")
    print(f"checkpoint: {args.out}")
    return 0


def _cost_model(path: str | None):
    """`--op-costs`: a kernel cost model (`benchmarks/bench_kernels.py` writes one), or None."""
    if not path:
        return None
    from mdot_jax.kernels.cost_model import CostModel

    try:
        return CostModel.load(path)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--op-costs {path}: not a kernel cost model ({e})") from None


def cmd_calibrate(args: argparse.Namespace) -> int:
    from mdot_jax.evaluation.evaluate import calibrate
    from mdot_jax.storage.shipped import resolve_checkpoint

    path = resolve_checkpoint(args.checkpoint)
    ds = _dataset(args.dataset)
    try:
        cal = calibrate(path, args.results, ds,
                        tuple(args.methods.split(",")) if args.methods else None,
                        _dataset(args.novel) if args.novel else None)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"{path}: error bands of {' x '.join(cal.methods)} from {cal.source}")
    for layout, bands in cal.bands.items():
        for label, b in zip(cal.labels(layout), bands):
            print(f"  {layout}, disagreement {label:>8}: n={b.n:>5}, median error "
                  f"{b.median_ape:.1f}%, 80% band x{math.exp(b.lo):.3f} .. "
                  f"x{math.exp(b.hi):.3f}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from mdot_jax.evaluation.evaluate import read_results, run, source_commit
    from mdot_jax.evaluation.methods import ALL_METHODS
    from mdot_jax.evaluation.report import check_ensembles, summarize
    from mdot_jax.training.train import TrainConfig

    ds = _dataset(args.dataset)
    novel = args.split.startswith("novel")
    if novel != bool(args.novel):
        raise UsageError("--novel DIR goes with --split novel or novel-zoo, and they with it")
    if novel:
        from mdot_jax.data.splits import with_novel

        try:
            ds = with_novel(ds, _dataset(args.novel))
        except ValueError as e:
            raise UsageError(str(e)) from None
    op_samples = None
    if args.op_costs:  # op-grounded: per fold, a cost model of the training families' operators
        from mdot_jax.kernels.op_profile import read_op_samples

        op_samples = read_op_samples(args.op_costs)
        if not op_samples:
            raise UsageError(f"--op-costs {args.op_costs}: no operator samples there "
                             "(`mdot profile --ops` writes them)")
    views = {}
    for spec in (args.views.split(",") if args.views else []):
        name, _, path = spec.partition("=")
        if not name or not path:
            raise UsageError(f"--views {spec!r}: expected NAME=DATASET_DIR")
        views[name] = _dataset(path)
    methods = ALL_METHODS if args.methods == "all" else tuple(args.methods.split(","))
    budget = _config(TrainConfig(), args.train_config)
    ensembles = args.ensembles.split(",") if args.ensembles else ()
    if args.folds < 2 and args.split in ("family", "batch"):
        raise UsageError(f"--folds {args.folds}: the {args.split} split tests on one fold and "
                         "trains on the others: give 2 or more (--split random --folds 1: "
                         "one 70/30 split)")
    try:
        check_ensembles(ensembles)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.summary_only:
        rows = read_results(args.out)
        if not rows:
            raise UsageError(f"{args.out}: no results to summarise")
    else:
        try:
            rows = run(ds, args.out, split=args.split, folds=args.folds, seeds=args.seeds,
                       methods=methods, budget=budget, only_folds=args.only_folds,
                       op_samples=op_samples, views=views, fold_seed=args.fold_seed)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if novel:
        from mdot_jax.evaluation.novel import novel_summary

        print(novel_summary(rows, ds, args.out, command="mdot " + " ".join(sys.argv[1:]),
                            ensembles=ensembles))
        return 0
    try:
        summarize(rows, ds, args.out, command="mdot " + " ".join(sys.argv[1:]),
                  commit=source_commit(),
                  ensembles=ensembles)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(open(os.path.join(args.out, "table.md")).read())
    print(f"plots: {args.out}/pred_vs_measured.png, {args.out}/error_by_family.png")
    return 0


def add_commands(sub) -> None:
    """Adds the build commands to the `mdot` subparsers `sub`."""
    p = sub.add_parser("dataset", description=BUILD_COMMANDS["dataset"])
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    q = dsub.add_parser("timm", help="build the dataset of timm's GPU training benchmarks")
    q.add_argument("--csv", action="append", required=True,
                   help="benchmark-train-*.csv (repeatable: nchw and nhwc)")
    q.add_argument("--out", help="dataset directory (default: under ~/.cache/mdot/datasets)")
    q.add_argument("--limit", type=POSITIVE_INT, help="only the first N architectures")
    q.add_argument("--retry-skipped", action="store_true", help="retry rows skipped before")
    q.add_argument("--models", help="only these architectures (comma-separated)")
    q.add_argument("--fuse", action="store_true",
                   help="convert with eager-kernel fusion (GELU, SiLU, no-op Dropout)")
    q.set_defaults(func=cmd_dataset_timm)
    q = dsub.add_parser("resequence", help="copy a dataset with its operator sequences "
                                           "converted again (with eager-kernel fusion)")
    q.add_argument("src", help="a timm dataset (its onnx/ exports) or a profiled one "
                               "(models rebuilt from the zoo)")
    q.add_argument("--out", required=True, help="new dataset directory")
    q.add_argument("--no-fuse", action="store_true", help="convert without fusion")
    q.add_argument("--view", choices=("training", "torchscript", "dynamo"), default="training",
                   help="the graph to convert: the training export (default), or the "
                        "inference export users get from torch.onnx.export(model.eval(), ...) "
                        "with the TorchScript or the dynamo exporter (same labels)")
    q.set_defaults(func=cmd_dataset_resequence)
    q = dsub.add_parser("pack", help="pack a dataset's sequence files into one archive "
                                     "(seqs.tar.xz), as committed datasets are kept")
    q.add_argument("dir")
    q.set_defaults(func=cmd_dataset_pack)
    q = dsub.add_parser("info", help="summary of a dataset directory")
    q.add_argument("dir")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_dataset_info)

    q = dsub.add_parser("check", help="every unusable line of a dataset, with its number and "
                                      "reason (exit 1 if any)")
    q.add_argument("dir")
    q.add_argument("--fix", action="store_true",
                   help="move those lines to rejected.jsonl (nothing is deleted)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_dataset_check)

    p = sub.add_parser("profile", description=BUILD_COMMANDS["profile"])
    p.add_argument("--zoo", help="comma-separated: torchvision,timm,hf,random")
    p.add_argument("--n", type=POSITIVE_INT, default=100,
                   help="--zoo random: this many generated architectures (each at the size it "
                        "draws)")
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=0,
                   help="--zoo random: the generator's seed")
    p.add_argument("--ops", action="store_true",
                   help="measure single operators (forward, backward, update) drawn from the "
                        "graphs of model datasets, into <this machine's folder>/ops")
    p.add_argument("--ops-n", type=POSITIVE_INT, default=20000,
                   help="--ops: operators in the plan (fixed on the first run)")
    p.add_argument("--ops-from", help="--ops: comma-separated model datasets to draw the "
                                      "operators from (default: data/derived/cpu-*)")
    p.add_argument("--ops-more", type=POSITIVE_INT,
                   help="--ops: add this many operators of --ops-kinds to the plan (once; "
                        "run the same command again to resume)")
    p.add_argument("--ops-kinds", help="--ops-more: comma-separated op types or kinds "
                                       "(Conv:dense, Conv:depthwise, Conv:grouped, "
                                       "Gather:table)")
    p.add_argument("--max-minutes", type=POSITIVE_FLOAT,
                   help="--ops: stop after this long (resume by running it again)")
    p.add_argument("--core-set", action="store_true",
                   help="measure the device core set (mdot_jax/measure/core_set.json: ~150 "
                        "samples over 54 families, common ground with every other device)")
    p.add_argument("--models", help="only these model names (comma-separated)")
    p.add_argument("--batch-sizes", type=_int_list, default=[2, 4, 8, 16, 32, 64])
    p.add_argument("--image-sizes", type=_int_list, default=[64, 128, 224])
    p.add_argument("--seq-lens", type=_int_list, default=[32, 64, 128, 256])
    p.add_argument("--threads", type=POSITIVE_INT, default=2)
    p.add_argument("--optimizer", choices=MEASURED_OPTIMIZERS, default="sgd",
                   help="the training step's optimizer: SGD with momentum (default), AdamW")
    p.add_argument("--precision", choices=MEASURED_PRECISIONS,
                   default="fp32", help="fp32 (PyTorch's defaults), tf32 (matmuls too), or "
                                        "autocast to fp16 (with a gradient scaler) or bf16")
    p.add_argument("--layout", choices=LAYOUTS, default="nchw",
                   help="nhwc: image models in channels-last memory format")
    p.add_argument("--trace", action="store_true",
                   help="after the timed repeats, one more step under PyTorch's profiler: the "
                        "kernels launched, the GPU's busy time and the busiest kernels in each "
                        "sample's stats (on a CPU: the ATen operators)")
    p.add_argument("--warmup", type=POSITIVE_INT, default=2)
    p.add_argument("--repeats", type=POSITIVE_INT, default=5)
    p.add_argument("--max-iter-s", type=POSITIVE_FLOAT, default=4.0,
                   help="skip a sample whose warm-up iteration is slower")
    p.add_argument("--budget-s", type=POSITIVE_FLOAT, default=25.0,
                   help="time budget of the timed repeats of one sample")
    p.add_argument("--out", help="dataset directory (default: this machine's folder in $MDOT_DATA, "
                        "else ~/.local/share/mdot)")
    p.add_argument("--retry-skipped", action="store_true",
                   help="measure again what report.json says was skipped")
    p.add_argument("--retry-noisy", action="store_true",
                   help="measure again the samples kept apart in noisy.jsonl (CV above "
                        "15%% or another job running)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("train", description=BUILD_COMMANDS["train"])
    p.add_argument("--dataset", required=True, help="dataset directory")
    p.add_argument("--split", choices=["family", "random", "batch", "none"], default="family",
                   help="hold out one fold as the test set (none: train on everything)")
    p.add_argument("--fold", type=int, default=0, help="which fold is the test set")
    p.add_argument("--recipe", default="shipped",
                   help="shipped (GNN + LightGBM, default), paper (the paper's MDOT), mdot "
                        "(MDOT + LightGBM), tiny (seconds; for tests); see mdot_jax/recipes.py")
    p.add_argument("--model-config", help='JSON overrides of the recipe\'s, e.g. '
                                          '\'{"d_model": 32}\'')
    p.add_argument("--train-config", help='JSON overrides of the recipe\'s, e.g. '
                                          '\'{"epochs": 20}\'')
    p.add_argument("--out", required=True, help="checkpoint directory (new or empty)")
    p.add_argument("--force", action="store_true",
                   help="replace the checkpoint already in --out (never anything else)")
    p.add_argument("--op-costs", help="a kernel cost model (.json.xz, `mdot kernels`) of the "
                   "dataset's device: op-grounded features; the checkpoint carries it")
    p.add_argument("--no-companion", action="store_true",
                   help="save the network alone, without the LightGBM companion it "
                        "averages with")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("calibrate", description=BUILD_COMMANDS["calibrate"])
    p.add_argument("checkpoint", help="shipped checkpoint name or directory")
    p.add_argument("--results", required=True, help="an `mdot evaluate --split family` (or "
                   "novel) results directory on the same dataset")
    p.add_argument("--dataset", required=True, help="the dataset (for the measured times)")
    p.add_argument("--methods", help="the evaluated methods matching the checkpoint "
                   "(default: its network's, e.g. gnn or mdot-pe-none, with lightgbm if it "
                   "has a companion, and op-sum if it has an operator-sum line)")
    p.add_argument("--novel", metavar="DIR", help="--results of a novel split: its novel "
                   "dataset (the bands come from its held-out part alone)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("gpu-fit", description=BUILD_COMMANDS["gpu-fit"])
    p.add_argument("neusight", help="NeuSight's folder (../shared/datasets/neusight)")
    p.add_argument("--out", default="checkpoints/gpu-spec-sheet", help="step model folder")
    p.add_argument("--tables", metavar="DIR", help="XLA's H100 GEMM tables "
                   "(../shared/datasets/xla-h100-tables): tensor-core rows")
    p.add_argument("--tensor-core-gemms", metavar="DIR", help="XLA's H100 GEMM tables: the "
                   "share of the peak tensor-core GEMMs reach (`mdot_jax.gpu.tensor_cores`)")
    p.add_argument("--pricer", choices=GPU_PRICERS, default="trees",
                   help="the operator pricer: LightGBM (shipped) or the Flax kernel model "
                   "(work in progress)")
    p.add_argument("--fused-attention", metavar="SWEEP", help="a lent GPU's kernel sweep "
                   "(kernels.jsonl[.xz]): the share of the peak its SDPA flash kernels reach, "
                   "for GPUs of its architecture")
    p.add_argument("--streaming-kernels", metavar="SWEEP", help="a lent GPU's kernel sweep: "
                   "memory-bound kernels at the share of the bandwidth its elementwise, layer "
                   "norm and softmax kernels reach")
    p.add_argument("--fp8-gemms", metavar="SWEEP", help="a lent GPU's kernel sweep: the share "
                   "of the FP8 peak its fp8 GEMMs reach (--precision fp8's linear layers)")
    p.add_argument("--unaligned-gemms", metavar="SWEEP", help="a lent GPU's kernel sweep: its "
                   "GEMMs' slowdown at features not 16-byte aligned, for GPUs of its kind")
    p.add_argument("--channels-last", metavar="SWEEP", help="a lent GPU's kernel sweep: "
                   "its convolutions' and batch norms' NHWC / NCHW time ratios (--layout nhwc)")
    p.add_argument("--host-steps", metavar="DATASET", nargs="+", help="measured whole "
                   "steps (fused datasets) that fit the host's time to issue a kernel")
    p.add_argument("--host-device", help="the catalog's GPU --host-steps ran on")
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    p.add_argument("--force", action="store_true", help="replace the model in --out")
    p.set_defaults(func=cmd_gpu_fit)

    p = sub.add_parser("kernels", description=BUILD_COMMANDS["kernels"])
    p.add_argument("ops", help="operator dataset, e.g. data/<device>/ops")
    p.add_argument("--out", required=True, help="cost model file (.json)")
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    p.add_argument("--force", action="store_true", help="replace --out")
    p.set_defaults(func=cmd_kernels)

    p = sub.add_parser("evaluate", description=BUILD_COMMANDS["evaluate"])
    p.add_argument("--dataset", required=True)
    p.add_argument("--split", choices=["family", "random", "batch", "novel", "novel-zoo"],
                   default="family", help="random with --folds 1: one 70/30 split (the MDOT "
                   "paper's); novel, novel-zoo: trained on --dataset (novel-zoo: not its "
                   "random-zoo models), tested on --novel")
    p.add_argument("--novel", metavar="DIR", help="--split novel: the dataset of architectures "
                   "kept out of training")
    p.add_argument("--folds", type=POSITIVE_INT, default=5)
    p.add_argument("--seeds", type=POSITIVE_INT, default=1)
    p.add_argument("--only-folds", type=INDEX_LIST, default=None,
                   help="run only these folds of the split, e.g. 0,1")
    p.add_argument("--fold-seed", type=NON_NEGATIVE_INT, default=0,
                   help="another partition into folds, to confirm a decision on folds it was "
                        "not tuned on (default 0: the one every committed table uses)")
    p.add_argument("--methods", default="all", help="all, or comma-separated method names")
    p.add_argument("--train-config", help="JSON overrides of the neural methods' budget")
    p.add_argument("--out", required=True, help="results directory (resumable)")
    p.add_argument("--op-costs", metavar="OPS_DIR", help="operator samples of the dataset's "
                   "device (data/<device>/ops): every operator gets its predicted time as a "
                   "fourth dimension, graphs their sum (op-grounded; per fold, a kernel cost "
                   "model of the training families' operators)")
    p.add_argument("--views", metavar="NAME=DIR,...",
                   help="copies of the dataset with other graphs of the same samples "
                        "(`mdot dataset resequence --view`): each fitted model also predicts "
                        "from them, as methods <method>@<NAME>")
    p.add_argument("--ensembles", help="also score these ensembles of finished runs "
                   "(geometric mean of predictions), e.g. mdot-pe-none+lightgbm")
    p.add_argument("--summary-only", action="store_true",
                   help="only redo the table and plots from the results so far")
    p.set_defaults(func=cmd_evaluate)
