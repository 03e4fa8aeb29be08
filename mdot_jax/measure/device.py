"""Device identity: what a machine is (its fingerprint), what its measurements are filed
under (its slug), and whether anything else is running while it is measured."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path


def cpu_info() -> dict:
    """The CPU as /proc/cpuinfo tells it: model name, and where the name is generic (a cloud
    VM's "AMD EPYC" covers several generations: labels measured on one ran 1.2-2.5x slower
    than on another) the family, model number, stepping and vector extensions that tell the
    generations apart."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    info = dict(device_model=fields.get("model name") or platform.processor()
                or platform.machine())
    if "cpu family" in fields:
        info.update(cpu_family=int(fields["cpu family"]), cpu_model_id=int(fields["model"]),
                    cpu_stepping=int(fields.get("stepping", 0) or 0),
                    cpu_isa=sorted(f for f in fields.get("flags", "").split()
                                   if re.match(r"(avx|amx|fma|f16c|sse4)", f)))
    return info


def cuda_available() -> bool:
    """Whether PyTorch sees a CUDA GPU here (what the profilers measure on)."""
    import torch

    return torch.cuda.is_available()


def fingerprint(threads: int, optimizer: str = "sgd", precision: str = "fp32") -> dict:
    """What the measurements of this machine are of: the chip (a CPU's family, model and
    vector extensions; a GPU's name, SMs, memory, L2, compute capability, CUDA, cuDNN and
    driver), threads, software, and the step's precision and optimizer."""
    import torch

    cuda = torch.cuda.is_available()
    chip = gpu_info() if cuda else cpu_info()
    return dict(chip, device_kind="cuda" if cuda else "cpu", cores=os.cpu_count(),
                threads=threads, torch=torch.__version__.split("+")[0], precision=precision,
                optimizer=optimizer, affinity=sorted(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity") else None, python=platform.python_version())


def gpu_info() -> dict:
    """The GPU as PyTorch and the driver tell it (clocks where nvidia-smi answers)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    info = dict(device_model=props.name, sms=props.multi_processor_count,
                memory_gb=round(props.total_memory / 1e9, 2),
                l2_mb=round(getattr(props, "L2_cache_size", 0) / 2 ** 20, 1),
                compute_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version())
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,"
                              "clocks.max.mem", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split(",")
        info.update(driver=out[0].strip(), max_sm_mhz=float(out[1]),
                    max_memory_mhz=float(out[2]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        pass
    return info


def device_slug(fp: dict) -> str:
    """Folder name for a device: `cpu-amd-epyc-f26m2-2t` (CPU family 26, model 2, where the
    fingerprint has them; 2 threads), `gpu-nvidia-h100-80gb-hbm3` (a GPU: its name)."""
    model = re.sub(r"[^a-z0-9]+", "-", fp["device_model"].lower()).strip("-")
    if fp["device_kind"] == "cuda":
        return f"gpu-{model}"
    model = re.sub(r"-(processor|cpu|with-radeon.*)$", "", model)
    chip = f"-f{fp['cpu_family']}m{fp['cpu_model_id']}" if "cpu_family" in fp else ""
    return f"{fp['device_kind']}-{model}{chip}-{fp['threads']}t"


def is_cpu(device: str) -> bool:
    """Whether a device name (a `device_slug`, or a dataset's device such as `rtx3090`) is a
    CPU's."""
    return device.startswith("cpu-")


# what must agree for two samples to be of one device
DEVICE_KEYS = ("device_model", "cpu_family", "cpu_model_id", "cpu_stepping", "cpu_isa",
               "threads")


def others_running(threads: int) -> float | None:
    """Runnable threads on this machine besides our `threads` (Linux `procs_running`), or
    None where the kernel does not say."""
    try:
        with open("/proc/stat") as f:
            running = next(int(ln.split()[1]) for ln in f if ln.startswith("procs_running"))
    except (OSError, StopIteration, ValueError):
        return None
    return float(max(0, running - threads))


def _sample_load(into: list[float], threads: int) -> None:
    into.append(others_running(threads) or 0.0)


def data_dir() -> Path:
    """Where measurements go unless a folder is named: `$MDOT_DATA`, else the per-user data
    directory (`$XDG_DATA_HOME/mdot`, by default `~/.local/share/mdot`); never the working
    directory."""
    if os.environ.get("MDOT_DATA"):
        return Path(os.environ["MDOT_DATA"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                          "share")
    return Path(base) / "mdot"


def device_folder(threads: int, optimizer: str = "sgd", precision: str = "fp32",
                  layout: str = "nchw") -> Path:
    """This machine's dataset folder under `data_dir()`: its device slug, and the precision,
    layout and optimizer where they are not the defaults (one of each per folder)."""
    suffix = "".join(f"-{v}" for v, default in ((precision, "fp32"), (layout, "nchw"),
                                                (optimizer, "sgd")) if v != default)
    return data_dir() / (device_slug(fingerprint(threads)) + suffix)
