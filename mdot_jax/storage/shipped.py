"""The checkpoints that come with the package, read by name and by their metadata alone
(nothing loaded: no JAX, no network): where they are, which is the default, what devices and
settings each was trained on. `storage.checkpoint` saves and loads them."""

from __future__ import annotations

import json
from pathlib import Path

from mdot_jax.errors import CheckpointError

METADATA = "metadata.json"
STEP_MODEL = "step_model.json"  # a GPU step model's metadata (`gpu.gpu_ops.StepModel.META`)
_PACKAGE = Path(__file__).resolve().parent.parent
# An installed wheel carries the shipped checkpoints as package data (`mdot_jax/checkpoints`);
# a source checkout (editable install) has them at the top of the repository.
SHIPPED_DIR = next((d for d in (_PACKAGE / "checkpoints", _PACKAGE.parent / "checkpoints")
                    if d.is_dir()), _PACKAGE / "checkpoints")
STEP_MODEL_DIR = SHIPPED_DIR / "gpu-spec-sheet"  # the shipped step model: any GPU's spec sheet
DEFAULT_CHECKPOINT = "timm-rtx3090"


def shipped_names() -> list[str]:
    """Names of the checkpoints that come with the package (GPU step models included)."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / METADATA).exists()
                  or (p / STEP_MODEL).exists())


def shipped_checkpoints() -> list[str]:
    """Names of the checkpoints of trained networks that come with the package."""
    return [n for n in shipped_names() if (SHIPPED_DIR / n / METADATA).exists()]


def resolve_checkpoint(name_or_dir: str | Path | None) -> Path:
    """A shipped checkpoint's name, or a directory. A bare shipped name always means the
    shipped checkpoint, whatever the working directory holds (`./NAME` for a local one)."""
    name_or_dir = name_or_dir or DEFAULT_CHECKPOINT
    if str(name_or_dir) in shipped_checkpoints():
        return SHIPPED_DIR / str(name_or_dir)
    if str(name_or_dir) in shipped_names():  # a GPU step model
        raise CheckpointError(f"{name_or_dir!r} prices GPUs from their spec sheets and is no "
                              "checkpoint a Predictor loads: predict(TrainingJob(..., "
                              "device=GPU)) (`mdot predict --device GPU`) uses it")
    path = Path(name_or_dir)
    if path.is_dir():
        return path
    raise CheckpointError(f"no checkpoint {str(name_or_dir)!r}: give a directory or one of "
                          f"the shipped ones {shipped_checkpoints()}")


def checkpoint_devices(name_or_dir: str | Path | None) -> list[str]:
    """The devices a checkpoint predicts for, from its metadata alone (nothing loaded)."""
    path = resolve_checkpoint(name_or_dir) / METADATA
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    adapted = (meta.get("adaptation") or {}).get("device")
    return [adapted] if adapted else list(meta.get("stats", {}).get("devices", []))


def checkpoint_trained(name_or_dir: str | Path | None, what: str) -> list:
    """What a checkpoint was trained on (`what`: "precisions", "optimizers", "layouts", ...),
    from its metadata alone; [] where it does not say."""
    path = resolve_checkpoint(name_or_dir) / METADATA
    try:
        return list(json.loads(path.read_text()).get("train", {}).get(what) or [])
    except (OSError, ValueError):
        return []
