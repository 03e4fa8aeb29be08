"""Device identity: what a machine is (its fingerprint), what its measurements are filed
under (its slug), and whether anything else is running while it is measured."""

from __future__ import annotations

import os
import platform
import re
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


def fingerprint(threads: int, optimizer: str = "sgd") -> dict:
    import torch

    cuda = torch.cuda.is_available()
    chip = dict(device_model=torch.cuda.get_device_name(0)) if cuda else cpu_info()
    return dict(chip, device_kind="cuda" if cuda else "cpu", cores=os.cpu_count(),
                threads=threads, torch=torch.__version__.split("+")[0], precision="fp32",
                optimizer=optimizer, affinity=sorted(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity") else None, python=platform.python_version())


def device_slug(fp: dict) -> str:
    """Folder name for a device, e.g. `cpu-amd-epyc-f26m2-2t` (CPU family 26, model 2; where
    the fingerprint has them), `cuda-nvidia-geforce-rtx-3090-2t`."""
    model = re.sub(r"[^a-z0-9]+", "-", fp["device_model"].lower()).strip("-")
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


def device_folder(threads: int, optimizer: str = "sgd") -> Path:
    """This machine's dataset folder under `data_dir()`: its device slug (and the optimizer,
    where it is not the default: one optimizer per folder)."""
    suffix = "" if optimizer == "sgd" else f"-{optimizer}"
    return data_dir() / (device_slug(fingerprint(threads)) + suffix)
