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

import dataclasses
import hashlib
import io
import json
import lzma
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from converters import ConversionError, OperatorSequence
from mdot_jax.errors import DatasetError

SAMPLES = "samples.jsonl"
REPORT = "report.json"
SEQS = "seqs"
PACKED_SEQS = "seqs.tar.xz"  # the sequences as one solid xz archive of uncompressed .npz
LOCK = ".lock"  # held by the writing process (`writer_lock`)
NOISY = "noisy.jsonl"  # measured, but too noisy to train on (`mdot profile --retry-noisy`)
OP_MS = "op_ms"  # sequence meta: `[N]` predicted ms per operator (`kernels.cost_model.attach`)
PLAN = "plan.jsonl"  # an operator dataset's rows to measure (`kernels.op_profile`)
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
        GPU peak_mb, the step's `max_memory_allocated` above what was held before its model;
        with `mdot profile --trace`, `trace`: what one more step issued
        (`measure.profiler.profiled`: kernels, launches, the GPU's busy time, the busiest).
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


def not_a_dataset(root: str | Path) -> DatasetError:
    """The error for a `root` without samples, saying which: no such folder, a file, or a
    folder without them."""
    path = Path(root)
    why = "no such folder" if not path.exists() else "a file, not a dataset folder" \
        if not path.is_dir() else f"not a dataset (no {SAMPLES})"
    return DatasetError(f"{root}: {why}")


def graph_digest(q: OperatorSequence) -> str:
    """A digest of the graph itself (operators, configuration, load, edges), whatever its name."""
    h = hashlib.sha256()
    for a in (q.op_type, q.config, q.load, q.edges):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


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
        missing = sum(not has_sequence(s.root, s.seq_path) for s in self.samples)
        return dict(
            path=str(self.root), num_samples=len(self.samples),
            num_architectures=len(self.archs), num_families=len(self.families),
            devices=devices,
            label_ms=dict(min=float(labels.min()), median=float(np.median(labels)),
                          max=float(labels.max())),
            batch_sizes=sorted({s.workload.batch_size for s in self.samples}),
            input_sizes=sorted({s.workload.input_size for s in self.samples}),
            median_cv=float(np.median(cvs)) if cvs else None,
            missing_sequences=missing,  # measured, not converted here (`dataset resequence`)
            twins=None if missing else self.twin_agreement(),
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
            key = (graph_digest(s.seq), w.batch_size, w.input_size, w.precision, w.layout,
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
        raise not_a_dataset(root)
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


# ---------------------------------------------------------------------------- splits
Split = tuple[np.ndarray, np.ndarray]  # (train indices, test indices)


