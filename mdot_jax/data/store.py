"""Writing a dataset folder and checking it: one writer at a time, lines appended whole and
synced, torn lines moved aside, sequences and closed files packed for the repository;
`check_dataset` lists (and with `fix` moves aside) every line that cannot be used."""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import os
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np

from converters import OperatorSequence
from mdot_jax.data.dataset import (
    LOCK,
    NOISY,
    PACKED,
    PACKED_SEQS,
    PLAN,
    REJECTED,
    REPORT,
    SAMPLES,
    SEQS,
    LineProblem,
    Sample,
    _count,
    _read_archive,
    _read_numbered,
    _sequence,
    has_samples,
    has_sequence,
    load_sequence,
    not_a_dataset,
    read_samples,
)
from mdot_jax.errors import DatasetError


def _uncompressed(data: bytes) -> bytes:
    """The same `.npz` with its arrays stored, not deflated (for a solid archive)."""
    buf = io.BytesIO()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        np.savez(buf, **{k: z[k] for k in z.files})
    return buf.getvalue()


def pack_sequences(root: str | Path, *, progress: bool = True) -> dict:
    """Packs the dataset's sequence files (`seqs/*.npz`) with its archive's into one new
    `seqs.tar.xz`: uncompressed members in one solid xz stream (the sequences of one model at
    several batch sizes differ only in their loads, so they pack tightly), sorted, with fixed
    metadata (the same sequences give the same bytes). Under the writer lock; the new archive
    is written beside the old one and read back before it replaces it; only then do the files
    it now holds leave `seqs/`. A file that is not a readable sequence stops it, naming the
    file. Returns the counts and the archive's size."""
    from tqdm import tqdm

    root = Path(root)
    if not has_samples(root):
        raise not_a_dataset(root)
    archive, tmp = root / PACKED_SEQS, root / (PACKED_SEQS + ".tmp")
    with writer_lock(root):
        members = dict(_read_archive(archive)) if archive.is_file() else {}
        loose = sorted((root / SEQS).glob("*.npz")) if (root / SEQS).is_dir() else []
        for f in tqdm(loose, unit="seq", disable=not progress, desc="read"):
            data = f.read_bytes()
            _sequence(data, str(f))  # a file that is no sequence stops it
            members[f"{SEQS}/{f.name}"] = _uncompressed(data)  # the file before the archive's
        with tarfile.open(tmp, "w:xz", preset=9) as tar:
            for name in tqdm(sorted(members), unit="seq", disable=not progress, desc="pack"):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(members[name]), 0o644
                tar.addfile(info, io.BytesIO(members[name]))
        if {n: d for n, d in _read_archive(tmp)} != members:
            tmp.unlink()
            raise DatasetError(f"{tmp}: the new archive did not read back; nothing changed")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        tmp.replace(archive)
        for f in loose:
            f.unlink()
        for name in (SAMPLES, NOISY):  # closed until a writer unpacks them again
            _pack_jsonl(root / name)
    return dict(path=str(archive), sequences=len(members), packed_now=len(loose),
                bytes=archive.stat().st_size)


def _pack_jsonl(path: Path) -> None:
    """`path` as `path.xz` (written beside, read back, then renamed); the unpacked file goes
    only once the packed one holds its bytes."""
    if not path.is_file():
        return
    data = path.read_bytes()
    packed, tmp = path.with_name(path.name + PACKED), path.with_name(path.name + PACKED + ".tmp")
    tmp.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    if lzma.decompress(tmp.read_bytes()) != data:
        tmp.unlink()
        raise DatasetError(f"{tmp}: did not read back; nothing changed")
    tmp.replace(packed)
    path.unlink()


def unpack_for_writing(path: Path) -> None:
    """Before a writer appends to `path`: a file kept only packed is unpacked beside its
    packed form (which is kept; readers prefer the unpacked one from then on)."""
    packed = path.with_name(path.name + PACKED)
    if not path.exists() and packed.exists():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(lzma.decompress(packed.read_bytes()))
        tmp.replace(path)


# a dataset folder's own entries (a folder holding none of them is not written into)
_MARKS = (SAMPLES, SAMPLES + PACKED, NOISY, NOISY + PACKED, SEQS, PACKED_SEQS, REJECTED, PLAN)


@contextlib.contextmanager
def writer_lock(root: str | Path):
    """Holds `root/.lock` while a process writes the dataset: a second writer is refused with
    the holder's pid. The kernel releases the lock when its holder exits, even on kill -9.
    A folder of other files is refused."""
    from mdot_jax.writers import Busy, acquire, refuse_others

    root = Path(root)
    refuse_others(root, _MARKS, "a dataset", DatasetError)
    root.mkdir(parents=True, exist_ok=True)
    try:
        f = acquire(root / LOCK, str(root))
    except Busy as e:
        raise DatasetError(str(e)) from None
    try:
        yield
    finally:
        f.close()


def end_last_line(path: Path, rejected: Path) -> None:
    """Before appending to a JSON-lines file: a complete last line without its newline gets
    one; a torn one (a writer killed mid-line) is moved to `rejected`, never deleted."""
    data = path.read_bytes() if path.exists() else b""
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        json.loads(data[cut:])
        with open(path, "ab") as f:
            f.write(b"\n")
    except json.JSONDecodeError:
        with open(rejected, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(line=data.count(b"\n") + 1, reason="torn line",
                                    text=data[cut:].decode("utf-8", "replace"))) + "\n")
        path.write_bytes(data[:cut])


def append_line(path: Path, record: dict) -> None:
    """Appends one JSON line, flushed and fsynced: a crash loses at most this line."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


class DatasetWriter:
    """Append-only, crash-safe writer (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / SEQS).mkdir(parents=True, exist_ok=True)
        path = self.root / SAMPLES
        for name in (SAMPLES, NOISY):  # a packed dataset is appended to unpacked
            unpack_for_writing(self.root / name)
        end_last_line(path, self.root / REJECTED)
        self.done = {d["key"] for d in read_samples(path)[0]}
        self.noisy = {d["key"] for d in read_samples(self.root / NOISY)[0]} - self.done

    def has_seq(self, seq_key: str) -> bool:
        return has_sequence(self.root, f"{SEQS}/{seq_key}.npz")

    def save_seq(self, seq_key: str, seq: OperatorSequence) -> str:
        rel = f"{SEQS}/{seq_key}.npz"
        if not has_sequence(self.root, rel):
            seq.save(self.root / rel)
        return rel

    def append(self, sample: Sample) -> None:
        """Appends `sample` to `samples.jsonl`, or to `noisy.jsonl` when its stats say it is
        noisy (kept apart from training; a later clean measurement supersedes it)."""
        if sample.key in self.done:
            raise ValueError(f"sample {sample.key!r} is already in {self.root}")
        noisy = bool(sample.stats.get("noisy"))
        append_line(self.root / (NOISY if noisy else SAMPLES), sample.to_json())
        if noisy:
            self.noisy.add(sample.key)
        else:
            self.done.add(sample.key)
            self.noisy.discard(sample.key)


class SkipLog:
    """What a builder skipped (key -> reason, detail), kept in `report.json` (atomic writes)."""

    def __init__(self, root: str | Path):
        self.path = Path(root) / REPORT
        old = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.skipped: dict[str, dict] = old.get("skipped", {})

    def skip(self, key: str, reason: str, detail: str = "") -> None:
        self.skipped[key] = dict(reason=reason, detail=" ".join(str(detail).split())[:300])

    def write(self, **summary) -> dict:
        reasons = _count(v["reason"] for v in self.skipped.values())
        report = dict(summary, skipped_by_reason=reasons, skipped=dict(sorted(
            self.skipped.items())))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(self.path)
        return report


def check_dataset(root: str | Path, *, fix: bool = False) -> dict:
    """Every unusable line of a dataset, and every sample whose sequence file is missing.
    With `fix` (under the writer lock), those lines move to `rejected.jsonl` (appended, each
    with its line number and reason) and `samples.jsonl` is rewritten without them,
    atomically. Lines are moved by number, so of exact duplicates the first stays; a second
    `fix` finds nothing to move. Nothing is deleted."""
    root = Path(root)
    if not has_samples(root):
        raise not_a_dataset(root)
    if not fix:
        return _check(root)[0]
    try:
        with writer_lock(root):
            unpack_for_writing(root / SAMPLES)  # lines move aside from the unpacked file
            report, problems = _check(root)
            if problems:
                _move_aside(root, problems)
    except OSError as e:
        raise DatasetError(f"{root}: cannot fix the dataset: {e.strerror or e}") from None
    return dict(report, fixed=bool(problems))


def _check(root: Path) -> tuple[dict, list[LineProblem]]:
    path = root / SAMPLES
    rows, problems = _read_numbered(path)
    devices = Counter(d["workload"].get("device", "cpu") for _, d in rows)
    device = devices.most_common(1)[0][0] if devices else None
    usable = 0
    for lineno, d in rows:
        reason = _sample_problem(root, d, device)
        if reason:
            problems.append(LineProblem(lineno, f"sample {d['key']!r}: {reason}", ""))
        else:
            usable += 1
    problems.sort(key=lambda q: q.line)
    return dict(path=str(path), samples=usable,
                problems=[dict(line=q.line, reason=q.reason) for q in problems],
                fixed=False), problems


def _sample_problem(root: Path, d: dict, device: str | None) -> str | None:
    """Why a well-formed sample line is still unusable: its sequence file is missing, outside
    the dataset folder, or not a readable sequence; or it is of another device than the
    dataset's (the device of most of its lines)."""
    seq = (root / d["seq"]).resolve()
    if not seq.is_relative_to(root.resolve()):
        return f"sequence file {d['seq']} is outside the dataset folder"
    if not has_sequence(root, d["seq"]):
        return f"sequence file {d['seq']} is missing"
    try:
        load_sequence(root, d["seq"])
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported, never raised
        return f"sequence file {d['seq']} is not a readable operator sequence ({e})"[:300]
    other = d["workload"].get("device", "cpu")
    if other != device:
        return f"of device {other!r}, but the dataset's is {device!r}"
    return None


def _move_aside(root: Path, problems: list[LineProblem]) -> None:
    """Appends `problems` to `rejected.jsonl`, then rewrites `samples.jsonl` without their
    lines (temp + rename); a crash in between leaves the samples file as it was."""
    path = root / SAMPLES
    bad = {q.line for q in problems}
    lines = path.read_bytes().split(b"\n")
    keep = [ln for n, ln in enumerate(lines, 1) if n not in bad and ln.strip()]
    with open(root / REJECTED, "a", encoding="utf-8") as f:
        for q in problems:  # the raw line, byte for byte where it decodes
            text = lines[q.line - 1].decode("utf-8", errors="replace")
            f.write(json.dumps(dict(line=q.line, reason=q.reason, text=text)) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_bytes(b"".join(ln + b"\n" for ln in keep))
    tmp.replace(path)
