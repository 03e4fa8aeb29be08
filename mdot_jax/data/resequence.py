"""Copies of a dataset with its operator sequences converted again (another fusion version, the
training view of an inference export, op-grounded times): resumable, a graph whose conversion
killed the process left out after a few tries."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from converters import convert, converts_the_same
from converters.fusion import fusion_version
from mdot_jax.data.dataset import (
    LOCK,
    PACKED_SEQS,
    REJECTED,
    REPORT,
    SAMPLES,
    SEQS,
    Dataset,
    Sample,
    has_sequence,
    load_dataset,
    read_samples,
)
from mdot_jax.data.store import (
    DatasetWriter,
    append_line,
)
from mdot_jax.errors import DatasetError


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
