"""Builds the `timm-rtx3090` dataset from the timm project's published training benchmarks.

For every CSV row: rebuild the architecture with `timm.create_model(name, pretrained=False)`
(random weights, nothing from a hub), check its parameter count against the row (within 5%),
export the training graph once per (architecture, image size) with a dynamic batch, convert it
at the row's batch size, and store the sample with its label (`train_step_time`, ms per step).
Rows that cannot be rebuilt are listed with their reason in `report.json`.

Resumable: samples already in the dataset and rows already recorded as skipped are not redone
(`retry_skipped=True` retries the latter). A process killed while building an architecture
(the kernel's out-of-memory killer, on the largest models) leaves its rows recorded as
`killed_while_building`, so resuming moves past them instead of dying on them again;
`build_timm_supervised` does that resuming itself (see there).
Incremental: each sample is appended as soon as it is built (see `mdot_jax.data.dataset`).
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import onnx

from converters import ConversionError, convert, from_torch, inference_export
from mdot_jax.data import dataset as data
from mdot_jax.data import resequence as copies
from mdot_jax.data.dataset import Dataset, Sample, Workload
from mdot_jax.data.store import DatasetWriter, SkipLog, writer_lock

PARAM_TOLERANCE = 0.05


def read_rows(csv_path: str | Path) -> list[dict]:
    """Rows of one benchmark CSV, with the workload fields its file name implies."""
    path = Path(csv_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such CSV file")
    name = path.name.lower()
    device = (re.search(r"(rtx\d+|a100|v100|h100|t4)", name) or [None, "gpu"])[0]
    layout = "nhwc" if "nhwc" in name else "nchw"
    precision = "amp-fp16" if "amp" in name else "fp32"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "train_step_time" not in rows[0]:
        raise ValueError(f"{path}: not a timm training benchmark (no train_step_time column)")
    for r in rows:
        r.update(_layout=layout, _device=device, _precision=precision, _csv=path.name)
    return rows


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _layout_report(rows: list[dict], done: set[str]) -> dict:
    by_layout: dict[str, dict] = defaultdict(lambda: dict(rows=0, built=0))
    for r in rows:
        entry = by_layout[r["_layout"]]
        entry["rows"] += 1
        entry["built"] += _key(r) in done
    for entry in by_layout.values():
        entry["built_percent"] = round(100.0 * entry["built"] / max(entry["rows"], 1), 2)
    return dict(rows=len(rows), built=sum(_key(r) in done for r in rows),
                by_layout=dict(by_layout))


def _key(row: dict) -> str:
    return f"{row['_layout']}/{row['model']}"


def build_timm(csv_paths: list[str | Path], out: str | Path, *, limit: int | None = None,
               models: list[str] | None = None, retry_skipped: bool = False,
               fuse: bool = False, progress: bool = True) -> dict:
    """Builds (or resumes) the dataset in `out`; returns the report (also in report.json).

    Args:
      csv_paths: timm `benchmark-train-*.csv` files (e.g. nchw and nhwc).
      limit: only the first `limit` architectures (for tests and trials).
      models: only these architectures.
      fuse: convert with eager-kernel fusion (`converters.fusion`).
    """
    import timm
    import torch
    from tqdm import tqdm

    # Explicit attention instead of F.scaled_dot_product_attention: the TorchScript exporter
    # cannot trace timm's fused path, and PyTorch 1.12 (the benchmark's) had no fused kernel.
    timm.layers.set_fused_attn(False)
    root = Path(out)
    with writer_lock(root):  # one writer a folder, never among the user's files
        writer = DatasetWriter(root)
        report = SkipLog(root)
        all_rows = [r for p in csv_paths for r in read_rows(p)]  # the report covers all of them
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in all_rows:
            if models is None or r["model"] in models:
                groups[r["model"]].append(r)
        archs = list(groups)[:limit] if limit else list(groups)
        rows = [r for a in archs for r in groups[a]]
        onnx_dir = root / "onnx"
        onnx_dir.mkdir(parents=True, exist_ok=True)

        def todo(r):
            return _key(r) not in writer.done and (retry_skipped or _key(r) not in report.skipped)

        bar = tqdm(total=sum(map(todo, rows)), unit="row", disable=not progress,
                   desc="timm dataset", smoothing=0.05)
        for arch in archs:
            pending = [r for r in groups[arch] if todo(r)]
            if not pending:
                continue
            # Recorded before the attempt: a process killed while building (out of memory on
            # the largest models) leaves the reason behind, so a resumed build moves past it.
            for r in pending:
                report.skip(_key(r), "killed_while_building", "the build process died on this "
                            "architecture (out of memory?); --retry-skipped tries again")
            report.write(**_layout_report(all_rows, writer.done))
            try:
                _build_arch(arch, pending, writer, report, onnx_dir, timm, torch, fuse)
            finally:  # built rows, and rows an exception interrupted, lose the mark
                for r in pending:
                    if report.skipped[_key(r)]["reason"] == "killed_while_building":
                        del report.skipped[_key(r)]
                report.write(**_layout_report(all_rows, writer.done))
            bar.update(len(pending))
        bar.close()
        return report.write(**_layout_report(all_rows, writer.done))


def build_timm_supervised(csv_paths: list[str | Path], out: str | Path, *,
                          max_restarts: int = 20, target=build_timm, **kwargs) -> dict:
    """`build_timm` in a child process that is restarted when the kernel kills it.

    One process building ~800 architectures grows until the out-of-memory killer stops it
    (cait_m48_448 after ~800 models, at 24 GiB); the same model builds in a fresh process.
    So: run the build in a child; when a signal kills it, start a new child, which resumes
    past the architecture it died on (`killed_while_building`); at the end retry each such
    architecture once more, alone in a fresh child. Restarts cost one import of torch.

    Args:
      kwargs: as for `build_timm`.
      target: the build function (tests substitute one that dies).
    """
    for p in csv_paths:  # bad input fails here, in one line, not as a child's traceback
        read_rows(p)
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited memory

    def run(**kw) -> int:
        child = ctx.Process(target=target, args=(csv_paths, out), kwargs={**kwargs, **kw})
        child.start()
        child.join()
        if child.exitcode and child.exitcode > 0:
            raise RuntimeError(f"{out}: the timm build failed (exit {child.exitcode}, its "
                               "error is printed above)")
        return child.exitcode

    for attempt in range(max_restarts + 1):
        code = run()
        if code == 0:
            break
        print(f"timm build: the build process was killed (signal {-code}); resuming in a new "
              f"process ({attempt + 1}/{max_restarts})", file=sys.stderr)
    else:
        raise RuntimeError(f"{out}: the timm build was killed {max_restarts + 1} times; "
                           "the same command resumes it")
    killed = json.loads((Path(out) / "report.json").read_text())["skipped"]
    for arch in sorted({k.split("/", 1)[1] for k, v in killed.items()
                        if v["reason"] == "killed_while_building"}):
        print(f"timm build: retrying {arch} alone in a fresh process", file=sys.stderr)
        run(models=[arch], retry_skipped=True, limit=None)
    return json.loads((Path(out) / "report.json").read_text())


def _build_arch(arch, rows, writer, report, onnx_dir, timm, torch, fuse) -> None:
    good = []
    for r in rows:
        ms, bs, img = _float(r["train_step_time"]), _float(r["train_batch_size"]), \
            _float(r["train_img_size"])
        if not (ms > 0) or not (bs >= 1) or not (img >= 1):
            report.skip(_key(r), "bad_row", f"time={r['train_step_time']} batch="
                        f"{r['train_batch_size']} img={r['train_img_size']}")
        else:
            good.append(r)
    if not good:
        return
    try:  # deprecated names (e.g. convnext_base_in22ft1k) still build under their new tags
        model = timm.create_model(arch, pretrained=False)
    except Exception as e:  # noqa: BLE001 - any build failure is a reason, not a crash
        reason = "unknown_model" if "Unknown model" in str(e) else "build_failed"
        for r in good:
            report.skip(_key(r), reason, f"timm {timm.__version__}: {type(e).__name__}: {e}")
        return
    n_params = sum(p.numel() for p in model.parameters())
    exports: dict[int, onnx.ModelProto | ConversionError] = {}
    for r in good:
        expected = _float(r["param_count"]) * 1e6
        if not abs(n_params - expected) <= PARAM_TOLERANCE * expected:
            report.skip(_key(r), "param_mismatch",
                        f"built {n_params / 1e6:.2f}M, row {r['param_count']}M")
            continue
        img, bs = int(_float(r["train_img_size"])), int(_float(r["train_batch_size"]))
        t0 = time.perf_counter()
        try:
            if img not in exports:
                exports[img] = _export(arch, model, img, onnx_dir, torch)
            seq_key = f"{arch}-{img}-b{bs}"
            if not writer.has_seq(seq_key):
                seq = convert(exports[img], name=arch, batch_size=bs, fuse=fuse)
                if seq.unknown_ops:
                    report.skip(_key(r), "unknown_ops", json.dumps(seq.unknown_ops))
                    continue
                writer.save_seq(seq_key, seq)
        except ConversionError as e:
            report.skip(_key(r), "export_or_convert_failed", str(e))
            continue
        writer.append(Sample(
            key=_key(r), arch=arch, seq_path=f"seqs/{seq_key}.npz",
            workload=Workload(batch_size=bs, input_size=img, precision=r["_precision"],
                              layout=r["_layout"], device=r["_device"], optimizer="sgd"),
            label_ms=_float(r["train_step_time"]),
            meta=dict(source=r["_csv"], param_count_m=_float(r["param_count"]),
                      built_params=n_params, samples_per_sec=_float(
                          r.get("train_samples_per_sec")),
                      build_s=round(time.perf_counter() - t0, 2))))


def resequence(src: str | Path, out: str | Path, *, fuse: bool | int = True,
               view: str = "training", progress: bool = True) -> Dataset:
    """`data.resequence` from `src`'s stored exports (`onnx/`, shared by a link): minutes
    instead of the hour a rebuild takes. Without them (a committed copy holds none), or for
    another `view` (an inference export of `converters.INFERENCE_EXPORTERS`), each
    architecture is rebuilt from timm and exported. The training view of an older fusion
    version reuses what the newer one would not change."""
    src = Path(src).absolute()
    if view != "training":
        return copies.resequence(src, out, _rebuilt_exporter(view), fuse=fuse, partial=True,
                               progress=progress)
    if not (src / "onnx").is_dir():
        return copies.resequence(src, out, _rebuilt_exporter(view), fuse=fuse, reuse=True,
                               progress=progress)
    Path(out).mkdir(parents=True, exist_ok=True)
    if not (Path(out) / "onnx").exists():
        (Path(out) / "onnx").symlink_to(src / "onnx", target_is_directory=True)

    def export_of(sample: Sample) -> Path:  # seqs/<arch>-<img>-b<batch>.npz
        return src / "onnx" / f"{Path(sample.seq_path).stem.rsplit('-b', 1)[0]}.onnx"

    return copies.resequence(src, out, export_of, fuse=fuse, reuse=True, progress=progress)


def is_timm_dataset(root: str | Path) -> bool:
    """Built from timm benchmark tables (its exports in `onnx/`, or its rows naming a CSV)."""
    root = Path(root)
    if (root / "onnx").is_dir():
        return True
    try:
        with open(root / data.SAMPLES) as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, json.JSONDecodeError):
        return False
    return str(first.get("meta", {}).get("source", "")).endswith(".csv")


def _rebuilt_exporter(view: str) -> Callable[[Sample], onnx.ModelProto]:
    """`export(sample)`: the sample's architecture rebuilt at its image size and exported,
    as `view` (`training`: `from_torch`, as the build does; or an inference exporter of
    `converters.INFERENCE_EXPORTERS`), once per graph (`data.per_graph`)."""
    import timm
    import torch

    timm.layers.set_fused_attn(False)  # as the training exports were made

    def export(arch: str, size: int) -> onnx.ModelProto:
        model = timm.create_model(arch, pretrained=False)
        chans = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0] or 3
        x = torch.randn(2, chans, size, size)
        if view == "training":
            return from_torch(model, x, input_names=["x"])
        return inference_export(model, x, exporter=view, input_names=["x"])

    return copies.per_graph(export)


def _export(arch, model, img, onnx_dir, torch) -> onnx.ModelProto:
    """The architecture's training graph at `img` px (cached on disk, batch dynamic)."""
    path = onnx_dir / f"{arch}-{img}.onnx"
    if path.exists():
        return onnx.load(str(path))
    in_chans = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0] or 3
    proto = from_torch(model, torch.randn(2, in_chans, img, img), input_names=["x"])
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(proto.SerializeToString())
    tmp.replace(path)
    return proto
