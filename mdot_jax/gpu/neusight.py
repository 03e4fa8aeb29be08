"""NeuSight's public measurements on NVIDIA GPUs, read where they lie.

NeuSight (Lee, Phanishayee, Mahajan, ASPLOS 2025; MIT licence) measured fp32 forward kernel
latencies of batched and plain matrix multiplications, elementwise operators, softmax and layer
norm on eight GPUs (PyTorch 2.1, CUDA 12.1), and whole transformer runs with a one-layer trace
of per-node times. The folder is read in place (`ops/train/collect/`, `ops/test/`, `label/`,
`summary/`) and never copied into this repository: operator rows become `OpRow`s, whole runs
`Label`s of `TraceNode`s.
"""

from __future__ import annotations

import ast
import csv
import json
import lzma
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog as gpus

GEMMS = ("bmm", "linear")
ELEMENTWISE = ("add", "mul", "div", "pow", "addu", "mulu", "divu", "powu", "relu", "gelu",
               "tanh")
ROWWISE = ("softmax", "ln")
CONV = "conv"  # 2-D convolution as an implicit GEMM: dims (G, M, N, K, X), see `conv_dims`
OPS = GEMMS + ELEMENTWISE + ROWWISE + (CONV,)
# the folder's files of each split: train (the five GPUs NeuSight fits on), test (all eight)
TEST_FILES = ("bmm.csv.xz", "linear.csv.xz", "vec.csv.xz")


@dataclass(frozen=True)
class OpRow:
    op: str  # one of OPS
    gpu: str  # catalog name (`gpus.find` of the row's device)
    dims: tuple[int, ...]  # GEMMs: (B, M, N, K); conv: `conv_dims`; the others: (B, H)
    ms: float  # forward latency, ms
    split: str  # "train" | "test"


def conv_dims(batch: int, c_in: int, c_out: int, kernel: int, size: int, stride: int = 1,
              padding: int = 0, groups: int = 1) -> tuple[int, ...]:
    """A square 2-D convolution as the implicit GEMM cuDNN runs: (G groups, M = batch x output
    pixels, N = output channels per group, K = input channels per group x kernel pixels,
    X = input elements)."""
    out = (size + 2 * padding - kernel) // stride + 1
    return (groups, batch * out * out, c_out // groups, c_in // groups * kernel * kernel,
            batch * c_in * size * size)


def _open(path: Path):
    return lzma.open(path, "rt") if path.suffix == ".xz" else open(path)


def _rows(path: Path, split: str) -> Iterator[OpRow]:
    names: dict[str, str] = {}  # the file's device string -> catalog name
    conv = ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
            "Padding")
    with _open(path) as f:
        rows = csv.reader(f)
        at = {k: i for i, k in enumerate(next(rows, []))}  # a column's index (DictReader's
        for r in rows:  # dict a row costs more than the rest of the reading)
            op = r[at["OPName"]]
            if op not in OPS:
                continue
            device = r[at["Device"]]
            gpu = names.get(device) or names.setdefault(device, gpus.find(device).name)
            if op == CONV:
                dims = conv_dims(*(int(r[at[k]]) for k in conv))
            else:
                keys = ("B", "M", "N", "K") if op in GEMMS else ("B", "H")
                dims = tuple(int(r[at[k]]) for k in keys)
            yield OpRow(op, gpu, dims, float(r[at["Latency"]]), split)


def folders(root: str | Path) -> tuple[Path, Path]:
    """The NeuSight folder `root`'s training collections and test set, or a one-line error."""
    root = Path(root)
    train, test = root / "ops" / "train" / "collect", root / "ops" / "test"
    if not train.is_dir() or not test.is_dir():
        raise FileNotFoundError(f"{root}: not NeuSight's folder (no ops/train/collect, ops/test)")
    return train, test


def read(root: str | Path) -> list[OpRow]:
    """Every operator row of the NeuSight folder `root` (`.../datasets/neusight`): the
    training GPUs' collections and the test set of every GPU. NeuSight measured its
    convolutions (3x3, stride 1, padding 1 only) on the A100 80 GB in place of its fifth
    training GPU; a GPU with no GEMM collection is one of its test GPUs, and its convolutions
    are left out so that it stays unseen."""
    train, test = folders(root)
    rows: list[OpRow] = []
    for op in OPS:
        for path in sorted((train / op).glob("*/*.csv*")):
            rows.extend(_rows(path, "train"))
    fitted = {r.gpu for r in rows if r.op in GEMMS}
    rows = [r for r in rows if r.gpu in fitted]
    for name in TEST_FILES:
        rows.extend(_rows(test / name, "test"))
    return rows


def training_gpus(rows: list[OpRow]) -> list[str]:
    """The GPUs with training collections: the ones NeuSight fits on."""
    return sorted({r.gpu for r in rows if r.split == "train"})


# ---------------------------------------------------------------------------- whole models
# The repeated layer of each traced model: the nodes from its first to its last (the trace
# holds one; a model runs it `num_layer` times), as NeuSight composes its labels
LAYERS = {"bert": ("bert_encoder_layer_0_attention_self_query",
                   "bert_encoder_layer_0_output_layer_norm"),
          "gpt": ("transformer_h_0_ln_1", "add_15"),
          "opt": ("model_decoder_layers_0_self_attn_layer_norm", "view_11")}
KINDS = ("linear", "bmm", "softmax", "ln", "elementwise", "dropout", "embedding", "free")
_BINARY = {"add": "add", "sub": "add", "mul": "mul", "truediv": "div", "div": "div",
           "pow": "pow", "where": "add", "max": "add", "masked_fill": "add",
           "masked_fill_": "add", "eq": "add", "ne": "add", "lt": "add", "gt": "add"}
_UNARY = {"tanh": "tanh", "gelu": "gelu", "relu": "relu", "contiguous": "addu",
          "cumsum": "addu", "full": "addu", "ones": "addu"}  # `to`: no kernel at one dtype


@dataclass(frozen=True)
class TraceNode:
    """One node of a traced transformer layer (a torch.fx node), as NeuSight measured it.

    kind: one of `KINDS` (`free`: views and metadata, no kernel of their own; `dropout`: none
      at inference either).
    op: the operator of NeuSight's operator tables that prices it (`OPS`), "" when free.
    dims: GEMMs (B, M, N, K); the others (rows, last dim) of the output.
    params: weights it reads and accumulates gradients into (elements).
    fw_ms, bw_ms, acc_ms: measured forward, backward and gradient-accumulation times.
    """

    name: str
    kind: str
    op: str
    dims: tuple[int, ...]
    params: int
    fw_ms: float
    bw_ms: float
    acc_ms: float


@dataclass(frozen=True)
class Label:
    """One end-to-end measurement: `e2e_ms` = `fw_ms` + `bwall_ms` (train: forward and
    `loss.backward()`, no optimizer step; inf: forward), of `nodes` with nodes[layer[0]:
    layer[1]] run `num_layer` times."""

    gpu: str
    model: str
    mode: str  # "train" | "inf"
    seq_len: int
    batch: int
    num_layer: int
    e2e_ms: float
    fw_ms: float
    bwall_ms: float
    nodes: tuple[TraceNode, ...]
    layer: tuple[int, int]

    def compose(self, per_node) -> float:
        """The model's total of a per-node quantity `[N]` (the layer counted num_layer times)."""
        v = np.asarray(per_node, np.float64)
        a, b = self.layer
        return float(v[:a].sum() + self.num_layer * v[a:b].sum() + v[b:].sum())


def _dims(shape) -> tuple[int, int]:
    """(rows, last dim) of a shape."""
    return math.prod(int(d) for d in shape[:-1]), int(shape[-1]) if shape else 1


def _node(r: dict, config: dict) -> TraceNode:
    """Classifies one trace row by its function or module and its shapes."""
    shapes = [s for s in ast.literal_eval(r["input_shapes"] or "[]") if isinstance(s, list)]
    out = list(ast.literal_eval(r["output_shape"])) if r["output_shape"].startswith("(") else []
    target, name = r["target"], r["Name"].lower()
    fn = (target.split(" of ")[0].replace("<built-in method ", "").replace(
        "<built-in function ", "").replace("<function ", "").split(" at ")[0].strip("<>"))
    if r["op"] == "call_method":
        fn = target
    kind, op, dims, params = "free", "", (), 0
    if r["op"] == "call_module":
        if "norm" in name or name.endswith(("ln_1", "ln_2", "ln_f")):
            kind, op, dims, params = "ln", "ln", _dims(out), 2 * int(out[-1])
        elif "drop" in name:  # a mask multiplied in; nothing at inference
            kind, op, dims = "dropout", "mul", _dims(out)
        elif name.endswith(("wte", "word_embeddings", "embed_tokens")):
            kind, op, dims = "embedding", "addu", _dims(out)
            params = int(config.get("vocab_size", 0)) * int(out[-1])
        elif name.endswith(("wpe", "position_embeddings", "token_type_embeddings",
                            "embed_positions")):
            kind, op, dims = "embedding", "addu", _dims(out)
            rows = config.get("max_position_embeddings", config.get("n_positions", 0))
            params = int(config.get("type_vocab_size", 2) if "token_type" in name else rows) \
                * int(out[-1])
        elif shapes and out and len(shapes[0]) == len(out) and shapes[0][-1] != out[-1]:
            m, k = _dims(shapes[0])
            kind, op, dims, params = "linear", "linear", (1, m, int(out[-1]), k), \
                k * int(out[-1]) + int(out[-1])
        elif shapes and out:
            kind, op, dims = "elementwise", "gelu", _dims(out)
    elif fn in ("addmm",) and len(shapes) == 3:
        (m, k), n = shapes[1], shapes[2][1]
        kind, op, dims, params = "linear", "linear", (1, m, n, k), k * n + n
    elif fn in ("matmul", "bmm", "baddbmm") and len(shapes) >= 2:
        a, b = shapes[-2], shapes[-1]
        if len(b) == 2:
            rows, k = _dims(a)
            kind, op, dims = "linear", "linear", (1, rows, b[1], k)
        else:
            kind, op, dims = "bmm", "bmm", (math.prod(a[:-2]), a[-2], b[-1], a[-1])
    elif fn == "dropout" and out:
        kind, op, dims = "dropout", "mul", _dims(out)
    elif fn == "embedding" and out:
        kind, op, dims = "embedding", "addu", _dims(out)
        params = int(config.get("vocab_size", 0)) * int(out[-1])
    elif fn in ("softmax", "layer_norm") and out:
        kind = op = "softmax" if fn == "softmax" else "ln"
        dims = _dims(out)
    elif (fn in _BINARY or fn in _UNARY) and out and math.prod(out) > 1:
        full = [s for s in shapes if math.prod(s) == math.prod(out)]
        kind, dims = "elementwise", _dims(out)
        if fn in _BINARY:
            op = _BINARY[fn] + ("" if len(full) >= 2 else "u")
        else:
            op = _UNARY[fn]
    return TraceNode(r["Name"], kind, op, tuple(int(d) for d in dims), params,
                     float(r["fw_latency"] or 0), float(r.get("bw_latency") or 0),
                     float(r.get("acc_latency") or 0))


def labels(root: str | Path) -> list[Label]:
    """Every single-GPU NVIDIA label of NeuSight's folder whose layer trace is there (the
    Switch-XL traces are not), with its nodes classified (`TraceNode`)."""
    root = Path(root)
    out: list[Label] = []
    for path in sorted((root / "label").glob("*/*.json")):
        stem = path.stem
        parts = stem.split("-")
        trace = path.with_suffix(".csv")
        if path.parent.name.startswith("AMD") or len(parts) != 4 or not trace.exists():
            continue  # AMD, multi-GPU and fused runs, or no trace
        model, mode, seq_len, batch = parts
        family = next((f for f in LAYERS if model.startswith(f)), None)
        if family is None:
            continue
        config_path = root / "model_configs" / f"{model}.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        with open(trace) as f:
            nodes = tuple(_node(r, config) for r in csv.DictReader(f))
        names = [n.name for n in nodes]
        first, last = LAYERS[family]
        d = json.loads(path.read_text())
        out.append(Label(gpus.find(path.parent.name.replace("_", " ")).name, model, mode,
                         int(seq_len), int(batch), int(d["num_layer"]),
                         float(d["e2e_latency"]), float(d["fw_latency"]),
                         float(d.get("bwall_latency") or 0.0), nodes,
                         (names.index(first), names.index(last) + 1)))
    return out


def summary(root: str | Path) -> dict[tuple, dict[str, float]]:
    """NeuSight's own table of single-GPU labels (`summary/summary.csv.xz`): per (gpu,
    model, mode, seq_len, batch), the measured ms and the ms NeuSight and a roofline
    predicted (NaN where the table has none)."""
    out = {}
    with lzma.open(Path(root) / "summary" / "summary.csv.xz", "rt") as f:
        for r in csv.DictReader(f):
            if r["option"] or r["device"].startswith("AMD"):
                continue
            key = (gpus.find(r["device"].replace("_", " ")).name, r["model_name"], r["mode"],
                   int(r["seqlen"]), int(r["batch"]))
            out[key] = {k: float(r[f"{k}_all_e2e_latency"] or "nan")
                        for k in ("label", "neusight", "roofline")}
    return out


def train_labels(root: str | Path) -> list[dict]:
    """The single-GPU NVIDIA training labels of models with a Hugging Face config:
    gpu, model, seq_len, batch, layers, ms."""
    root = Path(root)
    out = []
    for path in sorted((root / "label").glob("*/*-train-*.json")):
        parts = path.stem.split("-")
        config = root / "model_configs" / f"{parts[0]}.json"
        if path.parent.name.startswith("AMD") or len(parts) != 4 or not config.exists():
            continue  # AMD, multi-GPU or fused runs
        label, cfg = json.loads(path.read_text()), json.loads(config.read_text())
        out.append(dict(gpu=gpus.find(path.parent.name.replace("_", " ")).name,
                        model=parts[0], seq_len=int(parts[2]), batch=int(parts[3]),
                        layers=label["num_layer"] or cfg.get("num_layers") or cfg["n_layer"],
                        ms=float(label["e2e_latency"])))
    return out
