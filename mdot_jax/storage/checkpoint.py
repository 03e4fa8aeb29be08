"""Self-describing checkpoints: Orbax weights + one JSON with everything else.

A checkpoint directory holds
  params/         the parameters (orbax StandardCheckpointer; works with 0.11.36 and 0.12.x)
  metadata.json   format version, model config, feature config, normalisation statistics,
                  operator vocabulary (+ version), dataset fingerprint, metrics, training info
  companion.txt.xz  optional: the LightGBM companion (`companion.TreeModel`, LightGBM's text
                  format, xz-compressed: 4x smaller; `companion.txt.gz` and `companion.txt`
                  before, both still read)
and, optionally, in metadata.json the error bands measured on held-out families
(`calibration.Calibration`, added by `attach_calibration`) and, op-grounded with a
companion, the operator-sum line (`kernels.cost_model.OpSumLine`, the prediction's third
member), so `load(path)` and `load_companion(path)` need nothing else. Saves are atomic and
one at a time: everything is written to a temporary sibling directory which then takes the
target's place in one step (`mdot_jax.writers`).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import json
import lzma
import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from converters.vocab import VOCAB, VOCAB_VERSION
from mdot_jax import writers
from mdot_jax.data.features import FeatureConfig, FeatureStats
from mdot_jax.errors import CheckpointError
from mdot_jax.kernels.cost_model import COST_MODEL, CostModel, OpSumLine
from mdot_jax.models import ModelConfig, build_model
from mdot_jax.models.trained import Trained
from mdot_jax.models.trees import TreeModel
from mdot_jax.storage.calibration import Calibration
from mdot_jax.storage.shipped import METADATA, SHIPPED_DIR, STEP_MODEL, shipped_names

# 2: derived convolution-kind features (features.CONV_KINDS, GRAPH_TOTALS); format-1 weights
# expect other input widths
FORMAT_VERSION = 2
COMPANION = "companion.txt.xz"


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` holds a checkpoint written by `save` (of any format version), or a GPU
    step model (`models.gpu_ops.StepModel`)."""
    if (Path(path) / STEP_MODEL).is_file():
        return True
    try:
        return "format_version" in json.loads((Path(path) / METADATA).read_text())
    except (OSError, ValueError, TypeError):
        return False


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def prepare_out(path: str | Path, *, force: bool = False, shipped: bool = False) -> Path:
    """Checks, before any work, that a checkpoint can be written to `path`: a new or empty
    directory, or (with `force`) a checkpoint of ours to replace; never a shipped checkpoint
    (but with `shipped`: `mdot gpu-fit` rebuilds the shipped step model in place) or anything
    else, and only where this process can write. Takes the writer's lock of `path` for the
    rest of the process (a second writer is refused) and settles what a killed writer left
    there (`writers.recover`). Returns the absolute path."""
    if str(path) in shipped_names() and not shipped:
        raise CheckpointError(f"--out {path}: the name of a shipped checkpoint, which "
                              f"`--checkpoint {path}` always loads; write to another name, or "
                              f"to ./{path}")
    path = Path(path).absolute()
    if not shipped:
        _refuse_shipped(path, "--out ")
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"--out {path}: is a file, not a checkpoint directory")
    _own(path, "--out ", shipped)
    if path.exists() and not _empty_dir(path):
        if not is_checkpoint(path):
            raise CheckpointError(f"--out {path}: not empty and not a checkpoint; refusing to "
                                  "replace it (choose a new directory)")
        if not force:
            raise CheckpointError(f"--out {path}: holds a checkpoint; --force replaces it")
    probe = writers.temporary(path)
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise CheckpointError(f"--out {path}: cannot write there ({e.strerror or e})") from None
    return path


def amend_step_model(folder: Path, change: Callable[[dict], None]) -> None:
    """Applies `change` (in place, to the metadata's dict) to the GPU step model in `folder`:
    the metadata written beside it, then swapped in whole (what a study's `--ship` adopts)."""
    path = Path(folder) / STEP_MODEL
    meta = json.loads(path.read_text())
    change(meta)
    tmp = writers.temporary(path)
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, path)


def step_model_copy(base: Path, folder: Path, **meta: Any) -> Path:
    """A copy of the GPU step model `base` (its README left out) at `folder` with `meta` set in
    its metadata (a study's candidate), built beside it and swapped in; what `folder` held is
    replaced only if it is a step model."""
    folder = Path(folder)
    if folder.exists() and not (folder / STEP_MODEL).is_file():
        raise CheckpointError(f"{folder}: exists and is no GPU step model; refusing to replace it")
    tmp = writers.temporary(folder)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns("README.md"))
    amend_step_model(tmp, lambda m: m.update(meta))
    writers.replace_dir(tmp, folder)
    return folder


def save_step_model(model: Any, path: Path) -> None:
    """Writes a GPU step model (`gpu.gpu_ops.StepModel`) beside `path`, then swaps it in."""
    tmp = writers.temporary(path)
    model.save(tmp)
    move_into_place(tmp, path)


def save(trained: Trained, path: str | Path, *, dataset: dict | None = None,
         metrics: dict | None = None, description: str = "",
         companion: TreeModel | None = None, companion_info: dict | None = None,
         cost_model: CostModel | None = None, op_sum: OpSumLine | None = None) -> Path:
    """Writes `trained` (and its `companion`, the kernel `cost_model` of op-grounded
    features and its `op_sum` line, if any) to `path` atomically, replacing only an empty
    directory or a checkpoint (`prepare_out` says so before training); returns the path."""
    path = Path(path).absolute()
    if path.exists() and not (_empty_dir(path) or is_checkpoint(path)):
        raise CheckpointError(f"{path}: not a checkpoint; refusing to replace it")
    _own(path)
    tmp = writers.temporary(path)
    pure = jax.tree.map(np.asarray, nnx.to_pure_dict(trained.params))
    ckptr = _checkpointer()
    ckptr.save(tmp / "params", pure)
    ckptr.wait_until_finished()
    meta = dict(
        format_version=FORMAT_VERSION, description=description,
        model_config=dataclasses.asdict(trained.model_cfg),
        feature_config=dataclasses.asdict(trained.feature_cfg),
        stats=trained.stats.to_json(), vocab=list(VOCAB), vocab_version=VOCAB_VERSION,
        dataset=dataset or {}, metrics=metrics or {}, train=trained.info,
        history=trained.history,
    )
    if cost_model is not None:
        cost_model.save(tmp / COST_MODEL)
        meta["cost_model"] = dict(file=COST_MODEL, device=cost_model.device,
                                  samples=cost_model.samples)
    if op_sum is not None:
        meta["op_sum"] = op_sum.to_json()
    _write_metadata(tmp, meta)
    if companion:
        attach_companion(tmp, companion, companion_info)
    move_into_place(tmp, path)
    return path


def move_into_place(tmp: Path, path: Path) -> None:
    """Puts the finished checkpoint `tmp` at `path`, replacing the checkpoint there (if any)
    only once the new one is complete (`writers.replace_dir`), and releases its lock."""
    writers.replace_dir(tmp, path)
    writers.release(path)


def _refuse_shipped(path: Path, flag: str = "") -> None:
    if path.resolve().is_relative_to(SHIPPED_DIR.resolve()):
        raise CheckpointError(f"{flag}{path}: inside the shipped checkpoints ({SHIPPED_DIR}), "
                              "which are never written; choose a directory of your own")


def _own(path: Path, flag: str = "", shipped: bool = False) -> Path:
    """Before a checkpoint is written or changed in place: never a shipped one, and one
    writer at a time (a temporary being built, `.NAME.tmp-*`, is its writer's already); what
    a killed writer left there is settled and said (`writers.claim`)."""
    if not shipped:
        _refuse_shipped(path, flag)
    if not path.name.startswith("."):
        try:
            for line in writers.claim(path):
                print(f"mdot: {line}", file=sys.stderr)
        except writers.Busy as e:
            raise CheckpointError(f"{flag}{e}") from None
        except OSError as e:
            raise CheckpointError(f"{flag}{path}: cannot write there ({e.strerror or e})"
                                  ) from None
    return path


def attach_companion(path: str | Path, trees: TreeModel, info: dict | None = None) -> None:
    """Adds (or replaces) the LightGBM companion of the checkpoint at `path`; `info` (e.g.
    validation metrics) goes into its metadata entry. Each file is replaced by a rename."""
    path = _own(Path(path))
    meta = read_metadata(path)
    tmp = path / f".{COMPANION}.tmp"
    tmp.write_bytes(lzma.compress(trees.text.encode(), preset=9))
    tmp.rename(path / COMPANION)
    old = (meta.get("companion") or {}).get("file", COMPANION)
    meta["companion"] = dict(info or {}, kind="lightgbm", file=COMPANION,
                             devices=list(trees.devices), vocab_size=trees.vocab_size,
                             aggregates_version=trees.version, objective=trees.objective)
    _write_metadata(path, meta)
    if old != COMPANION:  # the companion file of an older version
        (path / old).unlink(missing_ok=True)


def attach_adaptation(path: str | Path, adaptation: dict | None) -> None:
    """Adds (or replaces, or with None removes) the device adaptation (`predict.Adaptation`
    as JSON) of the checkpoint at `path`."""
    _set_entry(Path(path), "adaptation", adaptation)


def attach_calibration(path: str | Path, calibration: Calibration | None) -> None:
    """Adds (or replaces, or with None removes) the error bands of the checkpoint at `path`."""
    _set_entry(Path(path), "calibration", calibration.to_json() if calibration else None)


def _set_entry(path: Path, key: str, value: dict | None) -> None:
    meta = read_metadata(_own(path))
    meta.pop(key, None)
    if value is not None:
        meta[key] = value
    _write_metadata(path, meta)


def _checksums(path: Path, meta: dict) -> dict[str, str]:
    """sha256 of the weights' files and of the companion and cost model named in `meta`."""
    files = [f for f in sorted((path / "params").rglob("*")) if f.is_file()]
    for entry in ("companion", "cost_model"):
        name = (meta.get(entry) or {}).get("file")
        if name:
            files.append(path / name)
    return {f.relative_to(path).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in files}


def _verify(path: Path, files: dict) -> None:
    for rel, digest in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{path}: {rel} is missing")
        if hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            raise CheckpointError(f"{path}: {rel} does not match its checksum in {METADATA} "
                                  "(corrupt or edited)")


def _write_metadata(path: Path, meta: dict) -> None:
    meta["files"] = _checksums(path, meta)
    for name, text in ((METADATA, json.dumps(meta, indent=1, default=float)),
                       ("README.md", model_card(meta))):
        tmp = path / f".{name}.tmp"
        tmp.write_text(text)
        tmp.rename(path / name)


def model_card(meta: dict) -> str:
    """A human-readable summary of a checkpoint's metadata (written beside it as README.md)."""
    ds, info, m, mc = meta["dataset"], meta["train"], meta["metrics"], meta["model_config"]
    label = model_config(meta).label
    comp = meta.get("companion") or {}
    lines = [f"# {meta['description'] or f'{label} checkpoint'}", "",
             f"- predicts for device(s): {', '.join(meta['stats']['devices'])}",
             f"- data: `{Path(ds.get('path', '?')).name}` (fingerprint `{ds.get('fingerprint')}`), "
             f"split `{ds.get('split')}`"
             + (f" fold {ds.get('fold')} of {ds.get('folds')}" if ds.get("split") != "none"
                else " (trained on every sample)")
             + f"; {info.get('train_samples')} training + {info.get('val_samples')} "
               f"early-stopping samples",
             "- excluded (longer than the largest bucket): "
             f"{info.get('excluded_too_long') or 'none'}",
             f"- seen {len(info.get('architectures', [])) or '?'} architectures, batch sizes "
             f"{info.get('batch_sizes', '?')}, input sizes {info.get('input_sizes', '?')}: "
             "other workloads are extrapolation",
             f"- model: {label}, d_model {mc['d_model']}, "
             + (f"{mc['n_layers'] + 1} message-passing rounds (from inputs and from users)"
                if mc.get("arch") == "gnn" else f"{mc['n_layers']} layers")
             + (f" x {mc['n_heads']} heads, fusion {mc['fusion']}, positional encodings "
                f"{', '.join(mc['pe']) or 'none'}, readout {mc['readout']}, attention block "
                f"{mc.get('attn_block')}" if mc.get("arch", "mdot") == "mdot" else "")
             + ("; its prediction is the geometric mean with a LightGBM companion on "
                f"model-level aggregates (objective {comp.get('objective', 'regression')})"
                if comp else ""),
             *([f"- operator times as features: every operator priced by the kernel cost "
                f"model it carries ({meta['cost_model'].get('samples')} operators measured on "
                f"{meta['cost_model'].get('device')})"] if meta.get("cost_model") else []),
             *([f"- third member: the operator sum, {meta['op_sum']['a']:.3f} x (summed "
                f"operator ms) + {meta['op_sum']['c']:.2f} ms"
                + (f" + {meta['op_sum']['e']:.3f} ms per million parameters"
                   if meta['op_sum'].get('e') else "") + ", fitted on "
                f"{meta['op_sum']['samples']} training samples; the prediction is the geometric "
                "mean of the three"] if meta.get("op_sum") else []),
             *([f"- validation MAPE of the combined prediction {comp['val_mape']:.2f}% "
                f"({label} alone {comp.get('val_mape_model', comp.get('val_mape_mdot')):.2f}%, "
                f"LightGBM alone {comp['val_mape_lightgbm']:.2f}%"
                + (f", operator sum alone {comp['val_mape_op_sum']:.2f}%"
                   if "val_mape_op_sum" in comp else "") + "; same samples)"]
               if "val_mape" in comp else []),
             f"- training: {info.get('steps')} steps in {info.get('seconds')} s "
             f"({info.get('steps_per_s')} steps/s on {info.get('devices')} device(s)), "
             f"best validation MAPE {info.get('best_val_mape') or float('nan'):.2f}% "
             "(the early-stopping samples, same distribution as training)",
             f"- operator vocabulary v{meta['vocab_version']}, checkpoint format "
             f"{meta['format_version']}"]
    if meta.get("calibration"):
        lines.append(_calibration_line(Calibration.from_json(meta["calibration"])))
    if meta.get("adaptation"):
        ad = meta["adaptation"]
        lines.append(f"- **adapted to `{ad['device']}`** from {ad['n_rows']} measured step "
                     f"times ({ad['source']}): {ad['fit']} fit, log t' = {ad['a']:.3f} + "
                     f"{ad['b']:.3f} log t; leave-one-out MAPE {ad['loo_mape']:.1f}%, 80% band "
                     f"x{math.exp(ad['lo']):.2f}-x{math.exp(ad['hi']):.2f}; the lines above "
                     "describe the base checkpoint")
    if m:
        lines.append(f"- held-out test ({m.get('n')} samples): MAE {m['mae_ms']:.3g} ms, "
                     f"RMSE {m['rmse_ms']:.3g} ms, MAPE {m['mape']:.2f}%")
    return "\n".join(lines) + "\n"


def _calibration_line(cal: Calibration) -> str:
    layouts = "; ".join(
        f"{layout}: " + ", ".join(
            f"members disagree by {label}: median error {b.median_ape:.1f}%, 80% measured "
            f"within {np.expm1(b.lo) * 100:+.0f}% .. {np.expm1(b.hi) * 100:+.0f}% of the "
            f"prediction (n={b.n})" for label, b in zip(cal.labels(layout), bands))
        for layout, bands in cal.bands.items())
    return (f"- error on held-out model families ({' x '.join(cal.methods)}, {cal.source}), "
            f"{layouts}")


def read_metadata(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    try:
        meta = json.loads((path / METADATA).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: missing or corrupt {METADATA} ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: {METADATA} holds a {type(meta).__name__}, not the "
                              "object mdot train writes")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format_version')} is not "
                              f"supported (this mdot-jax reads format {FORMAT_VERSION}; "
                              "retrain it with mdot train)")
    if meta.get("vocab") != list(VOCAB)[: len(meta.get("vocab", []))] or \
            meta.get("vocab_version", 0) > VOCAB_VERSION:
        raise CheckpointError(f"{path}: operator vocabulary v{meta.get('vocab_version')} is "
                              f"incompatible with this mdot-jax (v{VOCAB_VERSION})")
    _verify(path, meta.get("files", {}))  # older checkpoints did not record it
    return meta


def model_config(meta: dict) -> ModelConfig:
    """The network's config recorded in a checkpoint's metadata."""
    return ModelConfig(**_fields(meta["model_config"]))


def _fields(d: dict) -> dict[str, Any]:
    """A config dataclass's fields from JSON (lists back to tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def load(path: str | Path) -> Trained:
    """Restores a checkpoint written by `save`."""
    path = Path(path).absolute()
    meta = read_metadata(path)
    try:
        model_cfg = model_config(meta)
        fields = _fields(meta["feature_config"])
        # `true` before fusion versions were recorded: version 1
        feature_cfg = FeatureConfig(**{**fields, "fused": int(fields.get("fused", 0))})
        stats = FeatureStats(**meta["stats"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: incompatible checkpoint metadata ({e})") from None
    abstract = nnx.eval_shape(lambda: build_model(model_cfg, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract, nnx.Param)
    try:
        pure = _checkpointer().restore(path / "params")
        nnx.replace_by_pure_dict(state, pure)
    except Exception as e:  # noqa: BLE001 - orbax raises many types; report one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: cannot restore the weights ({type(e).__name__}: "
                              f"{msg})") from None
    state = jax.tree.map(lambda x: np.asarray(x), state)
    return Trained(graphdef, state, model_cfg, feature_cfg, stats,
                   meta.get("history", []), dict(meta.get("train", {}), metadata=meta))


def load_companion(path: str | Path) -> TreeModel | None:
    """The checkpoint's LightGBM companion, or None when it was saved without one."""
    path = Path(path).absolute()
    meta = read_metadata(path)
    info = meta.get("companion")
    if not info:
        return None
    try:  # saved before vocab_size / aggregates_version were recorded: the checkpoint's
        # vocabulary, version 1
        file = path / info["file"]
        stat = file.stat()
        return _companion(str(file), (stat.st_ino, stat.st_mtime_ns, stat.st_size),
                          tuple(info["devices"]), info.get("vocab_size", len(meta["vocab"])),
                          info.get("aggregates_version", 1))
    except Exception as e:  # noqa: BLE001 - OSError, KeyError, LightGBMError: one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: missing or corrupt companion ({msg})") from None


@functools.lru_cache(maxsize=4)
def _companion(file: str, stamp: tuple, devices: tuple[str, ...], vocab_size: int,
               version: int) -> TreeModel:
    """The companion in `file`, read and parsed once while its `stamp` (inode, mtime, size)
    holds (a shipped checkpoint's is 3-5 MB of xz: a few tenths of a second a load)."""
    data = Path(file).read_bytes()
    unpack = {".gz": gzip.decompress, ".xz": lzma.decompress}.get(Path(file).suffix)
    return TreeModel.from_text((unpack(data) if unpack else data).decode(), devices,
                               vocab_size, version)


def member_methods(meta: dict) -> tuple[str, ...]:
    """The `mdot evaluate` methods whose rows describe a checkpoint's members: its network
    (`ModelConfig.method`: `gnn`, `mdot-pe-none`, ...), `lightgbm` with a companion, and
    its operator-sum line (`op-sum`, or `op-sum-params` with a parameter term)."""
    line = meta.get("op_sum")
    return (model_config(meta).method, *(["lightgbm"] if meta.get("companion") else []),
            *([("op-sum-params" if line.get("e") else "op-sum")] if line else []))
