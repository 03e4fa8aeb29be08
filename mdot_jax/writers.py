"""How every user-visible artefact is written: one writer at a time, replaced in one step,
nothing left behind by a kill.

- `acquire(lock)`: an exclusive `flock` on a lock file, refused at once with the holder's pid;
  the kernel releases it when the holder exits, even on kill -9.
- `claim(target)`: the lock `.NAME.lock` beside a checkpoint folder or a file, held until
  `release` (after the write) or the process's end; on taking it, what an earlier, killed
  writer of `target` left is settled (`recover`).
- `replace_dir(tmp, path)`: a finished folder takes `path`'s place. Where the kernel can
  (Linux `renameat2(RENAME_EXCHANGE)`), the two are swapped in one step, so `path` always
  exists; elsewhere the old one is renamed aside first and `recover` restores it if a kill
  falls between the two renames.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mdot_jax.errors import MdotError

_HELD: dict[Path, IO[str]] = {}  # target -> its open, locked lock file (until exit)
_HEX8 = "[0-9a-f]" * 8  # the unique part of our temporaries' names (`_sibling`)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class Busy(MdotError):
    """Another process is writing the same artefact."""


def acquire(lock: Path, what: str) -> IO[str]:
    """Locks `lock` (created if missing) for this process and writes its pid there; returns
    the open file, which holds the lock until closed. Raises `Busy` naming `what` and the
    holder's pid when another process holds it."""
    import fcntl

    while True:
        f = open(lock, "a+")  # noqa: SIM115 - held open for the lifetime of the lock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise Busy(f"{what} is being written by another process (pid {holder}); wait "
                       "for it to finish, or stop it, before writing here") from None
        try:  # the file a finishing holder removed (`release`) is no lock: take the new one
            if os.stat(lock).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _sibling(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}-{uuid.uuid4().hex[:8]}")


def temporary(path: str | Path, suffix: str = "") -> Path:
    """A fresh hidden name beside `path` to write into before `replace_dir` or `os.replace`
    (`recover` removes it if the writer is killed)."""
    tmp = _sibling(Path(path), "tmp")
    return tmp.with_name(tmp.name + suffix)


def claim(target: str | Path) -> list[str]:
    """Takes the writer's lock of `target` (a folder or a file) until `release` (or this
    process's end), then settles what a killed writer of it left (`recover`). Idempotent
    within a process. Returns what `recover` did, one line each, for the caller to report."""
    target = Path(target).absolute()
    if target in _HELD:
        return []
    target.parent.mkdir(parents=True, exist_ok=True)
    _HELD[target] = acquire(target.with_name(f".{target.name}.lock"), str(target))
    return recover(target)


@atexit.register
def release(target: str | Path | None = None) -> None:
    """Removes and unlocks the lock `claim` took of `target` (None: every one, as at exit; a
    killed holder leaves the file, unlocked, for the next writer to take)."""
    held = [Path(target).absolute()] if target is not None else list(_HELD)
    for t in held:
        if (f := _HELD.pop(t, None)) is not None:
            t.with_name(f".{t.name}.lock").unlink(missing_ok=True)
            f.close()


def prepare_file(out: str | Path, *, source: str | Path | None = None, force: bool = False,
                 flag: str = "-o") -> None:
    """Checks, before any work, that a file can be written to `out` (given as `flag`): never
    a folder, never `source` (the input being read), an existing file only with `force`; then
    claims it."""
    problem = None
    suffix = Path(out).suffix
    kind = f"a file ({suffix})" if suffix else "a file"
    if os.path.isdir(out):
        problem = f"is a directory; name {kind}"
    elif not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        problem = "its folder does not exist"
    elif source and os.path.exists(out) and os.path.exists(source) and \
            os.path.samefile(out, source):
        problem = f"is the model being converted; name another {kind.removeprefix('a ')}"
    elif os.path.lexists(out) and not force:
        problem = "exists; --force replaces it"
    if problem:
        raise MdotError(f"{flag} {out}: {problem}")
    try:
        claim(out)
    except OSError as e:
        raise MdotError(f"{flag} {out}: cannot write there ({e.strerror or e})") from None
    except Busy as e:
        raise Busy(f"{flag} {e}") from None


def write_file(out: str | Path, write: Callable[[Path], None], flag: str = "-o") -> None:
    """Runs `write(out)` (itself atomic: a temporary, then a rename) under `out`'s claim,
    released afterwards; an OS error is one line naming `out`."""
    try:
        write(Path(out))
    except OSError as e:
        raise MdotError(f"{flag} {out}: cannot write it: {e.strerror or e}") from None
    finally:
        release(out)


def recover(target: Path) -> list[str]:
    """Settles an interrupted replace of `target` (the caller holds its lock): a previous
    version renamed aside (`.NAME.old-*`) goes back if `target` is missing, and leftover
    temporaries and old versions are removed. Returns one line per restored version."""
    said = []
    olds = sorted(target.parent.glob(f".{target.name}.old-{_HEX8}"),
                  key=lambda p: p.stat().st_mtime)
    if olds and not target.exists():
        olds.pop().rename(target)
        said.append(f"{target}: restored the previous version, which an interrupted "
                    "replace had left aside")
    for left in [*olds, *target.parent.glob(f".{target.name}.tmp-{_HEX8}*")]:
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)
        else:
            left.unlink(missing_ok=True)
    return said


def _exchange(a: Path, b: Path) -> bool:
    """Swaps `a` and `b` in one step; False where the kernel or C library cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        rename = libc.renameat2
    except (OSError, AttributeError):
        return False
    return rename(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def replace_dir(tmp: Path, path: Path) -> None:
    """Puts the finished folder `tmp` at `path`, replacing the folder there (if any) only once
    the new one is complete; the old one is then deleted."""
    if not path.exists():
        tmp.rename(path)
        return
    if _exchange(tmp, path):  # `tmp` now holds the old version
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = _sibling(path, "old")
    path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def replace_text(path: Path, text: str) -> None:
    """Writes `text` to `path` in one step: a temporary beside it, then a rename (a kill
    leaves the old file whole)."""
    tmp = temporary(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # written, it is `path` now


def refuse_others(root: Path, marks: tuple[str, ...], what: str,
                  error: type[MdotError] = MdotError) -> None:
    """Refuses an existing folder `root` whose entries (hidden ones aside) are none of the
    writer's (`marks`), nor folders holding one: the writer of `what` would add its files
    among the user's and replace one that shares a name with its own."""
    def ours(path: Path, depth: int = 1) -> bool:
        if path.name in marks:
            return True
        try:
            return depth > 0 and path.is_dir() and any(ours(p, 0) for p in path.iterdir())
        except OSError:  # a folder this user cannot read
            return False

    if not root.is_dir():
        return
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    if entries and not any(ours(p) for p in entries):
        names = ", ".join(p.name for p in entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise error(f"{root}: a folder of other files ({names}), not {what}: name a new or "
                    "empty folder")


_EVICTING = threading.Lock()


_KEPT = re.compile(r"[0-9a-f]{32}(?:[0-9a-f]{32})?\.[a-z]+")  # a cache's file: its key's hash


def evict(folder: Path, suffixes: str | tuple[str, ...], limit: int) -> None:
    """Removes the least recently used of the files a cache keeps in `folder` (named by a
    hash of 32 or 64 hex digits, then one of `suffixes`) beyond `limit`; no other file is
    touched (a user's in a folder given as the cache, a writer's hidden temporary)."""
    with _EVICTING:
        files = []
        for f in folder.iterdir():
            try:
                if _KEPT.fullmatch(f.name) and f.name.endswith(suffixes):
                    files.append((f.stat().st_mtime, f))
            except FileNotFoundError:  # gone since listed (another process)
                continue
        for _, old in sorted(files)[:max(len(files) - limit, 0)]:
            old.unlink(missing_ok=True)
