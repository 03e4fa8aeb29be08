"""The GPU catalog: NVIDIA GPUs described by their spec sheets (`gpus.json`, package data,
versioned), so that a GPU can be named (`mdot predict --device nvidia-h100-sxm`, `mdot
devices`) or described (`--device-spec FILE.json`) without having been measured.

Every row names its public source (a datasheet or an architecture whitepaper). Peak FLOP/s
are dense (no structured sparsity): `fp32` on the CUDA cores; `tf32`, `fp16`, `bf16`, `fp8` on the
tensor cores, null where the GPU has none for that precision. `power_w`: the board's maximum
power on the same datasheet (what caps its clocks under a long kernel: the two A100 PCIe cards
share a spec sheet but not a power limit). A node holds `node_gpus`: an HGX board's 8, or
the GPUs one NVLink fabric joins past them (`nvlink_gpus`: an NVL72 rack's 72).
`network_gbs`: what joins a node of the GPU's reference system (its DGX, else one its source
names) to the others, its compute NICs together, per direction (0: no such system), the
default between nodes (`--network-gbs` says otherwise). `host_gbs`: the memory bandwidth of that
system's host CPUs (their DDR channels at their rated transfer rate), where a step offloads
the optimizer to the host (`gpu.offload`; `--host-gbs` says otherwise).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from mdot_jax.options import ARITHMETIC

CATALOG_FILE = Path(__file__).with_name("gpus.json")
# what measured shares are kept by (fused attention's, say), with its first compute
# capability: a spec's name near one of these is a typo; another is one measured nowhere
# (`rtx-blackwell`: the GeForce and RTX PRO parts, sm_120, whose tensor cores are not the B200's)
ARCHITECTURES = {"pascal": "6.0", "volta": "7.0", "turing": "7.5", "ampere": "8.0",
                 "ada": "8.9", "hopper": "9.0", "blackwell": "10.0", "rtx-blackwell": "12.0"}
# each field's unit and the range a GPU's value lies in, a few times beyond any GPU either way
# (a B200: 148 SMs, 8 TB/s, 180 GB, 2.25 PFLOP/s dense fp16): outside it, a unit slipped (GHz
# for MHz, TB/s for GB/s, MB for GB, CUDA cores for SMs). 0 says an optional field is absent.
RANGES = {"sms": ("streaming multiprocessors (not CUDA cores)", 1, 1_000),
          "boost_mhz": ("MHz", 300, 5_000), "memory_gb": ("GB", 0.1, 4_096),
          "memory_gbs": ("GB/s", 50, 100_000), "l2_mb": ("MB", 0.25, 1_024),
          "nvlink_gbs": ("GB/s", 10, 20_000), "pcie_gbs": ("GB/s", 1, 1_000),
          "network_gbs": ("GB/s", 1, 10_000), "host_gbs": ("GB/s", 1, 100_000),
          "power_w": ("W", 10, 5_000),
          "nvlink_gpus": ("GPUs", 2, 1_000),
          "tflops": ("TFLOP/s", 0.1, 100_000)}
COUNTS = ("sms", "nvlink_gpus")  # whole numbers
NODE_GPUS = 8  # GPUs an HGX board or DGX system holds (A100, H100, H200, B200; DGX-1)
# a datasheet's peak with structured sparsity is twice the dense one: a tensor peak an SM a
# clock this far above every catalogued GPU of its architecture is taken for it
SPARSE = 1.5
# FP32 CUDA cores per SM by compute capability (the architecture whitepapers)
CORES_PER_SM = {"6.0": 64, "6.1": 128, "7.0": 64, "7.5": 64, "8.0": 64, "8.6": 128, "8.9": 128,
                "9.0": 128, "10.0": 128, "10.3": 128, "12.0": 128}


@dataclass(frozen=True)
class GPU:
    name: str  # e.g. nvidia-h100-sxm
    architecture: str
    sms: int
    boost_mhz: float
    memory_gb: float
    memory_gbs: float  # memory bandwidth, GB/s
    l2_mb: float
    tflops: dict  # precision -> dense peak TFLOP/s, or None
    nvlink_gbs: float = 0.0  # per GPU, both directions
    pcie_gbs: float = 0.0  # x16 link, both directions
    network_gbs: float = 0.0  # a node of its reference system to the others, per direction
    host_gbs: float = 0.0  # its reference system's host memory bandwidth, a node
    nvswitch: bool = False  # every GPU of a board reaches the others by NVLink (SXM boards)
    nvlink_gpus: int = 0  # GPUs one NVLink fabric joins past a board's 8 (an NVL72 rack's 72)
    power_w: float = 0.0  # the board's maximum power on its datasheet (0: not published)
    aliases: tuple[str, ...] = ()
    compute_capability: str = ""
    memory_type: str = ""
    source: str = ""
    note: str = ""
    spec_file: str = field(default="", compare=False)  # set when described by --device-spec

    @property
    def capability(self) -> float:
        """Its compute capability, else its architecture's first (0: neither known)."""
        return float(self.compute_capability or ARCHITECTURES.get(self.architecture, 0))

    @property
    def node_gpus(self) -> int:
        """GPUs a node of it holds (the module docstring)."""
        return self.nvlink_gpus or NODE_GPUS

    @property
    def cores_per_sm(self) -> int | None:
        return CORES_PER_SM.get(self.compute_capability)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "spec_file"}
        return dict(d, aliases=list(self.aliases))


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower().removeprefix("nvidia"))


def _number(v) -> bool:
    """A finite int or float (JSON's NaN and Infinity are not; neither is a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _from_json(d: dict, where: str) -> GPU:
    """A catalog row or a `--device-spec` file; a missing, unknown or ill-typed field is a
    one-line ValueError naming it."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a JSON object describing one GPU")
    known = {f.name for f in fields(GPU)} - {"spec_file"}
    d = {k: v for k, v in d.items() if v is not None}  # null: as if not given
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    required = ("name", "architecture", "sms", "boost_mhz", "memory_gb", "memory_gbs", "l2_mb",
                "tflops")
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    for k in ("sms", "boost_mhz", "memory_gb", "memory_gbs", "l2_mb", "nvlink_gbs", "pcie_gbs",
              "network_gbs", "host_gbs", "power_w", "nvlink_gpus"):
        v = d.get(k, 0)
        unit, low, high = RANGES[k]
        if not (_number(v) and (low <= v <= high or (v == 0 and k not in required))
                and (v == int(v) or k not in COUNTS)):
            raise ValueError(f"{where}: '{k}' is {v!r}; expected {low:g} to {high:g} {unit}"
                             + (", a whole number" if k in COUNTS else "")
                             + ("" if k in required else " (0: none)"))
    if d.get("nvlink_gbs", 0) > 0 and not isinstance(d.get("nvswitch"), bool):
        raise ValueError(f"{where}: 'nvswitch' is {d.get('nvswitch')!r}; with 'nvlink_gbs' "
                         "say true where every GPU of a board reaches the others by NVLink "
                         "(SXM boards), false where bridges join pairs of cards")
    if d.get("nvlink_gpus", 0) and not (d.get("nvlink_gbs", 0) > 0 and d.get("nvswitch")):
        raise ValueError(f"{where}: 'nvlink_gpus' is {d['nvlink_gpus']!r}: an NVLink fabric "
                         "joining that many GPUs needs 'nvlink_gbs' and 'nvswitch' true")
    if not (isinstance(d["name"], str) and d["name"].strip()):
        raise ValueError(f"{where}: 'name' is {d['name']!r}; expected the GPU's name")
    for k in ("memory_type", "note", "source"):
        if not isinstance(d.get(k, ""), str):
            raise ValueError(f"{where}: '{k}' is {d[k]!r}; expected text")
    aliases = d.get("aliases", [])
    if not (isinstance(aliases, (list, tuple)) and all(isinstance(a, str) and a.strip()
                                                       for a in aliases)):
        raise ValueError(f"{where}: 'aliases' is {aliases!r}; expected a list of names")
    if not isinstance(d.get("nvswitch", False), bool):
        raise ValueError(f"{where}: 'nvswitch' is {d['nvswitch']!r}; expected true or false")
    arch = d["architecture"]
    if not isinstance(arch, str) or not arch.strip():
        raise ValueError(f"{where}: 'architecture' is {arch!r}; expected a name such as "
                         "'hopper'")
    arch = arch.strip().lower()
    near = difflib.get_close_matches(arch, ARCHITECTURES, n=1, cutoff=0.75)
    if near and near[0] != arch:
        raise ValueError(f"{where}: 'architecture' is {d['architecture']!r}: did you mean "
                         f"{near[0]!r}? (known: {', '.join(ARCHITECTURES)}; another name is an "
                         "architecture nothing was measured on)")
    cc = d.get("compute_capability", "")
    if not (isinstance(cc, str) and re.fullmatch(r"(\d+\.\d+)?", cc)):
        raise ValueError(f"{where}: 'compute_capability' is {cc!r}; expected major.minor as "
                         "a string, such as \"9.0\"")
    flops = d["tflops"]
    if not isinstance(flops, dict) or not _number(flops.get("fp32")) or flops["fp32"] <= 0:
        raise ValueError(f"{where}: 'tflops' needs at least a positive 'fp32' (TFLOP/s)")
    bad = sorted(set(flops) - set(ARITHMETIC))
    if bad:
        raise ValueError(f"{where}: 'tflops' has unknown precision(s) {bad}; known: "
                         f"{list(ARITHMETIC)}")
    unit, low, high = RANGES["tflops"]
    for p, v in flops.items():
        if v is not None and not (_number(v) and low <= v <= high):
            raise ValueError(f"{where}: 'tflops.{p}' is {v!r}; expected {low:g} to {high:g} "
                             f"{unit}, or null")
    gpu = GPU(**dict(d, architecture=arch, tflops={p: flops.get(p) for p in ARITHMETIC},
                     aliases=tuple(d.get("aliases", ()))))
    _check_fp32(gpu, where)
    return gpu


def _per_sm_clock(gpu: GPU, tflops: float) -> float:
    """`tflops` as FLOPs an SM a clock of `gpu`."""
    return tflops * 1e6 / (gpu.sms * gpu.boost_mhz)


def _check_fp32(gpu: GPU, where: str) -> None:
    """The fp32 peak is 2 FLOPs a CUDA core a clock: a ValueError where `sms`, `boost_mhz` and
    `tflops.fp32` disagree by more than half again (one of them in another unit)."""
    cores = gpu.cores_per_sm
    low, high = (cores, cores) if cores else (min(CORES_PER_SM.values()),
                                               max(CORES_PER_SM.values()))
    rate = _per_sm_clock(gpu, gpu.tflops["fp32"])
    if not 2 * low / 1.5 <= rate <= 2 * high * 1.5:
        cores_text = f"{cores}" if cores else f"{low}-{high}"
        expected = 2 * gpu.sms * gpu.boost_mhz * (cores or high) / 1e6
        raise ValueError(
            f"{where}: 'tflops.fp32' is {gpu.tflops['fp32']:g} but {gpu.sms} SMs at "
            f"{gpu.boost_mhz:g} MHz with {cores_text} FP32 cores an SM give "
            f"{'up to ' if not cores else ''}{expected:.3g} TFLOP/s (2 FLOPs a core a clock): "
            "one of 'tflops' (TFLOP/s), 'sms' (SMs) or 'boost_mhz' (MHz) is in another unit")


def _check_dense(gpu: GPU, where: str) -> None:
    """A ValueError where a tensor peak an SM a clock is more than `SPARSE` times the highest
    of the catalogued GPUs of its architecture: the datasheet's figure with sparsity."""
    kin = [g for g in catalog().values() if g.architecture == gpu.architecture]
    for p, v in gpu.tflops.items():
        rates = [(_per_sm_clock(g, g.tflops[p]), g.name) for g in kin if g.tflops.get(p)]
        if p == "fp32" or not (v and rates):
            continue
        (top, name), rate = max(rates), _per_sm_clock(gpu, v)
        if rate > SPARSE * top:
            raise ValueError(
                f"{where}: 'tflops.{p}' is {v:g}, {rate / top:.1f}x the "
                f"{p} FLOPs an SM a clock of any {gpu.architecture} GPU in the catalog "
                f"({name}: {top:.0f}): the datasheet's figure with sparsity? Give the dense "
                "peak (half of it)")


def catalog() -> dict[str, GPU]:
    """Every catalogued GPU by name."""
    return dict(_catalog())


@functools.cache
def _catalog() -> dict[str, GPU]:
    doc = json.loads(CATALOG_FILE.read_text())
    return {d["name"]: _from_json(d, f"{CATALOG_FILE.name} {d.get('name')}")
            for d in doc["gpus"]}


@functools.cache
def _names() -> dict[str, str]:
    """Each catalogued GPU's name by the `_key` of its name and of each alias (the first GPU
    holding a key, in the catalog's order)."""
    names: dict[str, str] = {}
    for g in _catalog().values():
        for text in (g.name, *g.aliases):
            names.setdefault(_key(text), g.name)
    return names


def matching(name: str) -> list[GPU]:
    """The catalogued GPUs `name` may mean: the one it names (its name or an alias), else
    every one whose name starts with it (`a100`: four), else every one holding each of its
    words (`_words`: "H100 SXM5 80GB", the memory its size), in the catalog's order."""
    gpus, key = catalog(), _key(name)
    if key in _names():
        return [gpus[_names()[key]]]
    return [g for g in gpus.values() if key and _key(g.name).startswith(key)] or _by_words(name)


# words a GPU's name may carry that name no part: the vendor, its brands, its memory's kind
_NO_PART = {"nvidia", "tesla", "geforce", "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x",
            "gddr7"}


def _words(text: str) -> tuple[set[str], float | None]:
    """(the words of a GPU's name, its board's generation dropped: sxm5 is sxm; the memory
    a word like 80gb gives, in GB, or None)."""
    words, memory = set(), None
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if m := re.fullmatch(r"(\d+)gb?", w):
            memory = float(m[1])
        elif w not in _NO_PART:
            words.add(re.sub(r"^sxm\d$", "sxm", w))
    return words, memory


def _by_words(name: str) -> list[GPU]:
    """The GPUs whose name or an alias holds each of `name`'s words, and whose memory is the
    size it names (a V100 of 16 GB is not the catalog's 32 GB one)."""
    want, memory = _words(name)
    return [g for g in catalog().values() if want and memory in (None, g.memory_gb) and any(
        want <= _words(t)[0] for t in (g.name, *g.aliases))]


def named(names: Sequence[str]) -> dict[str, GPU]:
    """Every GPU each of `names` may mean (`matching`), each once; a name that means none is
    `find`'s ValueError."""
    return {g.name: g for name in names for g in matching(name) or [find(name)]}


class UnknownGPU(ValueError):
    """A name `find` cannot take; `meant` where it was surely meant as a GPU (ambiguous, close
    to catalogued ones, or several of them), not another device's name (a CPU's)."""

    def __init__(self, message: str, meant: bool):
        super().__init__(message)
        self.meant = meant


def find(name: str) -> GPU:
    """The catalogued GPU called `name` (its name or an alias, e.g. the name PyTorch reports;
    case, spaces and dashes do not matter). A name matching several (`a100`) or none is an
    `UnknownGPU` listing the close ones."""
    if "," in name:
        raise UnknownGPU(f"GPU {name!r}: one GPU here; `mdot plan MODEL --devices "
                         f"{name.replace(' ', '')} --gpus 1` compares several", True)
    several = matching(name)
    if len(several) == 1:
        return several[0]
    if several:
        raise UnknownGPU(f"GPU {name!r} is ambiguous: {', '.join(g.name for g in several)}",
                         True)
    parts = {w for w in _words(name)[0] if re.search(r"\d", w)}  # its model number: h100
    close = [g.name for g in catalog().values() if parts & _words(g.name)[0]] or \
        difflib.get_close_matches(name.lower(), list(catalog()), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise UnknownGPU(f"no GPU {name!r} in the catalog{hint} (`mdot devices` lists them; "
                     "--device-spec FILE.json describes another)", bool(close))


def as_seen(gpu: GPU, peak: float, width: int) -> GPU:
    """`gpu` as a kernel at `peak` TFLOP/s on `width`-byte elements sees it: the operator
    models count fp32 bytes, so half the width is twice the bandwidth and the L2."""
    return dataclasses.replace(gpu, tflops=dict(gpu.tflops, fp32=peak),
                               memory_gbs=gpu.memory_gbs * 4 / width,
                               l2_mb=gpu.l2_mb * 4 / width)


def lookup(name: str) -> GPU | None:
    """`find(name)`, or None where the name is no catalogued GPU (a CPU's, say)."""
    try:
        return find(name)
    except ValueError:
        return None


def from_spec_file(spec: str | Path | Mapping) -> GPU:
    """A GPU the catalog lacks, described in a JSON file with the catalog's fields (or by
    that object itself: a `device_spec` from Python)."""
    if isinstance(spec, Mapping):
        d, where = dict(spec), "device_spec"
    else:
        where = f"--device-spec {spec}"
        try:
            d = json.loads(Path(spec).read_text())
        except OSError as e:
            raise ValueError(f"{where}: {e.strerror or e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        if isinstance(d, list) and len(d) == 1:  # what `mdot devices --json NAME` writes
            d = d[0]
    gpu = _from_json(d, where)
    _check_dense(gpu, where)
    return gpu if isinstance(spec, Mapping) else dataclasses.replace(gpu, spec_file=str(spec))
