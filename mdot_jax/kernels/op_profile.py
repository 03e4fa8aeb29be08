"""`mdot profile --ops`: time single operators on the machine at hand.

Design (docs/operators.md has the reasoning):
- **What is measured** comes from the graphs the model datasets hold (`harvest`): every distinct
  operator row (`specs.OpSpec`) of their training graphs, with how often it occurs and the
  load it carries. `plan` draws `n` of them, stratified by op type (a type's share grows with
  its distinct rows and with its share of the load, never below `min_per_type`) and, within a
  type, evenly over log-load bins, plus the loss at every batch size. The plan is written once
  (`plan.jsonl`, seeded) and a resumed run measures what is left of it.
- **One sample** = one operator on fresh random fp32 inputs: forward (autograd recording, as in
  training), forward + backward (input gradients where `input_grad`, weight gradients), and for
  operators with parameters one SGD step (momentum 0.9, nesterov, as `mdot profile`). Each is
  run `inner` times per timed repeat so that a repeat lasts >= `min_repeat_ms` (timer noise),
  after `warmup` untimed calls and one untimed repeat; the per-call median over `repeats` is
  kept, with the spread. Noisy samples are measured once more at the end of a run.
  The label is forward + backward + update (ms per training iteration of that operator).
- Same safety as model profiling: append-only JSON lines with fsync (kill -9 loses at most the
  sample in flight), `writer_lock`, the device fingerprint on every sample and a foreign
  device refused, noisy samples (IQR over median, or other runnable threads) kept apart in
  `noisy.jsonl`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mdot_jax.data.dataset import (
    NOISY,
    PLAN,
    REJECTED,
    SAMPLES,
    has_samples,
    load_sequence,
    not_a_dataset,
    read_jsonl_bytes,
    read_samples,
)
from mdot_jax.data.store import SkipLog, append_line, end_last_line, unpack_for_writing, writer_lock
from mdot_jax.errors import DatasetError
from mdot_jax.kernels.specs import (
    BUILDER_VERSION,
    LOSS,
    MEASURED,
    OpSpec,
    build,
    changed_rows,
    loss_spec,
    specs_of,
)
from mdot_jax.measure.device import DEVICE_KEYS, device_slug, fingerprint, others_running
from mdot_jax.measure.profiler import check_precision, precision_context, stats_of


@dataclass(frozen=True)
class OpProtocol:
    warmup: int = 2
    repeats: int = 5  # forward + backward (the label's spread)
    side_repeats: int = 3  # forward alone, and the update
    min_repeat_ms: float = 5.0  # a timed repeat runs the operator this long at least
    max_inner: int = 2000
    max_call_s: float = 1.5  # one forward + backward slower than this: skipped as too slow
    max_spread: float = 10.0  # IQR / median of the forward + backward repeats, percent: noisy
    # above (robust: one disturbed repeat of five moves neither the median nor the IQR)
    max_others: float = 0.5  # other runnable threads on average: noisy above
    precision: str = "fp32"  # `options.MEASURED_PRECISIONS`: the forward runs autocast at AMP


@dataclass
class Harvest:
    """Distinct operator rows of some datasets' graphs: spec, occurrences, a source key."""

    specs: list[OpSpec]
    count: list[int]
    source: list[str]


def harvest(dataset_dirs: list[str | Path], progress: bool = True) -> Harvest:
    """Every distinct operator row of the datasets' sequences (each sequence file once)."""
    from tqdm import tqdm

    index: dict[str, int] = {}
    out = Harvest([], [], [])
    files: dict[tuple[Path, str], str] = {}  # (dataset, sequence) -> the first key using it
    for d in dataset_dirs:  # the graphs of noisy samples too: a graph is what is drawn from
        if not has_samples(d) and not (Path(d) / NOISY).exists():
            raise not_a_dataset(d)
        for name in (SAMPLES, NOISY):
            for row in read_samples(Path(d) / name)[0]:
                files.setdefault((Path(d), row["seq"]), row["key"])
    for (root, rel), sample_key in tqdm(files.items(), desc="harvest operator rows",
                                        disable=not progress):
        for spec in specs_of(load_sequence(root, rel)):  # a file, or packed in the archive
            k = spec.key
            if k not in index:
                index[k] = len(out.specs)
                out.specs.append(spec)
                out.count.append(0)
                out.source.append(sample_key)
            out.count[index[k]] += 1
    return out


def _cost(spec: OpSpec) -> float:
    """A load proxy for stratifying: FLOPs plus bytes moved."""
    ld = spec.ld
    return ld["fwd_flops"] + ld["bwd_flops"] + ld["bytes_read"] + ld["bytes_written"]


def plan(h: Harvest, n: int, *, seed: int = 0, min_per_type: int = 40, bins: int = 10,
         batch_sizes=(2, 4, 8, 16, 32, 64), classes=(2, 1000)) -> list[dict]:
    """`n` operator rows to measure (see the module docstring), shuffled so that any prefix
    covers every type: `[{"spec": ..., "source": ..., "count": ...}]`."""
    rng = np.random.default_rng(seed)
    by_type: dict[str, list[int]] = {}
    for i, s in enumerate(h.specs):
        if s.op_type in MEASURED:
            by_type.setdefault(s.op_type, []).append(i)
    load = {t: sum(_cost(h.specs[i]) * h.count[i] for i in idx) for t, idx in by_type.items()}
    rows = {t: len(idx) for t, idx in by_type.items()}
    total_load, total_rows = sum(load.values()) or 1.0, sum(rows.values()) or 1
    weight = {t: 0.5 * rows[t] / total_rows + 0.5 * load[t] / total_load for t in by_type}
    quota = {t: min(rows[t], max(min_per_type, int(n * weight[t]))) for t in by_type}
    for _ in range(20):  # hand what capped types cannot take to the others, by weight
        spare = n - sum(quota.values())
        open_ = [t for t in by_type if quota[t] < rows[t]]
        if spare <= 0 or not open_:
            break
        w = sum(weight[t] for t in open_)
        for t in open_:
            quota[t] = min(rows[t], quota[t] + max(1, int(spare * weight[t] / w)))
    picked: list[dict] = []
    for t, idx in sorted(by_type.items()):
        picked += _items(h, _even_over_load(h, idx, quota[t], rng, bins))
    picked += [dict(spec=loss_spec(b, k).to_json(), source="loss", count=1)
               for b in batch_sizes for k in classes]
    order = rng.permutation(len(picked))
    return [picked[i] for i in order]


def plan_more(h: Harvest, planned: list[dict], n: int, kinds: list[str], *, seed: int = 1,
              bins: int = 10) -> list[dict]:
    """Up to `n` more rows of the given `kinds` (`OpSpec.kind`: an op type, `Conv:dense`,
    `Conv:depthwise`, `Conv:grouped` or `Gather:table`) that `planned` does not hold, split
    evenly over the kinds and, within one, over log-load bins (as `plan`): a targeted
    extension where the kernel cost model errs (`benchmarks/bench_kernels.py` reports by kind)."""
    unknown = sorted(set(kinds) - {s.kind for s in h.specs if s.op_type in MEASURED})
    if unknown:
        raise ValueError(f"--ops-kinds: no measurable operator rows of {', '.join(unknown)} "
                         "in the model datasets (kinds: an op type, Conv:dense, "
                         "Conv:depthwise, Conv:grouped or Gather:table)")
    rng = np.random.default_rng(seed)
    have = {OpSpec.from_json(d["spec"]).key for d in planned}
    by_kind: dict[str, list[int]] = {k: [] for k in kinds}
    for i, s in enumerate(h.specs):
        if s.kind in by_kind and s.key not in have:
            by_kind[s.kind].append(i)
    picked: list[dict] = []
    for j, idx in enumerate(by_kind.values()):
        quota = (n - len(picked)) // (len(by_kind) - j)  # what one kind lacks goes to the rest
        picked += _items(h, _even_over_load(h, idx, quota, rng, bins))
    return [picked[i] for i in rng.permutation(len(picked))]


def _even_over_load(h: Harvest, idx: list[int], quota: int, rng, bins: int) -> list[int]:
    """`quota` of the rows `idx` (all if fewer), round-robin over `bins` log-load bins: even
    over the load range."""
    if not idx:
        return []
    costs = np.log10(np.asarray([_cost(h.specs[i]) for i in idx]) + 1.0)
    edges = np.quantile(costs, np.linspace(0, 1, bins + 1)[1:-1])
    groups = [list(rng.permutation(np.asarray(idx)[np.digitize(costs, edges) == b]))
              for b in range(bins)]
    take: list[int] = []
    while len(take) < min(quota, len(idx)):
        for grp in groups:
            if grp and len(take) < quota:
                take.append(int(grp.pop()))
    return take


def _items(h: Harvest, take: list[int]) -> list[dict]:
    return [dict(spec=h.specs[i].to_json(), source=h.source[i], count=h.count[i])
            for i in take]


def write_plan(root: Path, items: list[dict]) -> None:
    tmp = root / (PLAN + ".tmp")
    tmp.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in items))
    tmp.replace(root / PLAN)


def read_plan(root: Path) -> list[dict]:
    data = read_jsonl_bytes(root / PLAN)
    return [json.loads(line) for line in (data or b"").splitlines() if line.strip()]


# ---------------------------------------------------------------------------- samples
def _op_problem(d, seen: dict, lineno: int) -> str | None:
    """Why a parsed operator-sample line is unusable, or None (its key is recorded)."""
    if not isinstance(d, dict):
        return f"not a JSON object but {type(d).__name__}"
    if not isinstance(d.get("key"), str) or not isinstance(d.get("spec"), dict):
        return "'key' or 'spec' is missing"
    label = d.get("label_ms")
    if isinstance(label, bool) or not isinstance(label, (int, float)) or not (
            np.isfinite(label) and label > 0):
        return f"'label_ms' is {label!r}: a measured time is finite and > 0"
    if d["key"] in seen:
        return f"duplicate key {d['key']!r} (first on line {seen[d['key']][0]})"
    seen[d["key"]] = (lineno, float(label))
    return None


def read_op_samples(root: str | Path) -> list[dict]:
    """The operator samples of a folder (`samples.jsonl`); an unusable line is refused,
    naming it (a torn last line is ignored)."""
    path = Path(root) / SAMPLES
    good, problems = read_samples(path, _op_problem)
    bad = [p for p in problems if not p.torn]
    if bad:
        raise DatasetError(f"{path}:{bad[0].line}: {bad[0].reason}")
    return good


class OpWriter:
    """Append-only operator samples (clean to `samples.jsonl`, noisy to `noisy.jsonl`)."""

    def __init__(self, root: Path):
        self.root = root
        end_last_line(root / SAMPLES, root / REJECTED)
        end_last_line(root / NOISY, root / REJECTED)
        self.done = {d["key"] for d in read_op_samples(root)}
        self.noisy = {d["key"] for d in read_samples(root / NOISY, _op_problem)[0]} - self.done

    def append(self, record: dict) -> None:
        noisy = bool(record["stats"].get("noisy"))
        append_line(self.root / (NOISY if noisy else SAMPLES), record)
        (self.noisy if noisy else self.done).add(record["key"])
        if not noisy:  # a clean measurement supersedes a noisy one
            self.noisy.discard(record["key"])


SUPERSEDED = "superseded.jsonl"  # samples of rows the builder now makes differently


def supersede_changed(root: Path) -> int:
    """Moves the samples (clean and noisy) whose operator `build` now makes differently
    (`specs.changed_rows`) to `superseded.jsonl`, kept, so that this run measures them
    again; returns how many."""
    moved = 0
    for name in (SAMPLES, NOISY):
        path = root / name
        if not path.exists():
            continue
        keep, old = [], []
        for line in path.read_text().splitlines(keepends=True):
            d = json.loads(line) if line.strip() else None
            since = (d or {}).get("meta", {}).get("builder", 1)
            stale = d and since < BUILDER_VERSION and changed_rows(
                OpSpec.from_json(d["spec"]), since)
            (old if stale else keep).append(line)
        if old:
            with open(root / SUPERSEDED, "a", encoding="utf-8") as f:
                f.writelines(old)
                f.flush()
                os.fsync(f.fileno())
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(keep))
            tmp.replace(path)
            moved += len(old)
    return moved


def _check_device(root: Path, fp: dict) -> None:
    theirs = [json.loads(line).get("meta", {}).get("fingerprint", {})
              for name in (SAMPLES, NOISY)
              for line in (read_jsonl_bytes(root / name) or b"").splitlines()[:1]
              if line.strip()]
    for t in theirs:
        if t.get("precision", "fp32") != fp.get("precision", "fp32"):
            raise DatasetError(f"{root} holds operators measured at {t.get('precision', 'fp32')}"
                               f", this run's precision is {fp.get('precision')}: one "
                               "precision per folder; measure into a new folder")
        for k in DEVICE_KEYS:
            if json.dumps(t.get(k)) != json.dumps(fp.get(k)):
                raise DatasetError(
                    f"{root} holds operators measured with {k} {json.dumps(t.get(k))}, this "
                    f"machine has {json.dumps(fp.get(k))}: measure into a new folder "
                    f"(default: {device_slug(fp)}/ops in the data folder)")


# ---------------------------------------------------------------------------- measuring
class TooSlow(RuntimeError):
    pass


def measure_op(spec: OpSpec, protocol: OpProtocol, torch, device: str, threads: int) -> dict:
    """Times one operator (module docstring); returns its stats (milliseconds per call)."""
    case = build(spec, torch, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    opt = torch.optim.SGD(case.params, lr=1e-3, momentum=0.9, nesterov=True) \
        if case.params else None
    autocast = precision_context(protocol.precision, device, torch)

    def forward():
        with autocast():
            return case.forward()

    out = forward()
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
            if getattr(o, "requires_grad", False)]
    grads = [torch.randn_like(o) for o in outs]

    def fwd():
        forward()

    def fwd_bwd():
        for t in case.leaves:
            t.grad = None
        o = forward()
        if grads:
            torch.autograd.backward([x for x in (o if isinstance(o, (tuple, list)) else [o])
                                     if getattr(x, "requires_grad", False)], grads)

    def update():
        opt.step()

    def timed(fn, n: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t0) * 1e3 / n

    for _ in range(protocol.warmup):
        one = timed(fwd_bwd, 1)
        if one > protocol.max_call_s * 1e3:
            raise TooSlow(f"{one / 1e3:.1f}s per forward + backward > {protocol.max_call_s}s")

    def repeat(fn, repeats: int) -> tuple[list[float], int]:
        n = int(min(protocol.max_inner, max(1, math.ceil(protocol.min_repeat_ms /
                                                         max(timed(fn, 1), 1e-4)))))
        timed(fn, n)  # untimed: first touches of the loop's memory
        return [timed(fn, n) for _ in range(repeats)], n

    load: list[float] = []
    fwd_times, _ = repeat(fwd, protocol.side_repeats)
    both_times, inner = repeat(fwd_bwd, protocol.repeats)
    load.append(others_running(threads) or 0.0)
    upd_times = repeat(update, protocol.side_repeats)[0] if opt else [0.0]
    load.append(others_running(threads) or 0.0)
    st = stats_of(both_times)
    fwd_ms, both_ms, upd_ms = (float(np.median(x)) for x in (fwd_times, both_times, upd_times))
    st.update(fwd_ms=fwd_ms, bwd_ms=max(0.0, both_ms - fwd_ms), update_ms=upd_ms,
              fwd_times_ms=[round(x, 5) for x in fwd_times], inner=inner,
              times_ms=[round(x, 5) for x in both_times], others_running=float(np.mean(load)))
    st["spread"] = 100.0 * st["iqr_ms"] / max(st["median_ms"], 1e-9)
    st["noisy"] = st["spread"] > protocol.max_spread or st["others_running"] > protocol.max_others
    return st


def default_sources() -> list[Path]:
    """The model datasets whose graphs the plan draws from: every derived CPU dataset of
    models (a derived folder of operator samples, whose lines name no `arch`, is not one)."""
    def of_models(p: Path) -> bool:
        return b'"arch"' in (read_jsonl_bytes(p / SAMPLES) or b"").split(b"\n", 1)[0]
    return sorted(p for p in Path("data/derived").glob("cpu-*")
                  if has_samples(p) and of_models(p))


def profile_ops(out: str | Path, *, n: int = 20000, sources: list[str | Path] | None = None,
                threads: int = 2, seed: int = 0, protocol: OpProtocol = OpProtocol(),
                max_minutes: float | None = None, more: int = 0, kinds: Sequence[str] = (),
                progress: bool = True) -> dict:
    """Measures the plan of `out` (made from `sources` on the first run), skipping what is
    done; stops cleanly after `max_minutes`. With `more` and `kinds`, the plan first gets up
    to `more` rows of those kinds (`plan_more`), once: the added rows carry the extension's
    name, so running the same command again resumes it rather than extending twice.
    Returns the report (also `out/report.json`)."""
    import torch
    from tqdm import tqdm

    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check_precision(device, protocol.precision)
    fp = fingerprint(threads, precision=protocol.precision)
    root = Path(out)
    with writer_lock(root):
        for name in (SAMPLES, NOISY, PLAN):
            unpack_for_writing(root / name)
        _check_device(root, fp)
        items = read_plan(root)
        srcs = [Path(s) for s in (sources or default_sources())]
        tag = f"{','.join(kinds)}+{more}"
        extend = bool(more and kinds) and not any(d.get("extension") == tag for d in items)
        if (extend or not items) and not srcs:
            raise DatasetError("no model datasets to draw operators from: pass --ops-from")
        h = harvest(srcs, progress) if extend or not items else None
        if not items:
            items = plan(h, n, seed=seed)
            write_plan(root, items)
        if extend:
            done = {d.get("extension") for d in items} - {None}
            added = plan_more(h, items, more, list(kinds), seed=seed + 1 + len(done))
            items += [dict(d, extension=tag) for d in added]
            write_plan(root, items)
        supersede_changed(root)
        writer = OpWriter(root)
        report = SkipLog(root)
        skip = writer.done | writer.noisy | set(report.skipped)
        todo = [d for d in items if OpSpec.from_json(d["spec"]).key not in skip]
        todo += [d for d in items if OpSpec.from_json(d["spec"]).key in writer.noisy]
        deadline = time.monotonic() + 60 * max_minutes if max_minutes else math.inf
        bar = tqdm(total=len(todo), unit="op", disable=not progress, desc=f"profile ops {device}")
        for i, d in enumerate(todo):
            if time.monotonic() > deadline:
                break
            spec = OpSpec.from_json(d["spec"])
            bar.set_postfix_str(spec.op_type)
            try:
                st = measure_op(spec, protocol, torch, device, threads)
            except TooSlow as e:
                report.skip(spec.key, "too_slow", str(e))
            except Exception as e:  # noqa: BLE001 - recorded in report.json, not raised
                report.skip(spec.key, "cannot_build" if "Unsupported" in type(e).__name__
                            else "cannot_run", f"{type(e).__name__}: {e}")
            else:
                writer.append(dict(
                    key=spec.key, op_type=spec.op_type, spec=d["spec"], source=d["source"],
                    count=d["count"], label_ms=max(st["median_ms"] + st["update_ms"], 1e-6),
                    stats=st, meta=dict(fingerprint=fp, device=device_slug(fp),
                                        builder=BUILDER_VERSION,
                                        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))))
            bar.update()
            if i % 200 == 0:
                _write_report(report, writer, items)
        bar.close()
        return _write_report(report, writer, items)


def _write_report(report: SkipLog, writer: OpWriter, items: list[dict]) -> dict:
    types = Counter(k.split("/")[0] for k in writer.done)
    return report.write(planned=len(items), samples=len(writer.done), noisy=len(writer.noisy),
                        by_type=dict(types.most_common()), loss_samples=types.get(LOSS, 0))
