"""Training-time datasets: one on-disk format for measured labels, one loading API, splits.

A dataset is a directory:
  samples.jsonl   one JSON object per measured sample (append-only; see `Sample`)
  seqs/KEY.npz    operator sequences (`converters.OperatorSequence`), shared by samples
  seqs.tar.xz     the same, packed into one archive (`pack_sequences`); a file in seqs/
                  is read before the archive's copy, and new ones are written there
  report.json     what a builder skipped and why (builders only)

Crash safety: a sequence file is written atomically (temp + rename) *before* its sample line;
each line is appended with flush + fsync; a torn last line (crash mid-write) is moved to
`rejected.jsonl` when the dataset is opened for appending (never deleted; a complete last
line that only lacks its newline is kept). So a kill -9 loses at most the sample in
flight, and re-running a builder skips every key already present. Reading validates every
line (`read_samples`): a dataset with an unusable line is refused, naming the line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from converters import ConversionError, OperatorSequence, convert, converts_the_same
from converters.fusion import fusion_version
from mdot_jax.errors import DatasetError

SAMPLES = "samples.jsonl"
REPORT = "report.json"
SEQS = "seqs"
PACKED_SEQS = "seqs.tar.xz"  # the sequences as one solid xz archive of uncompressed .npz
LOCK = ".lock"  # held by the writing process (`writer_lock`)
NOISY = "noisy.jsonl"  # measured, but too noisy to train on (`mdot profile --retry-noisy`)
OP_MS = "op_ms"  # sequence meta: `[N]` predicted ms per operator (`kernels.cost_model.attach`)
REJECTED = "rejected.jsonl"  # lines moved aside by `mdot dataset check --fix`
PACKED = ".xz"  # a closed JSON-lines file may be committed xz-compressed: `samples.jsonl.xz`
# weight sources and training recipes that timm and torchvision put before the architecture
_WEIGHT_PREFIXES = ("tv", "tf", "gluon", "legacy", "ig", "ssl", "swsl", "timm", "hf", "adv",
                    "ens")


def family_of(arch: str) -> str:
    """Architecture family from the name (the rule used by the leave-family-out split).

    Lower-case; drop weight-source prefixes (`tv_`, `tf_`, `gluon_`, `adv_`, ...); take the
    first `_`/`-`/`.`-separated token; keep its letters up to the first digit; drop a trailing
    version `v` (`mobilenetv3` -> `mobilenet`, `resnetv2` -> `resnet`).
    Examples: resnet50d -> resnet, tf_efficientnet_b0 -> efficientnet, vit_base_patch16_224 ->
    vit, regnety_040 -> regnety, bert-base -> bert, gpt2 -> gpt,
    ens_adv_inception_resnet_v2 -> inception.
    """
    tokens = [t for t in re.split(r"[_\-./]", arch.lower()) if t]
    while len(tokens) > 1 and tokens[0] in _WEIGHT_PREFIXES:
        tokens = tokens[1:]
    head = re.match(r"[a-z]*", tokens[0] if tokens else "").group(0)
    if len(head) > 2 and head.endswith("v"):
        head = head[:-1]
    return head or (tokens[0] if tokens else arch)


@dataclass(frozen=True)
class Workload:
    """What is run besides the graph: batch size, input size, precision, device, ..."""

    batch_size: int
    input_size: int  # image side (px) or sequence length (tokens)
    precision: str = "fp32"  # one of `options.PRECISIONS`
    layout: str = "nchw"  # nchw | nhwc
    device: str = "cpu"
    optimizer: str = "sgd"

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Sample:
    """One measured training step.

    Attributes:
      key: unique id within the dataset (what resuming builders skip on).
      arch: architecture name; `family` derives from it (`family_of`).
      seq_path: operator sequence file, relative to the dataset directory.
      workload: `Workload`.
      label_ms: measured milliseconds per training iteration (median of repeats).
      stats: repeats, times_ms, median_ms, iqr_ms, cv (percent) where measured by us; on a
        GPU peak_mb, the step's `max_memory_allocated` above what was held before its model.
      meta: fingerprint of the device and software, source row, parameter count, ...
    """

    key: str
    arch: str
    seq_path: str
    workload: Workload
    label_ms: float
    stats: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    root: Path | None = None

    @property
    def family(self) -> str:
        return family_of(self.arch)

    @cached_property
    def seq(self) -> OperatorSequence:
        return load_sequence(self.root, self.seq_path)

    def to_json(self) -> dict:
        return dict(key=self.key, arch=self.arch, seq=self.seq_path,
                    workload=self.workload.to_json(), label_ms=self.label_ms,
                    stats=self.stats, meta=self.meta)

    @classmethod
    def in_memory(cls, seq: OperatorSequence, workload: Workload, label_ms: float = 1.0,
                  key: str = "") -> Sample:
        """A sample whose sequence is already loaded (no file behind it), e.g. to predict."""
        sample = cls(key=key or seq.name, arch=seq.name, seq_path="", workload=workload,
                     label_ms=label_ms)
        sample.__dict__["seq"] = seq  # fills the cached property
        return sample

    @classmethod
    def from_json(cls, d: dict, root: Path) -> Sample:
        return cls(key=d["key"], arch=d["arch"], seq_path=d["seq"],
                   workload=Workload(**d["workload"]), label_ms=float(d["label_ms"]),
                   stats=d.get("stats", {}), meta=d.get("meta", {}), root=root)


_SEQ_CACHE: dict[str, OperatorSequence] = {}
_PACKS: dict[tuple, frozenset[str]] = {}  # (archive, mtime, size) -> its member names
_MEMBER = re.compile(rf"{SEQS}/[^/]+\.npz")


def load_sequence(root: Path, rel: str) -> OperatorSequence:
    """The operator sequence `rel` (`seqs/KEY.npz`) of the dataset at `root`: its file, else
    its copy in the dataset's archive. Each is loaded once per process (samples share them)."""
    path = str(root / rel)
    if path not in _SEQ_CACHE:
        if (root / rel).is_file() or rel not in _packed_names(root):
            _SEQ_CACHE[path] = OperatorSequence.load_npz(root / rel)
    return _SEQ_CACHE[path]


def clear_sequence_cache() -> None:
    """Forgets every loaded sequence: the next load reads them anew (from files or archives)."""
    _SEQ_CACHE.clear()
    _PACKS.clear()


def has_sequence(root: Path, rel: str) -> bool:
    return (root / rel).is_file() or rel in _packed_names(root)


def _packed_names(root: Path) -> frozenset[str]:
    """The members of `root`'s sequence archive (none without one); the first call loads
    every sequence in it into the cache, as an xz archive is read from its start."""
    archive = root / PACKED_SEQS
    if not archive.is_file():
        return frozenset()
    stat = archive.stat()
    key = (str(archive), stat.st_mtime_ns, stat.st_size)
    if key not in _PACKS:
        names = set()
        for name, data in _read_archive(archive):
            _SEQ_CACHE[str(root / name)] = _sequence(data, f"{archive}: {name}")
            names.add(name)
        _PACKS[key] = frozenset(names)
    return _PACKS[key]


def _read_archive(archive: Path):
    """(member name, bytes) of each sequence in `archive`; anything else in it, or an archive
    that does not read, is a `DatasetError` naming it."""
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for m in tar:
                f = tar.extractfile(m) if m.isfile() and _MEMBER.fullmatch(m.name) else None
                if f is None:
                    raise DatasetError(f"{archive}: {m.name!r} is not an operator sequence")
                yield m.name, f.read()
    except (OSError, EOFError, tarfile.TarError, lzma.LZMAError) as e:
        raise DatasetError(f"{archive}: not a readable sequence archive ({e})") from None


def _sequence(data: bytes, where: str) -> OperatorSequence:
    try:
        return OperatorSequence.load_npz(io.BytesIO(data))
    except ConversionError as e:
        raise DatasetError(f"{where}: {str(e).split(': ', 1)[-1]}") from None


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
        raise DatasetError(f"{root}: not a dataset (no {SAMPLES})")
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


_WORKLOAD_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))


@dataclass(frozen=True)
class LineProblem:
    """Why line `line` (1-based) of `samples.jsonl` cannot be used."""

    line: int
    reason: str
    text: str  # the raw line, kept so that nothing is lost when it is moved aside
    torn: bool = False  # the last line, cut short: the sample in flight when a writer died


def _problem(d: Any, seen: dict[str, tuple[int, float]], lineno: int) -> str | None:
    """The first reason a parsed sample line is unusable, or None (and its key is recorded)."""
    if not isinstance(d, dict):
        return f"not a JSON object but {type(d).__name__}"
    for name, kind in (("key", str), ("arch", str), ("seq", str), ("workload", dict)):
        if not isinstance(d.get(name), kind) or (kind is str and not d[name]):
            what = "a non-empty string" if kind is str else "a JSON object"
            return f"'{name}' is missing or not {what}"
    label = d.get("label_ms")
    if isinstance(label, bool) or not isinstance(label, (int, float)):
        return f"'label_ms' is missing or not a number ({label!r})"
    if not np.isfinite(label) or label <= 0:
        return f"'label_ms' is {label}: a measured time is finite and > 0"
    w = d["workload"]
    unknown = sorted(set(w) - set(_WORKLOAD_FIELDS))
    if unknown:
        return f"unknown workload field(s) {unknown}; known: {sorted(_WORKLOAD_FIELDS)}"
    for name in ("batch_size", "input_size"):
        v = w.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            return f"workload '{name}' is {v!r}: a positive integer is required"
    bad = [k for k in ("precision", "layout", "device", "optimizer")
           if k in w and not isinstance(w[k], str)]
    if bad:
        return f"workload '{bad[0]}' is {w[bad[0]]!r}: a string is required"
    for name in ("stats", "meta"):
        if not isinstance(d.get(name, {}), dict):
            return f"'{name}' is not a JSON object"
    if d["key"] in seen:
        first, first_label = seen[d["key"]]
        same = "the same label" if first_label == label else f"label {first_label} there"
        return f"duplicate key {d['key']!r} (first on line {first}, {same})"
    seen[d["key"]] = (lineno, float(label))
    return None


def read_samples(path: Path, problem: Callable[[Any, dict, int], str | None] | None = None
                 ) -> tuple[list[dict], list[LineProblem]]:
    """Every line of a `samples.jsonl`, validated by `problem` (default: a model sample's
    rules): (usable sample dicts, problems).

    A last line without a final newline is read like any other when it is complete JSON; one
    that is not (a writer killed mid-line, or one still writing) is reported as `torn`, which
    readers ignore. Nothing is changed on disk."""
    good, problems = _read_numbered(path, problem)
    return [d for _, d in good], problems


def _read_numbered(path: Path, problem: Callable[[Any, dict, int], str | None] | None = None
                   ) -> tuple[list[tuple[int, dict]], list[LineProblem]]:
    """`read_samples` with each usable sample's line number: ([(line, dict)], problems)."""
    good: list[tuple[int, dict]] = []
    problems: list[LineProblem] = []
    seen: dict[str, tuple[int, float]] = {}
    data = read_jsonl_bytes(path)
    if data is None:
        return good, problems
    raw_lines = data.split(b"\n")
    last = len(raw_lines)  # split leaves b"" after a final newline
    for lineno, raw in enumerate(raw_lines, 1):
        text = raw.decode("utf-8", errors="replace")
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except UnicodeDecodeError as e:
            problems.append(LineProblem(lineno, f"not UTF-8 text (byte {e.start + 1} is "
                                                f"{raw[e.start:e.start + 1]!r})", text))
            continue
        except json.JSONDecodeError as e:
            torn = lineno == last
            problems.append(LineProblem(
                lineno, f"not JSON{' (torn: a writer died mid-line)' if torn else ''}: "
                        f"{e.msg} at column {e.colno}", text, torn))
            continue
        reason = (problem or _problem)(d, seen, lineno)
        if reason:
            problems.append(LineProblem(lineno, reason, text))
        else:
            good.append((lineno, d))
    return good, problems


def read_jsonl_bytes(path: Path) -> bytes | None:
    """The bytes of a JSON-lines file, or of its packed form (`path` + `PACKED`) where only
    that exists; None where neither does."""
    if path.exists():
        return path.read_bytes()
    packed = path.with_name(path.name + PACKED)
    return lzma.decompress(packed.read_bytes()) if packed.exists() else None


def has_samples(root: str | Path) -> bool:
    """Whether `root` holds a samples file, unpacked or packed (`samples.jsonl.xz`)."""
    path = Path(root) / SAMPLES
    return path.is_file() or path.with_name(path.name + PACKED).is_file()


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


@dataclass
class Dataset:
    root: Path
    samples: list[Sample]

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def archs(self) -> list[str]:
        return sorted({s.arch for s in self.samples})

    @property
    def families(self) -> list[str]:
        return sorted({s.family for s in self.samples})

    def fingerprint(self) -> str:
        """Hash of the sample keys and labels: identifies the data a model was trained on."""
        h = hashlib.sha256()
        for s in sorted(self.samples, key=lambda s: s.key):
            h.update(f"{s.key}:{s.label_ms:.6g}\n".encode())
        return h.hexdigest()[:16]

    def sequences_fingerprint(self) -> str:
        """Hash of every sample's operator sequence (types, loads, fusion, predicted operator
        times): tells apart two
        conversions of the same measurements, which `fingerprint` does not."""
        digests: dict[int, str] = {}  # sequences are shared by samples: hash each once

        def digest(q: OperatorSequence) -> str:
            if id(q) not in digests:
                d = hashlib.sha256(str(sorted(q.meta.get("fused", {"-": 0}).items())).encode())
                d.update(np.ascontiguousarray(q.op_type).tobytes())
                d.update(np.ascontiguousarray(q.load, np.float32).tobytes())
                if OP_MS in q.meta:  # predicted operator times: another set of inputs
                    d.update(np.asarray(q.meta[OP_MS], np.float32).tobytes())
                digests[id(q)] = d.hexdigest()
            return digests[id(q)]

        h = hashlib.sha256()
        for s in sorted(self.samples, key=lambda s: s.key):
            h.update(f"{s.key}:{digest(s.seq)}\n".encode())
        return h.hexdigest()[:16]

    def summary(self) -> dict:
        labels = np.array([s.label_ms for s in self.samples]) if self.samples else np.zeros(1)
        cvs = [s.stats["cv"] for s in self.samples if "cv" in s.stats]
        devices = sorted({s.workload.device for s in self.samples})
        return dict(
            path=str(self.root), num_samples=len(self.samples),
            num_architectures=len(self.archs), num_families=len(self.families),
            devices=devices,
            label_ms=dict(min=float(labels.min()), median=float(np.median(labels)),
                          max=float(labels.max())),
            batch_sizes=sorted({s.workload.batch_size for s in self.samples}),
            input_sizes=sorted({s.workload.input_size for s in self.samples}),
            median_cv=float(np.median(cvs)) if cvs else None,
            twins=self.twin_agreement(),
            fingerprint=self.fingerprint(),
            families={f: n for f, n in sorted(_count(s.family for s in self.samples).items(),
                                              key=lambda kv: -kv[1])},
        )


    def twin_agreement(self) -> dict | None:
        """Label noise seen where no repeats were kept: samples whose operator graph and
        workload were also measured under another name (timm's DeiT and ViT, its `tf_`/`_ap`/
        `_ns` weight variants). Each is predicted by the geometric mean of its twins' labels;
        `mape`, `median_ape`: the error of that prediction, a measure of the labels' own noise
        (for a pair, about sqrt(2) times one label's). None without twins."""
        twins: dict[tuple, list[Sample]] = {}
        for s in self.samples:
            w = s.workload
            key = (_graph_digest(s.seq), w.batch_size, w.input_size, w.precision, w.layout,
                   w.device, w.optimizer)
            twins.setdefault(key, []).append(s)
        ape = []
        for group in twins.values():
            if len({s.arch for s in group}) < 2:
                continue
            logs = np.log([s.label_ms for s in group])
            others = (logs.sum() - logs) / (len(logs) - 1)  # [n] mean of the other labels
            ape.extend(100 * np.abs(np.expm1(others - logs)))
        if not ape:
            return None
        return dict(samples=len(ape), mape=float(np.mean(ape)),
                    median_ape=float(np.median(ape)))


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def load_dataset(root: str | Path) -> Dataset:
    """Reads a dataset directory (sequences are loaded lazily, once per file). A dataset with
    an unusable line is refused with a `DatasetError` naming it (`mdot dataset check` lists
    them all, `--fix` moves them aside)."""
    root = Path(root)
    if not has_samples(root):
        raise DatasetError(f"{root}: not a dataset (no {SAMPLES})")
    rows, problems = read_samples(root / SAMPLES)
    problems = [q for q in problems if not q.torn]  # the sample in flight: not there yet
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DatasetError(f"{root / SAMPLES} line {first.line}: {first.reason}{more}; "
                           f"`mdot dataset check {root}` lists them, `--fix` moves them to "
                           f"{REJECTED}")
    samples = [Sample.from_json(d, root) for d in rows]
    return Dataset(root=root, samples=samples)


def check_dataset(root: str | Path, *, fix: bool = False) -> dict:
    """Every unusable line of a dataset, and every sample whose sequence file is missing.
    With `fix` (under the writer lock), those lines move to `rejected.jsonl` (appended, each
    with its line number and reason) and `samples.jsonl` is rewritten without them,
    atomically. Lines are moved by number, so of exact duplicates the first stays; a second
    `fix` finds nothing to move. Nothing is deleted."""
    root = Path(root)
    if not has_samples(root):
        raise DatasetError(f"{root}: not a dataset (no {SAMPLES})")
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


@contextlib.contextmanager
def writer_lock(root: str | Path):
    """Holds `root/.lock` while a process writes the dataset: a second writer is refused with
    the holder's pid. The kernel releases the lock when its holder exits, even on kill -9."""
    from mdot_jax.writers import Busy, acquire

    root = Path(root)
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


# ---------------------------------------------------------------------------- splits
Split = tuple[np.ndarray, np.ndarray]  # (train indices, test indices)


def random_folds(ds: Dataset, k: int = 5, seed: int = 0) -> list[Split]:
    """k-fold over samples, shuffled with `seed`; `k=1`: one random 70/30 split (the MDOT
    paper's protocol: architectures seen in training)."""
    idx = np.random.default_rng(seed).permutation(len(ds))
    if k == 1:
        cut = round(0.7 * len(idx))
        return [(np.sort(idx[:cut]), np.sort(idx[cut:]))]
    return [(np.sort(np.concatenate([f for j, f in enumerate(np.array_split(idx, k)) if j != i])),
             np.sort(part)) for i, part in enumerate(np.array_split(idx, k))]


def split_groups(samples: Sequence[Sample]) -> list[str]:
    """Per sample, the group the leave-family-out split keeps together: its family, merged
    with every family that has an identical operator graph (DeiT and ViT, MnasNet-A1 and
    SemNASNet-100 are one network under two names); otherwise a test model could have its
    exact twin among the training samples."""
    parent: dict[str, str] = {}

    def root(f: str) -> str:
        while parent.setdefault(f, f) != f:
            f = parent[f]
        return f

    first_family: dict[str, str] = {}  # graph digest -> a family having it
    for s in samples:
        d = _graph_digest(s.seq)
        a, b = root(first_family.setdefault(d, s.family)), root(s.family)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [root(s.family) for s in samples]


def _graph_digest(q: OperatorSequence) -> str:
    h = hashlib.sha256()
    for a in (q.op_type, q.config, q.load, q.edges):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


VAL_BY = ("sample", "family")  # the validation carve-out of `split_validation`


def split_validation(samples: Sequence[Sample], fraction: float, seed: int,
                     by: str = "sample") -> tuple[list[Sample], list[Sample]]:
    """(train, validation): a random `fraction` of the samples, or with `by="family"` whole
    families (merged as the leave-family-out split merges them) drawn at random until they
    hold `fraction` of the samples, so that early stopping scores unseen families, as the
    held-out test does."""
    n_val = max(1, int(round(fraction * len(samples)))) if fraction > 0 else 0
    rng = np.random.default_rng(seed)
    if by == "sample":
        is_val = np.zeros(len(samples), bool)
        is_val[rng.permutation(len(samples))[:n_val]] = True
    else:
        groups = np.array(split_groups(samples))
        names = rng.permutation(np.unique(groups))
        sizes = np.array([(groups == g).sum() for g in names])
        is_val = np.isin(groups, names[:int(np.searchsorted(np.cumsum(sizes), n_val)) + 1])
        if is_val.all():
            raise ValueError(f"a family validation carve-out needs samples of 2 families; "
                             f"these have 1 ({groups[0]})")
        if n_val == 0:
            is_val[:] = False
    return ([s for s, v in zip(samples, is_val) if not v],
            [s for s, v in zip(samples, is_val) if v])


def family_folds(ds: Dataset, k: int = 5, seed: int = 0) -> list[Split]:
    """Leave-family-out: families (merged by `split_groups`) are dealt to k folds (largest
    first, to the emptiest fold), so no family and no operator graph is in both the training
    and the test side of a fold."""
    groups = np.array(split_groups(ds.samples))
    names, counts = np.unique(groups, return_counts=True)
    rng = np.random.default_rng(seed)
    order = sorted(range(len(names)), key=lambda i: (-counts[i], rng.random()))
    load, assign = np.zeros(k), {}
    for i in order:
        j = int(np.argmin(load))
        assign[names[i]] = j
        load[j] += counts[i]
    fold_of = np.array([assign[g] for g in groups])
    return [(np.flatnonzero(fold_of != j), np.flatnonzero(fold_of == j)) for j in range(k)]


def batch_split(ds: Dataset, test_fraction: float = 0.25) -> list[Split]:
    """Extrapolation in batch size: samples in the top `test_fraction` of batch sizes are
    tested, the rest train."""
    bs = np.array([s.workload.batch_size for s in ds.samples])
    threshold = np.quantile(bs, 1 - test_fraction)
    test = np.flatnonzero(bs > threshold) if (bs > threshold).any() else \
        np.flatnonzero(bs >= threshold)
    train = np.setdiff1d(np.arange(len(ds)), test)
    return [(train, test)]


def is_random_zoo(arch: str) -> bool:
    return re.fullmatch(r"rnd\d+-s\d+-\d+", arch) is not None


def with_novel(ds: Dataset, novel: Dataset) -> Dataset:
    """`ds` and the samples of `novel` (marked `meta["novel"]`) as one dataset, for the novel
    split; refused where a novel architecture, or its graph, is among `ds`'s."""
    shared = set(ds.archs) & set(novel.archs)
    if shared:
        raise ValueError(f"{novel.root}: architectures also in {ds.root}: {sorted(shared)[:5]}")
    graphs = {_graph_digest(s.seq): s.arch for s in ds.samples}
    twins = {(s.arch, graphs[d]) for s in novel.samples if (d := _graph_digest(s.seq)) in graphs}
    if twins:
        raise ValueError(f"{novel.root}: graphs also in {ds.root}: {sorted(twins)[:5]}")
    marked = [dataclasses.replace(s, meta={**s.meta, "novel": True}) for s in novel.samples]
    return Dataset(root=ds.root, samples=[*ds.samples, *marked])


def novel_split(ds: Dataset, zoo_only: bool = False, held_out: float = 0.2,
                seed: int = 0) -> list[Split]:
    """One split: trained on the samples not marked novel (`with_novel`; with `zoo_only`, not
    of the random zoo either), less a held-out part that calibrates the bands: whole zoo
    families holding `held_out` of the zoo samples (`split_validation` by family) and that
    share of the random-zoo architectures; tested on the held-out part and every novel
    sample."""
    novel = np.array([bool(s.meta.get("novel")) for s in ds.samples])
    rnd = np.array([is_random_zoo(s.arch) for s in ds.samples])
    zoo = np.flatnonzero(~novel & ~rnd)
    _, val = split_validation([ds.samples[i] for i in zoo], held_out, seed, by="family")
    held = {s.key for s in val}
    if not zoo_only:
        archs = sorted({ds.samples[i].arch for i in np.flatnonzero(~novel & rnd)})
        drawn = np.random.default_rng(seed).permutation(len(archs))[:round(held_out * len(archs))]
        held |= {s.key for s in ds.samples
                 if not s.meta.get("novel") and s.arch in {archs[j] for j in drawn}}
    is_held = np.array([s.key in held for s in ds.samples])
    train = np.flatnonzero(~novel & ~is_held & (~rnd if zoo_only else True))
    return [(train, np.flatnonzero(novel | is_held))]


SPLITS = {"random": random_folds, "family": family_folds}


def make_splits(ds: Dataset, kind: str, k: int = 5, seed: int = 0) -> list[Split]:
    """`kind` in {random, family, batch, novel, novel-zoo}; `batch` gives one split (largest
    batch sizes test), so do the novel ones (`novel_split`)."""
    if kind == "batch":
        return batch_split(ds)
    if kind in ("novel", "novel-zoo"):
        return novel_split(ds, zoo_only=kind == "novel-zoo", seed=seed)
    if kind not in SPLITS:
        raise ValueError(f"unknown split {kind!r}: choose random, family or batch")
    return SPLITS[kind](ds, k, seed)


def per_graph(export: Callable[[str, int], Any]) -> Callable[[Sample], Any]:
    """`export(arch, input_size)` called once per graph: samples come grouped by model and
    size, so the last result is kept, a failure too (raised again for that model's other
    samples)."""
    last: dict[tuple[str, int], Any] = {}

    def of_sample(sample: Sample) -> Any:
        key = (sample.arch, sample.workload.input_size)
        if key not in last:
            last.clear()
            try:
                last[key] = export(*key)
            except Exception as e:  # noqa: BLE001 - the samples of this model fail alike
                last[key] = e
        if isinstance(last[key], Exception):
            raise last[key]
        return last[key]

    return of_sample


RESEQUENCE_FAILED = "resequence_failed.jsonl"  # samples a partial copy left out, and why
RESEQUENCE_TRIES = "resequence_tries.jsonl"  # a line as each conversion begins, one as it ends
KILLED_TRIES = 2  # a partial copy leaves out a graph whose conversion the process died in so often


def _killed_tries(path: Path) -> Counter[str]:
    """Per graph, the conversions in `RESEQUENCE_TRIES` that began and never ended (the
    process died in them); a torn line counts for nothing."""
    kills: Counter[str] = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
            d = json.loads(line)
            kills[d["graph"]] += -1 if d.get("ended") else 1
    return kills


def _check_copy_target(source: Dataset, out: Path) -> None:
    """A copy goes into a new or empty folder, or resumes a stopped copy of the same dataset
    (its samples all the source's, with the same labels); anything else is refused, before
    anything is written."""
    if out.resolve() == source.root.resolve():
        raise DatasetError(f"{out}: is the dataset being copied; name a new folder")
    if not out.exists():
        return
    if (out / SAMPLES).exists():  # a copy under way: every sample must be the source's
        labels = {s.key: s.label_ms for s in source.samples}
        foreign = [d["key"] for d in read_samples(out / SAMPLES)[0]
                   if labels.get(d["key"]) != d["label_ms"]]
    else:  # stopped before its first sample: only what a copy writes first
        own = {SEQS, PACKED_SEQS, "onnx", LOCK, REPORT, REJECTED, RESEQUENCE_TRIES,
               RESEQUENCE_FAILED}
        foreign = [p.name for p in out.iterdir() if p.name not in own]
    if foreign:
        raise DatasetError(f"{out}: not empty, and not a stopped copy of {source.root} "
                           f"({foreign[0]} is not one of its files or samples); name a new "
                           "folder")


def resequence(src: str | Path, out: str | Path, export_of: Callable[[Sample], Any], *,
               fuse: bool | int = True, partial: bool = False, reuse: bool = False,
               progress: bool = True) -> Dataset:
    """A copy of the dataset `src` (same samples, labels, folds) whose operator sequences are
    converted again, e.g. with `fuse` (True: the latest fusion version), from
    `export_of(sample)` (an ONNX path or ModelProto of the sample's model at its input size);
    nothing is measured. With `reuse` (`src` holds the same graphs, e.g. an older fusion
    version), a sequence that the newer version would convert the same is copied with that
    version instead (`converters.converts_the_same`). Resumable. A sample that
    cannot be exported or converted stops the copy, or with `partial` is left out and named
    in `RESEQUENCE_FAILED` (tried again on resuming), and so is a graph (model and input
    size) whose conversion the process died in `KILLED_TRIES` times (killed for memory: the
    biggest models' exports can outgrow the machine), so that a resumed copy ends."""
    from tqdm import tqdm

    source = load_dataset(src)
    _check_copy_target(source, Path(out))
    writer = DatasetWriter(out)
    version = fusion_version(fuse)
    pending = [s for s in source.samples if s.key not in writer.done]
    tries = Path(out) / RESEQUENCE_TRIES
    kills = _killed_tries(tries)
    failed: list[dict] = []
    for sample in tqdm(pending, unit="sample", disable=not progress, desc="resequence"):
        seq_key = Path(sample.seq_path).stem
        graph = f"{sample.arch}/{sample.workload.input_size}"
        if not writer.has_seq(seq_key):
            if partial and kills[graph] >= KILLED_TRIES:
                failed.append(dict(key=sample.key, arch=sample.arch, reason=(
                    f"the copy died {kills[graph]} times converting it (out of memory?); "
                    f"delete {RESEQUENCE_TRIES} to try again")))
                continue
            # reuse: where the source has the sequence (a GPU kit's samples come without)
            if (reuse and has_sequence(source.root, sample.seq_path)
                    and converts_the_same(sample.seq, version)):
                seq = dataclasses.replace(
                    sample.seq, meta={**sample.seq.meta, "fusion_version": version})
            else:
                append_line(tries, dict(graph=graph, key=sample.key))
                try:
                    seq = convert(export_of(sample), name=sample.arch,
                                  batch_size=sample.workload.batch_size, fuse=version)
                except Exception as e:  # noqa: BLE001 - one line naming the sample
                    why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    if not partial:
                        raise ValueError(f"{sample.key}: cannot convert again ({why})") from None
                    failed.append(dict(key=sample.key, arch=sample.arch, reason=why))
                    continue
                finally:  # however it ended, Ctrl-C included; only a killed process writes nothing
                    append_line(tries, dict(graph=graph, key=sample.key, ended=True))
            writer.save_seq(seq_key, seq)
        writer.append(dataclasses.replace(sample, root=None))
    if partial:
        with open(Path(out) / RESEQUENCE_FAILED, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in failed)
    report = Path(src) / REPORT
    if report.exists():  # what the source skipped, as of now (it may have grown)
        shutil.copy(report, Path(out) / REPORT)
    return load_dataset(out)
