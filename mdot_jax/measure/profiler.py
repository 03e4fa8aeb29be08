"""`mdot profile`: measure real training iterations of zoo models on the machine at hand.

Measurement protocol:
- one iteration = forward (train mode) + cross-entropy + backward + SGD step (momentum 0.9,
  nesterov, as timm's benchmark), fp32, inputs in place; threads fixed; CUDA synchronised;
- `warmup` untimed iterations, then `repeats` timed: the label is the median, the spread
  IQR and CV (std / mean, %) with every raw time; a warm-up slower than `max_iter_s` skips
  the sample as `too_slow` (and the larger batches of that model and size); repeats past
  `budget_s` are fewer (never under 3); what cannot train (BatchNorm at batch 1, an input
  too small, out of memory) goes to `report.json` with the reason, not raised;
- every sample carries the device fingerprint; a dataset folder holds one device: appending
  from another CPU/GPU model is refused (start a new folder).
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from converters import convert
from mdot_jax.data import dataset as data
from mdot_jax.data.dataset import Sample, Workload, load_dataset
from mdot_jax.data.store import DatasetWriter, SkipLog, writer_lock
from mdot_jax.errors import RequestError
from mdot_jax.measure.device import DEVICE_KEYS, _sample_load, device_slug, fingerprint
from mdot_jax.measure.zoo import ZooModel, _export, _inputs, find_model, zoo_models
from mdot_jax.options import LAYOUTS, MEASURED_PRECISIONS
from mdot_jax.options import MEASURED_OPTIMIZERS as OPTIMIZERS

# ---------------------------------------------------------------------------- measurement
BUSIEST = 30  # kernels (ATen operators on a CPU) of a profiled step kept, by time
CALLERS = 40  # ATen operators and autograd's backward functions kept, by what they ran
# a CUDA kernel's class by its name, first match (cuBLAS, cuDNN, FlashAttention, PyTorch's own)
KERNEL_CLASSES = (
    ("generated", r"^triton_"),  # torch.compile's (Inductor's Triton kernels)
    ("attention", r"flash|fmha|attention"),
    ("depthwise conv", r"depthwise|dwconv"),
    ("conv", r"conv|fprop|dgrad|wgrad|implicit_gemm|cudnn::(?!bn_)"),
    ("gemm", r"gemm|xmma|cutlass|s16816|s1688|sm\d+_.*_tn|splitk|nvjet"),
    ("batch norm", r"batch_norm|bn_fw|bn_bw|welford"),
    ("layer norm", r"layer_norm|layernorm|rms_norm"),
    ("softmax", r"softmax"),
    ("optimizer", r"multi_tensor_apply|foreach|adam"),
    ("layout", r"nchwtonhwc|nhwctonchw|transpose|permute"),
    ("reduction", r"reduce_kernel|reduce"),
    ("copy", r"memcpy|memset|copy|cat|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
)


def is_annotation(name: str) -> bool:
    """Whether a GPU event is a range the code marked (`Optimizer.step#AdamW.step`), not a
    kernel: kit traces to the H100's third lease counted such spans as kernels too."""
    return "#" in name


def kernel_class(name: str) -> str:
    """The class of a CUDA kernel by its name (`KERNEL_CLASSES`), else "other"."""
    low = name.lower()
    return next((c for c, pattern in KERNEL_CLASSES if re.search(pattern, low)), "other")


@dataclass(frozen=True)
class Protocol:
    warmup: int = 2
    repeats: int = 5
    min_repeats: int = 3
    max_iter_s: float = 4.0  # a steady-state iteration slower than this: skip as too slow
    budget_s: float = 25.0  # timed repeats of one sample stay within this
    first_iter_slack: float = 4.0  # the first warm-up (allocation, kernel set-up) may take this
    # many times max_iter_s before the sample is skipped; later ones decide
    max_cv: float = 15.0  # repeats that vary more (percent): the sample is noisy
    max_others: float = 0.5  # other runnable threads on average during the repeats: noisy
    optimizer: str = "sgd"  # one of OPTIMIZERS: what the training step updates with
    precision: str = "fp32"  # one of MEASURED_PRECISIONS
    layout: str = "nchw"  # nhwc: image models and inputs in channels-last memory format
    trace: bool = False  # one more step under the profiler: its kernels in the stats (`profiled`)

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r}: choose from nchw, nhwc")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r}: choose from {list(OPTIMIZERS)}")
        if self.precision not in MEASURED_PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: choose from "
                             f"{list(MEASURED_PRECISIONS)}")


def precision_context(precision: str, device: str, torch) -> Callable:
    """Sets TF32 as `precision` says, explicitly (matmuls only at `tf32`; convolutions as
    PyTorch's default lets them), and returns the context that runs a forward pass at it:
    `torch.autocast` to the half type at an AMP precision."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True
    half = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)
    return partial(torch.autocast, device_type=device, dtype=half or torch.float32,
                   enabled=half is not None)


def training_step(model, x, target, optimizer: str, precision: str, device: str, torch,
                  layout: str = "nchw") -> Callable[[], None]:
    """One training iteration of `model` as a callable: forward (`precision_context`), cross-
    entropy loss, backward (scaled for fp16), the optimizer's step; `nhwc`: channels-last."""
    autocast = precision_context(precision, device, torch)
    if layout == "nhwc" and x.dim() == 4:
        model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(device) if precision == "amp-fp16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            out = model(x)
            out = out[0] if isinstance(out, (tuple, list)) else out
            loss = loss_fn(out.reshape(out.shape[0], -1).float(), target)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return step


def measure_step(model, x, target, protocol: Protocol, device: str,
                 after_step: Callable[[], None] | None = None,
                 trace: dict | None = None) -> list[float]:
    """Times training iterations; returns the per-iteration milliseconds of the repeats, and
    calls `after_step` after each timed one (e.g. to sample the machine's load); `trace`
    receives what one more iteration issues (`profiled`), when the protocol traces.

    Raises `TooSlow` when a warm-up iteration past the first exceeds `protocol.max_iter_s`
    (the first, which pays for allocation and kernel set-up, only beyond `first_iter_slack`
    times that, or when it is the only warm-up)."""
    import torch

    step = training_step(model, x, target, protocol.optimizer, protocol.precision, device,
                         torch, protocol.layout)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    last = 0.0
    for i in range(protocol.warmup):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        last = time.perf_counter() - t0
        first = i == 0 and protocol.warmup > 1
        if last > protocol.max_iter_s * (protocol.first_iter_slack if first else 1.0):
            raise TooSlow(f"{last:.1f}s per iteration > {protocol.max_iter_s}s")
    repeats = int(min(protocol.repeats, max(protocol.min_repeats,
                                            protocol.budget_s // max(last, 1e-9))))
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        if after_step:
            after_step()
    if protocol.trace and trace is not None:
        trace.update(profiled(step, device))
    return times


def profiled(step: Callable[[], None], device: str) -> dict:
    """What the host issues in one more `step`, under PyTorch's profiler (after the timed
    ones): `launches`, the kernel launch calls (None on a CPU); `kernels`, what ran on the GPU
    (kernels, copies and sets); `aten_ops`, the ATen operators dispatched, nested ones
    included; `gpu_ms`, the GPU's busy time (its kernels' own times summed); and `busiest`,
    the `BUSIEST` kernels by time (name, count, ms; on a CPU the ATen operators by their own
    host time); `callers`, the `CALLERS` ATen operators and backward functions by the time
    of what they ran, nested calls included (name, count, ms: the GPU's, on a CPU the host's);
    on a GPU `by_class`, every kernel summed by its class (`kernel_class`: count, ms). A
    profiler that fails (no CUPTI in a container, memory) says so in `trace_error`, never
    losing the step measured before it. Ranges the code marks on the GPU (`is_annotation`)
    are not kernels: left out. CUPTI is torn down after each trace (`TEARDOWN_CUPTI`, unless
    set otherwise): left attached it slows every later launch (pytorch/pytorch#144455)."""
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    try:
        with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
        events = prof.key_averages()
    except Exception as e:  # noqa: BLE001 - the trace is extra; the timed step stands
        return dict(trace_error=f"{type(e).__name__}: {str(e)[:200]}")
    if cuda:  # the kernels, by their own GPU time (not the ranges code marked on the GPU)
        timed = [(e.key, e.count, e.self_device_time_total / 1e3) for e in events if e.device_type
                 == torch.autograd.DeviceType.CUDA and not is_annotation(e.key)]
    else:  # the ATen operators, by their own host time
        timed = [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in events
                 if e.key.startswith("aten::")]
    timed.sort(key=lambda x: -x[2])
    calls = sorted(((e.key.removeprefix("autograd::engine::evaluate_function: ")[:100], e.count,
                     (e.device_time_total if cuda else e.cpu_time_total) / 1e3) for e in events
                    if e.key.startswith(("aten::", "autograd::engine"))), key=lambda x: -x[2])
    by_class: dict[str, list] = {}
    for name, n, t in timed if cuda else ():
        c = by_class.setdefault(kernel_class(name), [0, 0.0])
        c[0], c[1] = c[0] + n, c[1] + t
    return dict(launches=sum(e.count for e in events if "LaunchKernel" in e.key) if cuda
                else None, kernels=sum(n for _, n, _ in timed) if cuda else None,
                aten_ops=sum(e.count for e in events if e.key.startswith("aten::")),
                gpu_ms=sum(t for *_, t in timed) if cuda else None,
                busiest=[[name[:100], n, round(t, 4)] for name, n, t in timed[:BUSIEST]],
                callers=[[name, n, round(t, 4)] for name, n, t in calls[:CALLERS]],
                **({"by_class": {k: [n, round(t, 4)] for k, (n, t) in by_class.items()}}
                   if cuda else {}))


def peak_memory(arch: str, size: int, batch: int, steps: int = 2,
                optimizer: str = "sgd", precision: str = "fp32") -> dict:
    """The peak memory of training steps of the zoo model `arch` (with `optimizer`, as
    `measure_step`), in bytes above what the process held before its inputs and model were
    made: CUDA's `max_memory_allocated` on a GPU; on a CPU the peak resident set (Linux's
    VmHWM, reset first). Run it in a fresh process: a CPU peak is the process's."""
    import torch

    m = find_model(arch)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # what the process does once, whatever the model: import the model's code (built on the
    # meta device: no memory), start autograd and the kernel libraries (one tiny step)
    try:
        with torch.device("meta"):
            m.build(size)
    except Exception:  # noqa: BLE001 - a model the meta device cannot build: counted in full
        pass
    tiny = torch.nn.Linear(8, 8).to(device)
    tiny(torch.ones(2, 8, device=device)).sum().backward()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak resident set
        base = _proc_status("VmRSS")
    x, target = _inputs(m, size, batch, device, torch)
    model = m.build(size).to(device).train()
    step = training_step(model, x, target, optimizer, precision, device, torch)
    for _ in range(steps):
        step()
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _proc_status("VmHWM")
    return dict(arch=arch, size=size, batch=batch, device=device, peak_bytes=peak - base)


def _proc_status(field: str) -> int:
    """A size from /proc/self/status, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


class TooSlow(RuntimeError):
    pass


def stats_of(times_ms: list[float]) -> dict:
    arr = np.asarray(times_ms)
    q75, q25 = np.percentile(arr, [75, 25])
    return dict(repeats=len(arr), times_ms=[round(t, 3) for t in times_ms],
                median_ms=float(np.median(arr)), iqr_ms=float(q75 - q25),
                cv=float(100.0 * arr.std() / arr.mean()))


def _reason(e: BaseException) -> str:
    msg = str(e)
    if "Expected more than 1 value per channel" in msg:
        return "batchnorm_batch1"
    if "out of memory" in msg.lower():
        return "out_of_memory"
    if re.search(r"(too small|smaller than|Output size is too small|kernel size can't be "
                 r"greater)", msg, re.I):
        return "input_too_small"
    return "cannot_train"


def check_precision(device: str, precision: str) -> None:
    """Refuses a precision `device` cannot run: its labels would name what never ran."""
    if device == "cpu" and precision == "tf32":
        raise RequestError("precision tf32: a GPU's tensor-core format; a CPU multiplies in "
                           "fp32 (profile at fp32)", "precision")


def profile(zoos: list[str], batch_sizes: list[int], sizes: list[int], out: str | Path, *,
            seq_lens: list[int] | None = None, threads: int = 2, models: list[str] | None
            = None, protocol: Protocol = Protocol(), retry_skipped: bool = False,
            retry_noisy: bool = False, speed_check: bool = True, keys: Sequence[str] | None
            = None, progress: bool = True) -> dict:
    """Measures every (model, size, batch size) not already in `out` (nor skipped before,
    unless `retry_skipped`, nor measured noisy before, unless `retry_noisy`); returns the
    report. One writer at a time: a second one is refused (`writer_lock`). Before appending
    to a folder, `speed_check` measures a few of its samples again (`_check_same_speed`).

    `sizes` are image sides for image models; `seq_lens` (default `sizes`) sequence lengths
    for text models. `keys` (`model/i64/b8`, `model/t32/b8`: the core set, the probe) replace
    the product of models, sizes and batch sizes.
    """
    import torch
    from tqdm import tqdm

    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check_precision(device, protocol.precision)
    fp = dict(fingerprint(threads, protocol.optimizer, protocol.precision),
              layout=protocol.layout)
    root = Path(out)
    zoo = zoo_models(zoos)
    unknown = sorted(set(models or ()) - {m.name for m in zoo})
    if unknown:
        names = [m.name for m in zoo]
        hints = {u: difflib.get_close_matches(u, names, n=3) for u in unknown}
        raise ValueError("unknown model(s) in the " + ",".join(zoos) + " zoo: " + "; ".join(
            f"{u}" + (f" (did you mean {', '.join(h)}?)" if h else "") for u, h in hints.items()))
    with writer_lock(root):
        _check_same_device(root, fp)
        writer = DatasetWriter(root)
        report = SkipLog(root)
        entries = [m for m in zoo if models is None or m.name in models]
        jobs = [(m, s, b) for m in entries  # each size and batch once, however often given
                for s in dict.fromkeys(m.sizes or (sizes if m.kind == "image"
                                                   else (seq_lens or sizes)))
                for b in sorted(set(batch_sizes))]
        if keys is not None:
            jobs = _jobs_of_keys(keys, {m.name: m for m in zoo})

        def key(m, s, b):
            return f"{m.name}/{m.kind[0]}{s}/b{b}"

        todo = [j for j in jobs if key(*j) not in writer.done
                and (retry_skipped or key(*j) not in report.skipped)
                and (retry_noisy or key(*j) not in writer.noisy)]
        if speed_check and todo:
            _check_same_speed(root, {m.name: m for m in zoo}, protocol, device, torch)
        bar = tqdm(total=len(todo), unit="sample", disable=not progress, desc=f"profile {device}")
        by_model_size: dict[tuple, list[int]] = {}
        for m, s, b in todo:
            by_model_size.setdefault((m, s), []).append(b)
        for (m, s), batches in by_model_size.items():
            _profile_model_size(m, s, batches, key, writer, report, fp, device, protocol, torch,
                                bar)
            report.write(samples=len(writer.done), noisy=len(writer.noisy), fingerprint=fp)
        bar.close()
        return report.write(samples=len(writer.done), noisy=len(writer.noisy), fingerprint=fp)


def _jobs_of_keys(keys: Sequence[str], zoo: dict[str, ZooModel]) -> list[tuple]:
    """(model, size, batch) of sample keys `name/<i|t><size>/b<batch>`; unknown models named."""
    jobs, unknown = [], []
    for k in keys:
        match = re.fullmatch(r"(.+)/[ita](\d+)/b(\d+)", k)
        if match is None or match[1] not in zoo:
            unknown.append(k)
        else:
            jobs.append((zoo[match[1]], int(match[2]), int(match[3])))
    if unknown:
        raise ValueError(f"sample key(s) of no model in the zoos: {', '.join(unknown[:5])}")
    return jobs


SPEED_TOLERANCE = 0.15  # a folder's samples measured again must stay within this (median)


def _check_same_speed(root: Path, zoo: dict[str, ZooModel], protocol: Protocol, device: str,
                      torch, n: int = 7) -> None:
    """Measures `n` of the folder's samples again (spread over its keys, labels of 20 ms to
    1 s, so that the check costs seconds and is not lost in timer noise; several, since one
    sample measured again can land 20% off on a busy host while the machine's speed has not
    changed: benchmarks/results/label-repeat-*) and refuses to append
    when their median ratio to the labels moved by more than SPEED_TOLERANCE: a CPU of the
    same family at another clock, throttled, or shared with another job. Folders without
    such samples are not checked."""
    if not data.has_samples(root):
        return
    pool = sorted((s for s in load_dataset(root).samples
                   if s.arch in zoo and 20 <= s.label_ms <= 1000), key=lambda s: s.key)
    picked = pool[:: max(1, len(pool) // n)][:n]
    ratios = []
    for s in picked:
        m, w = zoo[s.arch], s.workload
        model = m.build(w.input_size).to(device)
        x, target = _inputs(m, w.input_size, w.batch_size, device, torch)
        ratios.append(float(np.median(measure_step(model, x, target, protocol, device)))
                      / s.label_ms)
    if ratios and abs(float(np.median(ratios)) - 1) > SPEED_TOLERANCE:
        shown = ", ".join(f"{s.key} x{r:.2f}" for s, r in zip(picked, ratios))
        raise ValueError(f"{root}: this machine runs its samples at {shown} of their labels "
                         f"(more than {SPEED_TOLERANCE:.0%} off): another device, or a busy "
                         "one; profile into a new folder, or wait until the machine is idle")


def _check_same_device(root: Path, fp: dict) -> None:
    """Refuses to append to a folder measured on another device: another CPU/GPU model,
    family, model number, stepping, vector extensions or thread count; or a CPU folder
    whose samples do not record the family (measured before it was recorded), since
    then nobody can tell."""
    if not data.has_samples(root):
        return
    theirs = [s.meta.get("fingerprint", {}) for s in load_dataset(root).samples]
    for what, default in (("optimizer", "sgd"), ("precision", "fp32"), ("layout", "nchw")):
        other = {t.get(what, default) for t in theirs} - {fp.get(what, default)}
        if other:
            raise ValueError(f"{root} holds samples of {what} {', '.join(sorted(other))}, "
                             f"this run's is {fp.get(what)}: one {what} per folder; profile "
                             "into a new dataset folder")
    for k in DEVICE_KEYS:
        other = {json.dumps(t.get(k)) for t in theirs} - {json.dumps(fp.get(k))}
        if other:
            raise ValueError(
                f"{root} holds samples measured with {k} {', '.join(sorted(other))}, this "
                f"machine has {json.dumps(fp.get(k))}: profile into a new dataset folder "
                f"(default: {device_slug(fp)} in the data folder)")


def _profile_model_size(m: ZooModel, size, batches, key, writer, report, fp, device, protocol,
                        torch, bar) -> None:
    before = torch.cuda.memory_allocated() if device == "cuda" else 0  # (the last model freed)

    def seq_key_of(b: int) -> str:
        return f"{m.name}-{m.kind[0]}{size}-b{b}"

    try:
        model = m.build(size).to(device)
        # exported only where a sequence is missing (a resumed run, or one given the
        # sequences of the same graphs measured at another precision, has them)
        proto = None if all(writer.has_seq(seq_key_of(b)) for b in batches) \
            else _export(m, model, size, torch, device)
    except Exception as e:  # noqa: BLE001 - recorded in report.json, not raised
        for b in batches:
            report.skip(key(m, size, b), "build_or_export_failed", f"{type(e).__name__}: {e}")
        bar.update(len(batches))
        return
    too_slow = None
    for b in batches:
        k = key(m, size, b)
        bar.set_postfix_str(k)
        if too_slow:
            report.skip(k, "too_slow", f"a smaller batch was already too slow ({too_slow})")
            bar.update()
            continue
        try:
            seq_key = seq_key_of(b)
            if not writer.has_seq(seq_key):
                writer.save_seq(seq_key, convert(proto, name=m.name, batch_size=b))
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            x, target = _inputs(m, size, b, device, torch)
            load: list[float] = []  # other runnable threads, after each timed iteration
            trace: dict = {}
            times = measure_step(model, x, target, protocol, device,
                                 after_step=partial(_sample_load, load, fp["threads"]),
                                 trace=trace)
        except TooSlow as e:
            too_slow = str(e)
            report.skip(k, "too_slow", too_slow)
        except Exception as e:  # noqa: BLE001 - recorded in report.json, not raised
            report.skip(k, _reason(e), f"{type(e).__name__}: {e}")
        else:
            st = stats_of(times)
            st["others_running"] = float(np.mean(load)) if load else 0.0
            st["noisy"] = st["cv"] > protocol.max_cv or st["others_running"] > protocol.max_others
            if device == "cuda":  # the step's peak, as `peak_memory` counts it
                st["peak_mb"] = (torch.cuda.max_memory_allocated() - before) / 1e6
            if trace:
                st["trace"] = trace
            report.skipped.pop(k, None)  # measured on a retry
            writer.append(Sample(
                key=k, arch=m.name, seq_path=f"seqs/{seq_key}.npz",
                workload=Workload(batch_size=b, input_size=size,
                                  precision=protocol.precision, layout=protocol.layout,
                                  device=device_slug(fp), optimizer=protocol.optimizer),
                label_ms=st["median_ms"], stats=st,
                meta=dict(fingerprint=fp, kind=m.kind,
                          measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))))
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        bar.update()
