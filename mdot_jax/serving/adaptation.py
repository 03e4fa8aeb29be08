"""`mdot adapt`: a checkpoint for another device, from step times the user already has
(`--from-measurements`: a few jobs from their logs, on a machine we cannot run on; nothing is
measured) or from this machine's probe (`--probe`: the 12 reference samples of
`measure.core_set`, measured here in a few minutes, adapting the shipped checkpoint whose device
ran its probe most alike).

The CSV has one row per measured job: `model` (an `.onnx` file, an operator sequence
`.npz` written by `mdot convert -o` or a config.json, relative to the CSV; or a name of
`mdot models`), `batch_size`, `image_size` or
`seq_len` (optional where the file fixes them), `precision` (recorded, not used: the fit
absorbs it) and `ms` (milliseconds per training iteration); for a GPU step model also
`optimizer`, `attention`, `compile` and `layout` (optional: `mdot predict`'s defaults), as its
rows are priced by the front door exactly as `mdot predict` will price the user's jobs. The
base predicts each row, `serving.adaptation.fit` maps its predictions onto the measurements,
and the adapted checkpoint is the base one with that fit in its metadata.

The fit: a base checkpoint predicts `t` for its own device; the adapted one predicts
`exp(a + b * log t)` for the new device, fitted on rows the user measured there (their own
precision, optimizer and software, which the fit absorbs as well as the device). The fits are
scored by leaving each job out (its rows, a job measured twice being one), the best kept:
- `scale`: b = 1, a = mean log ratio (one factor for every model);
- `affine`: a and b by least squares on log times (the new device may favour small or large
  workloads), only with >= 6 jobs spanning a 2x range of predicted times;
- `machine` (a GPU step model, from 3 jobs, on a base not adapted already): a step is kernels
  a host issues (`host.launch_bound`), so the fit is of the machine's two numbers, every
  kernel at exp(a) times its price and the host's time a kernel (least squares of log time
  over `MACHINE_SPEEDS` x `MACHINE_HOSTS`, `host.launch_bound_grid`): small steps follow
  the host, large ones the GPU ([study](../../docs/studies/machine-adaptation.md)).
The left-out residuals give the expected error and the 80% band; with 10 rows both are
rough, and say so (`n_rows`).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converters import ConversionError, OperatorSequence
from converters.dims import converted_batch
from mdot_jax import writers
from mdot_jax.errors import MdotError, UsageError
from mdot_jax.serving import model_source
from mdot_jax.serving.measurements import FLAG, JOB_COLUMNS, Row, check_units, read_measurements
from mdot_jax.serving.predict import Predictor
from mdot_jax.serving.prediction import Adaptation, Prediction
from mdot_jax.serving.request import in_fields
from mdot_jax.storage import checkpoint
from mdot_jax.storage.calibration import COVER
from mdot_jax.storage.shipped import resolve_checkpoint

MIN_AFFINE_ROWS = 6
MIN_AFFINE_SPREAD = float(np.log(2.0))  # of log predicted times, max - min
# the machine form's grid: its kernels' factor (log-spaced), its host's ms a kernel
MACHINE_SPEEDS = np.exp(np.linspace(np.log(0.25), np.log(4.0), 161))
MACHINE_HOSTS = np.linspace(0.0, 0.15, 76)  # 2 us apart (a 1 us grid: see the study)


def _solve(x: np.ndarray, y: np.ndarray, fit: str) -> tuple[float, float]:
    if fit == "scale":
        return float(np.mean(y - x)), 1.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def fit(pred_ms, measured_ms, device: str, source: str = "",
        workloads: Sequence | None = None, kernels: list | None = None) -> Adaptation:
    """The adaptation of base predictions `pred_ms` `[N]` to `measured_ms` `[N]`; `workloads`
    `[N]`: each row's job (None: its prediction), each left out whole (module docstring).
    `kernels`: each row's kernel times in the order they run (`gpu.host.recording_kernels`),
    for the `machine` form."""
    x = np.log(np.asarray(pred_ms, np.float64))
    y = np.log(np.asarray(measured_ms, np.float64))
    n = len(x)
    if n < 2:
        raise ValueError(f"adapting needs at least 2 measured rows, got {n}")
    job = np.unique(np.round(x, 9) if workloads is None else
                    np.asarray([str(w) for w in workloads]), return_inverse=True)[1]  # [N]
    jobs = int(job.max()) + 1
    if jobs < 2:
        raise ValueError(f"adapting needs rows of at least 2 different workloads (models, batch "
                         f"or input sizes); these {n} rows are all one")
    others = [job != job[i] for i in range(n)]  # each row's fit: the other jobs' rows
    fits = ["scale"]
    if jobs >= MIN_AFFINE_ROWS and np.ptp(x) >= MIN_AFFINE_SPREAD:
        fits.append("affine")
    loos = {}  # each form's leave-one-job-out log(measured / predicted)
    for kind in fits:
        fitted = [_solve(x[k], y[k], kind) for k in others]
        loos[kind] = np.asarray([y[i] - (a + b * x[i]) for i, (a, b) in enumerate(fitted)])
    grid = None  # [N, S, H] log ms of each row on each machine
    if kernels is not None and jobs >= 3:
        from mdot_jax.gpu.host import launch_bound_grid

        grid = np.log(np.maximum(launch_bound_grid(kernels, MACHINE_SPEEDS, MACHINE_HOSTS),
                                 1e-9))
        loos["machine"] = np.asarray([y[i] - grid[i][_solve_machine(grid[k], y[k])]
                                      for i, k in enumerate(others)])
    score, kind, loo = min(((float(np.mean(np.abs(np.expm1(-v))) * 100), k, v)
                            for k, v in loos.items()), key=lambda t: t[0])  # ties: the first
    host = None
    if grid is not None and kind == "machine":
        speed, at = _solve_machine(grid, y)
        a, b, host = float(np.log(MACHINE_SPEEDS[speed])), 1.0, float(MACHINE_HOSTS[at])
    else:
        a, b = _solve(x, y, kind)
    lo, hi = np.quantile(loo, [(1 - COVER) / 2, (1 + COVER) / 2])
    width = float(np.log1p(score / 100))  # the band is never narrower than the error to expect
    return Adaptation(device, kind, a, b, n, score, min(float(lo), -width), max(float(hi), width),
                      source, host, float(np.mean(np.abs(np.expm1(x - y))) * 100))


def adapted_ms(a: Adaptation, base_ms: float, kernels: list[float]) -> float:
    """A step the base priced at `base_ms` from `kernels` (ms, in the order they run), as `a`
    prices it."""
    if a.fit != "machine":
        return float(a.apply(np.asarray([base_ms]))[0])
    from mdot_jax.gpu.host import launch_bound

    return launch_bound([math.exp(a.a) * k for k in kernels], a.host_ms or 0.0)


def at_the_edge(a: Adaptation) -> str | None:
    """What a machine fit that stopped at its grid's edge says of its rows, or None."""
    if a.fit != "machine":
        return None
    speed, host = math.exp(a.a), 1e3 * (a.host_ms or 0.0)
    if not (math.isclose(speed, MACHINE_SPEEDS[0]) or math.isclose(speed, MACHINE_SPEEDS[-1])
            or math.isclose(host, 1e3 * MACHINE_HOSTS[-1])):
        return None
    return (f"the fit stopped at the edge of what it tries (kernels at {speed:.2f}x their "
            f"price, a host of {host:.0f} us): are the rows of the GPU --device-name names, at "
            "their precision?")


def _solve_machine(grid: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    """The (factor, host) indices of `grid` (the log ms of rows measured `y` log ms, on each
    machine) with the least squared log error."""
    err = ((grid - y[:, None, None]) ** 2).sum(axis=0)  # [S, H]
    speed, host = np.unravel_index(int(np.argmin(err)), err.shape)
    return int(speed), int(host)


def compose(outer: Adaptation, inner: Adaptation | None) -> Adaptation:
    """`outer`, fitted on predictions already adapted by `inner`, as one adaptation of the
    unadapted base: log t'' = a2 + b2 (a1 + b1 log t); its error and band are `outer`'s."""
    if inner is None:
        return outer
    return dataclasses.replace(outer, a=outer.a + outer.b * inner.a, b=outer.b * inner.b,
                               source=f"{outer.source}, on top of the adaptation to "
                                      f"{inner.device} ({inner.source})")


def _sequence(row: Row, checkpoint: bool = False) -> OperatorSequence | Path | onnx.ModelProto:
    """A row's model as the pricer takes it: a checkpoint's takes a config.json's as its
    exported graph (the GPU step model's front door exports it itself)."""
    if checkpoint and model_source.is_config(row.model):
        return model_source.config_graph_at(row.model, row.batch_size, row.seq_len,
                                            image_size=row.image_size)[0]
    if row.model.suffix != ".npz":
        return row.model
    seq = OperatorSequence.load_npz(row.model)
    if (batch := converted_batch(seq)) != row.batch_size:
        raise UsageError(f"{row.model}: a sequence converted at batch {batch}, but the row "
                         f"says batch_size {row.batch_size}")
    return seq


def _priced(measurements: str | Path, n: int, price):
    """`price()` for the row at index `n`; its model's or job's error names the CSV's line."""
    try:
        return price()
    except (MdotError, ConversionError) as e:  # in the CSV's column names
        text, field = in_fields(str(e))
        if field and text.startswith(field):
            text = f"column {field!r}" + text[len(field):]
        raise UsageError(f"{measurements} line {n + 2}: {text}") from None


def adapt_from_measurements(measurements: str | Path, base: str | Path | None, out: str | Path,
                            *, device: str | None = None, force: bool = False) -> Adaptation:
    """Writes to `out` the checkpoint `base` adapted to the rows of `measurements`; returns
    the fit (its leave-one-out error is the error to expect)."""
    from mdot_jax.gpu import spec_sheet

    rows = read_measurements(measurements)
    step_model = spec_sheet.step_model_dir(base)
    if step_model is not None:
        return _adapt_step_model(rows, measurements, step_model, out, device, force)
    given = sorted({c for r in rows for c, _ in r.job})
    if given:
        raise UsageError(f"{measurements}: column(s) {given} say how a GPU step model prices a "
                         "row; a checkpoint adapts the step it was trained on")
    base_path = resolve_checkpoint(base)
    out = checkpoint.prepare_out(out, force=force)
    predictor = Predictor.load(base_path)
    pred = [_priced(measurements, n, lambda r=r: predictor.predict(
        _sequence(r, checkpoint=True), batch_size=r.batch_size, image_size=r.image_size,
        seq_len=r.seq_len).iteration_ms) for n, r in enumerate(rows)]
    check_units(pred, rows, measurements, base_path.name)
    device = device or f"{predictor.devices[0]}-adapted-{Path(out).name}"
    adaptation = fit(pred, [r.ms for r in rows], device,
                     source=f"{Path(measurements).name}, base {base_path.name}",
                     workloads=[r.workload for r in rows])
    _write(base_path, out, compose(adaptation, predictor.adaptation))
    return adaptation


def _adapt_step_model(rows: list[Row], measurements: str | Path, base: Path, out: str | Path,
                      device: str | None, force: bool) -> Adaptation:
    """The GPU step model `base` adapted to measured rows of the catalogued GPU `device`: its
    prices of the rows (at their precision) fitted to their times; the folder carries the fit
    and the GPU it holds for."""
    from mdot_jax.gpu import catalog as gpus
    from mdot_jax.gpu import host, spec_sheet
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    if not device:
        raise UsageError("adapting the GPU step model: --device-name names the GPU the rows "
                         "were measured on (`mdot devices`)")
    gpu = gpus.find(device)
    model = spec_sheet.load_step_model(base)
    inner = Adaptation.from_json(model.info["adaptation"]) if model.info.get("adaptation") \
        else None
    if inner and inner.fit == "machine":
        raise UsageError(f"--base {base} is adapted to its GPU's kernels and host already: "
                         "adapt gpu-spec-sheet itself, with all the rows")
    out = checkpoint.prepare_out(out, force=force)
    precision = rows[0].precision or "fp32"
    pred, kernels = [], []  # each row priced as `mdot predict` prices it (its attention,
    with host.recording_kernels() as recorded:  # optimizer, host), and its kernels
        for n, r in enumerate(rows):
            job: dict[str, Any] = {c: v == "true" if JOB_COLUMNS[c] is FLAG else v
                                   for c, v in r.job}
            p = _priced(measurements, n, lambda r=r, job=job: predict(TrainingJob(
                model=_sequence(r), batch_size=r.batch_size, image_size=r.image_size,
                seq_len=r.seq_len, device=gpu.name, checkpoint=str(base), precision=precision,
                **job)))
            assert isinstance(p, Prediction)  # one batch size, one GPU count
            pred.append(p.iteration_ms)
            kernels.append(recorded[-1] if recorded else None)
            recorded.clear()
    check_units(pred, rows, measurements, f"{base.name} on the {gpu.name}")
    host_ms = model.host_ms("pytorch")  # the machine form prices the kernels as they ran
    whole = all(k is not None and math.isclose(host.launch_bound(k, host_ms), t, rel_tol=1e-6)
                for k, t in zip(kernels, pred))
    adaptation = fit(pred, [r.ms for r in rows], gpu.name,
                     source=f"{Path(measurements).name}, base {base.name}, {precision}",
                     workloads=[r.workload for r in rows],
                     kernels=kernels if whole and inner is None else None)
    adaptation = compose(adaptation, inner)
    adapted = dataclasses.replace(model, info=dict(  # the loaded model is shared: a copy
        model.info, adaptation=adaptation.to_json(), gpu=gpu.to_json(), precision=precision))
    checkpoint.save_step_model(adapted, out)
    return adaptation


def _write(base_path: Path, out: Path, adaptation: Adaptation) -> None:
    tmp = writers.temporary(out)
    shutil.copytree(base_path, tmp)
    checkpoint.attach_adaptation(tmp, adaptation.to_json())
    checkpoint.move_into_place(tmp, out)


def nearest_checkpoint(probe: dict[str, float], exclude: tuple[str, ...] = (),
                       cpu: bool = True) -> tuple[str, float]:
    """The shipped checkpoint (but those named in `exclude`) of a CPU (`cpu`) or a GPU whose
    device's probe (`dataset.probe` in its metadata) is nearest `probe`
    (`core_set.probe_distance`), with that distance. A CPU's times say little of a GPU's, so
    the kinds never mix: with no probe of the kind shipped, the first shipped checkpoint of
    the kind, at distance infinity."""
    from mdot_jax.measure.core_set import probe_distance
    from mdot_jax.measure.device import is_cpu
    from mdot_jax.storage.shipped import shipped_checkpoints

    scored = []
    for name in shipped_checkpoints():
        meta = checkpoint.read_metadata(resolve_checkpoint(name)).get("dataset", {})
        if name in exclude or is_cpu((meta.get("devices") or [""])[0]) != cpu:
            continue
        theirs = meta.get("probe")
        scored.append((probe_distance(probe, theirs) if theirs else float("inf"), name))
    if not scored:
        raise UsageError(f"no shipped checkpoint of a {'CPU' if cpu else 'GPU'} to adapt: "
                         "give --base")
    distance, name = min(scored, key=lambda s: s[0])  # ties: the first shipped
    return name, distance


def _check_base_kind(base: str | Path, on_cpu: bool) -> None:
    """`base` exists and predicts for the kind of device the probe runs on (a CPU's times say
    little of a GPU's)."""
    from mdot_jax.measure.device import is_cpu
    from mdot_jax.storage.shipped import checkpoint_devices

    resolve_checkpoint(base)
    devices = checkpoint_devices(base)
    if devices and any(map(is_cpu, devices)) != on_cpu:
        raise UsageError(f"--base {base} predicts for {', '.join(devices)}, but the probe runs "
                         f"on this machine's {'CPU' if on_cpu else 'GPU'}: give a "
                         f"{'CPU' if on_cpu else 'GPU'} checkpoint, or leave --base out")


def adapt_from_probe(root: str | Path, base: str | Path | None, out: str | Path, *,
                     threads: int = 2, device: str | None = None, force: bool = False,
                     budget_s: float = 0.0, protocol=None, keys: list[str] | None = None,
                     extra: list[str] | None = None,
                     progress: bool = True) -> tuple[Adaptation, str]:
    """Measures this machine's probe into the dataset folder `root` (what it holds is kept),
    then, while `budget_s` seconds of measuring (the probe's included) allow, more core-set
    samples (`core_set.adaptation_order`; those the folder already holds cost nothing), adapts
    `base` (default: the nearest shipped checkpoint by probe) to them all and writes the
    adapted checkpoint to `out`. Returns the fit and the base's name. `keys`, `extra`: another
    probe and other extra samples (tests)."""
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.measure import core_set
    from mdot_jax.measure.device import cuda_available
    from mdot_jax.measure.zoo import sample_exporter

    if base is not None:  # before minutes of measuring: a base that cannot serve
        _check_base_kind(base, on_cpu=not cuda_available())
    out = checkpoint.prepare_out(out, force=force)
    chosen = core_set.load()
    keys = keys or chosen["probe"]
    start = time.perf_counter()
    probe = core_set.run_probe(root, keys, threads, protocol=protocol)
    missing = [k for k in keys if k not in probe["ms"]]
    if len(probe["ms"]) < 2:
        raise UsageError(f"{root}: only {len(probe['ms'])} probe samples measured "
                         f"(noisy or skipped: {', '.join(missing)}); run again on an idle "
                         "machine")
    used = set(probe["ms"]) | _measure_within(
        root, core_set.adaptation_order(chosen) if extra is None else extra,
        budget_s - (time.perf_counter() - start), threads, protocol, progress)
    on_cpu = probe["fingerprint"].get("device_kind", "cpu") == "cpu"
    base_path = resolve_checkpoint(base or nearest_checkpoint(probe["ms"], cpu=on_cpu)[0])
    predictor = Predictor.load(base_path)
    samples = [s for s in load_dataset(root).samples if s.key in used]
    export = sample_exporter()  # the stored sequences are unfused: convert as the checkpoint
    pred = []
    for s in samples:
        tokens = s.seq.input_kind == "tokens"
        size = s.workload.input_size
        pred.append(predictor.predict(export(s), batch_size=s.workload.batch_size,
                                      seq_len=size if tokens else None,
                                      image_size=None if tokens else size).iteration_ms)
    device = device or f"{predictor.devices[0]}-adapted-{Path(out).name}"
    n_extra = len(samples) - len(probe["ms"])
    adaptation = fit(pred, [s.label_ms for s in samples], device,
                     source=f"probe of {root} ({len(probe['ms'])} samples) + {n_extra} more "
                            f"core-set samples, base {base_path.name}")
    _write(base_path, out, compose(adaptation, predictor.adaptation))
    return adaptation, base_path.name


FIRST_GUESS_S = 20.0  # the time of one sample, before any was measured in this run


def _measure_within(root: str | Path, keys: list[str], budget_s: float, threads: int,
                    protocol, progress: bool) -> set[str]:
    """The `keys` the folder `root` holds, measuring those it lacks in order while the next
    one fits in `budget_s` (at the mean time of those measured so far). Returns the `keys`
    held after."""
    from tqdm import tqdm

    from mdot_jax.data.dataset import has_samples, load_dataset
    from mdot_jax.measure.profiler import Protocol, profile
    from mdot_jax.measure.zoo import ZOOS

    held = {s.key for s in load_dataset(root).samples} if has_samples(root) else set()
    times: list[float] = []
    bar = tqdm(total=max(int(budget_s), 0), unit="s", desc="adapt: more samples",
               disable=not progress or budget_s <= 0)
    start = time.perf_counter()
    for key in keys:
        if key in held:
            continue
        elapsed = time.perf_counter() - start
        if elapsed + (np.mean(times) if times else FIRST_GUESS_S) > budget_s:
            break
        t0 = time.perf_counter()
        profile(list(ZOOS), [], [], root, threads=threads, keys=[key],
                protocol=protocol or Protocol(), speed_check=False, progress=False)
        times.append(time.perf_counter() - t0)
        bar.update(min(int(time.perf_counter() - start), bar.total) - bar.n)
    bar.close()
    return {s.key for s in load_dataset(root).samples} & set(keys)
