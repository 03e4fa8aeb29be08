"""NeuSight's public single-operator measurements on NVIDIA GPUs, read where they lie.

NeuSight (Lee, Phanishayee, Mahajan, ASPLOS 2025; MIT licence) measured fp32 forward kernel
latencies of batched and plain matrix multiplications, elementwise operators, softmax and layer
norm on eight GPUs (PyTorch 2.1, CUDA 12.1). The folder is read in place (`ops/train/collect/`,
`ops/test/`) and never copied into this repository; each row becomes an `OpRow`.
"""

from __future__ import annotations

import csv
import lzma
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mdot_jax.data import gpus

GEMMS = ("bmm", "linear")
ELEMENTWISE = ("add", "mul", "div", "pow", "addu", "mulu", "divu", "powu", "relu", "gelu",
               "tanh")
ROWWISE = ("softmax", "ln")
OPS = GEMMS + ELEMENTWISE + ROWWISE
# the folder's files of each split: train (the five GPUs NeuSight fits on), test (all eight)
TEST_FILES = ("bmm.csv.xz", "linear.csv.xz", "vec.csv.xz")


@dataclass(frozen=True)
class OpRow:
    op: str  # one of OPS
    gpu: str  # catalog name (`gpus.find` of the row's device)
    dims: tuple[int, ...]  # GEMMs: (B, M, N, K); the others: (B, H)
    ms: float  # forward latency, ms
    split: str  # "train" | "test"


def _open(path: Path):
    return lzma.open(path, "rt") if path.suffix == ".xz" else open(path)


def _rows(path: Path, split: str) -> Iterator[OpRow]:
    names: dict[str, str] = {}  # the file's device string -> catalog name
    with _open(path) as f:
        for r in csv.DictReader(f):
            op = r["OPName"]
            if op not in OPS:
                continue
            keys = ("B", "M", "N", "K") if op in GEMMS else ("B", "H")
            gpu = names.get(r["Device"]) or names.setdefault(r["Device"],
                                                             gpus.find(r["Device"]).name)
            yield OpRow(op, gpu, tuple(int(r[k]) for k in keys), float(r["Latency"]), split)


def read(root: str | Path) -> list[OpRow]:
    """Every operator row of the NeuSight folder `root` (`.../datasets/neusight`): the
    training GPUs' collections and the test set of every GPU."""
    root = Path(root)
    train, test = root / "ops" / "train" / "collect", root / "ops" / "test"
    if not train.is_dir() or not test.is_dir():
        raise FileNotFoundError(f"{root}: not NeuSight's folder (no ops/train/collect, ops/test)")
    rows: list[OpRow] = []
    for op in OPS:
        for path in sorted((train / op).glob("*/*.csv*")):
            rows.extend(_rows(path, "train"))
    for name in TEST_FILES:
        rows.extend(_rows(test / name, "test"))
    return rows


def training_gpus(rows: list[OpRow]) -> list[str]:
    """The GPUs with training collections: the ones NeuSight fits on."""
    return sorted({r.gpu for r in rows if r.split == "train"})
