"""`mdot dataset ...`: build a dataset from timm's benchmark table, convert one again, pack it
for the repository, describe it, check it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from mdot_jax.cli_args import (
    _dataset,
    default_data_dir,
)
from mdot_jax.errors import UsageError


def cmd_dataset_timm(args: argparse.Namespace) -> int:
    from mdot_jax.data.build_timm import build_timm_supervised

    out = args.out or default_data_dir("timm-rtx3090")
    try:
        report = build_timm_supervised(
            args.csv, out, limit=args.limit, retry_skipped=args.retry_skipped,
            models=args.models.split(",") if args.models else None, fuse=args.fuse)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    for layout, entry in report["by_layout"].items():
        print(f"{layout}: {entry['built']}/{entry['rows']} rows built "
              f"({entry['built_percent']:.1f}%)")
    if report["skipped_by_reason"]:
        print(f"skipped by reason: {report['skipped_by_reason']} (details in {out}/report.json)")
    print(f"dataset: {out}")
    return 0


def cmd_dataset_resequence(args: argparse.Namespace) -> int:

    from mdot_jax.data import build_timm
    from mdot_jax.data.resequence import RESEQUENCE_FAILED
    from mdot_jax.measure import zoo

    # a timm dataset (rows of a benchmark table) keeps its exports or is rebuilt from timm; a
    # profiled one is exported again from its zoo
    module = build_timm if build_timm.is_timm_dataset(args.src) else zoo
    try:
        ds = module.resequence(args.src, args.out, fuse=not args.no_fuse, view=args.view)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(f"{len(ds)} samples, {args.view} graphs {'with' if not args.no_fuse else 'without'} "
          f"eager-kernel fusion: {args.out}")
    failed = Path(args.out) / RESEQUENCE_FAILED
    left_out = failed.read_text().count("\n") if failed.exists() else 0
    if left_out:
        print(f"{left_out} samples left out: they could not be exported this way ({failed})")
    return 0


def cmd_dataset_pack(args: argparse.Namespace) -> int:
    from mdot_jax.data.store import pack_sequences

    r = pack_sequences(args.dir)  # a DatasetError names the file
    print(f"{r['sequences']} sequences ({r['packed_now']} packed now) in {r['path']}, "
          f"{r['bytes'] / 2**20:.1f} MiB")
    return 0


def cmd_dataset_info(args: argparse.Namespace) -> int:
    ds = _dataset(args.dir, empty_ok=True)
    if not len(ds):
        print(json.dumps(dict(path=args.dir, num_samples=0)) if args.json
              else f"{args.dir}: 0 samples")
        return 0
    summary = ds.summary()
    if args.json:
        print(json.dumps(summary))
        return 0
    lab = summary["label_ms"]
    print(f"{summary['path']}: {summary['num_samples']} samples, "
          f"{summary['num_architectures']} architectures, {summary['num_families']} families")
    print(f"devices: {', '.join(summary['devices'])}; label {lab['min']:.3g} .. "
          f"{lab['median']:.3g} (median) .. {lab['max']:.3g} ms; batch sizes "
          f"{summary['batch_sizes']}; input sizes {summary['input_sizes']}")
    if summary["median_cv"] is not None:
        print(f"noise: median CV of repeats {summary['median_cv']:.2f}%")
    if summary["missing_sequences"]:
        print(f"{summary['missing_sequences']} samples without their operator sequence (not "
              f"trainable until `mdot dataset resequence {args.dir} --out NEW`)")
    if summary["twins"] is not None:
        t = summary["twins"]
        print(f"noise: {t['samples']} samples have a twin (same operator graph and workload "
              f"under another name); predicting each by its twins errs {t['mape']:.2f}% "
              f"(median {t['median_ape']:.2f}%): the labels' own noise")
    top = list(summary["families"].items())[:12]
    print("largest families: " + ", ".join(f"{f} ({n})" for f, n in top))
    return 0


def cmd_dataset_check(args: argparse.Namespace) -> int:
    from mdot_jax.data.dataset import REJECTED
    from mdot_jax.data.store import check_dataset

    report = check_dataset(args.dir, fix=args.fix)
    if args.json:
        print(json.dumps(report))
    else:
        for q in report["problems"]:
            print(f"{report['path']}: line {q['line']}: {q['reason']}")
        n = len(report["problems"])
        print(f"{report['samples']} usable samples, {n} problem{'s' * (n != 1)}"
              + (f"; moved to {os.path.join(args.dir, REJECTED)}" if report["fixed"] else
                 "; `--fix` moves them aside" if n else ""))
    return 1 if report["problems"] and not report["fixed"] else 0
