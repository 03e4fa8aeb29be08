"""A config.json's export kept on disk: the training graph a named model or a config.json
exports on the meta device (seconds for a small model, more for a large one, in a process of
its own) is kept under `~/.cache/mdot/exports` (`MDOT_EXPORTS`: another folder; `off`: none) by
everything that made it: the file's bytes, what was asked of the export, the converters' code
and the PyTorch, transformers and ONNX that traced it. The next command asking the same answers
without exporting; anything else is exported again. A cache: a file it cannot read or write
is exported instead, never an error."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
from importlib import metadata
from pathlib import Path

import onnx

from mdot_jax import writers

LIMIT = 64  # exports kept; the least recently used go first
OFF = "off"


def folder() -> Path | None:
    """Where exports are kept (None: not kept)."""
    where = os.environ.get("MDOT_EXPORTS", "")
    if where == OFF:
        return None
    try:
        return Path(where) if where else Path.home() / ".cache" / "mdot" / "exports"
    except RuntimeError:  # no home directory to be found: nothing kept
        return None


@functools.cache
def _makers() -> bytes:
    """The converters' code and the versions of what traces a graph."""
    import converters

    digest = hashlib.sha256()
    for path in sorted(Path(converters.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    for name in ("torch", "transformers", "onnx"):
        try:
            digest.update(f"{name} {metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} none".encode())
    return digest.digest()


def _path(config: Path, asked: list[str]) -> Path | None:
    """The file an export of `config` with the child's arguments `asked` is kept as."""
    where = folder()
    if where is None:
        return None
    try:
        data = config.read_bytes()
    except OSError:
        return None  # the export says what is wrong with the file
    key = hashlib.sha256(data + repr(asked).encode() + _makers()).hexdigest()[:32]
    return where / f"{key}.onnx"


def load(config: Path, asked: list[str]) -> onnx.ModelProto | None:
    """The kept export of `config` for `asked`, or None (none kept, or unreadable)."""
    kept = _path(config, asked)
    if kept is None or not kept.is_file():
        return None
    try:
        model = onnx.load(kept)
        os.utime(kept)  # recently used
    except Exception:  # noqa: BLE001 (a foreign file: exported again)
        return None
    return model if len(model.graph.node) else None  # (protobuf reads an empty file as one)


def keep(config: Path, asked: list[str], exported: Path) -> None:
    """Keeps the file `exported` as the export of `config` for `asked` (written whole under
    a hidden name, then renamed: another process reads it whole or not at all)."""
    kept = _path(config, asked)
    if kept is None:
        return
    tmp = writers.temporary(kept, ".onnx")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exported, tmp)
        os.replace(tmp, kept)
        writers.evict(kept.parent, ".onnx", LIMIT)
    except OSError:  # a read-only or full disk: the export is still answered
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
