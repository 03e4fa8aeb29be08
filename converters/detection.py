"""An object detector's or a mask segmenter's training step from its config (DETR and its kin:
transformers' `...ForObjectDetection`; Mask2Former, MaskFormer: `...ForUniversalSegmentation`):
`OBJECTS` boxes or masks an image, matched to the queries as its loss does, the graph exported
at the batch (each image's targets are a list the loss walks)."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys
from collections.abc import Iterator
from typing import Any

OBJECTS = 8  # boxes or masks an image (COCO's training images hold 7.3 objects on average)


def boxes(x: Any, cfg: Any) -> dict:
    """Each image's targets for images x [B, C, H, W]: `OBJECTS` classes and boxes (centre,
    size: a valid box; which ones changes no work)."""
    import torch

    return dict(labels=[dict(class_labels=torch.zeros(OBJECTS, dtype=torch.long, device=x.device),
                             boxes=torch.full((OBJECTS, 4), 0.5, device=x.device))
                        for _ in range(x.shape[0])])


def masks(x: Any, cfg: Any) -> dict:
    """Each image's targets for images x [B, C, H, W]: `OBJECTS` classes and masks [H, W]."""
    import torch

    return dict(mask_labels=[torch.zeros(OBJECTS, *x.shape[-2:], device=x.device)
                             for _ in range(x.shape[0])],
                class_labels=[torch.zeros(OBJECTS, dtype=torch.long, device=x.device)
                              for _ in range(x.shape[0])])


def _first_k(cost: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """An assignment of as many queries as targets, read from the cost matrix's shape alone."""
    import numpy as np

    k = min(cost.shape[-2], cost.shape[-1])
    return np.arange(k), np.arange(k)


@contextlib.contextmanager
def matched() -> Iterator[None]:
    """transformers' detection and mask losses, traceable: the Hungarian matching (scipy's, on
    the CPU, on the cost matrix's values; transformers' losses' and a model's own) assigns the
    first queries to the targets (the cost matrix is still computed on the GPU; the assignment
    is the CPU's), and a matrix's `diag` (the boxes' GIoU; ONNX has none) is its `diagonal`.
    Restored after."""
    import torch
    import transformers.loss as losses

    modules = [importlib.import_module(f"{losses.__name__}.{m.name}")
               for m in pkgutil.iter_modules(losses.__path__)]
    modules += [m for name, m in list(sys.modules.items())  # a model's own matcher's
                if name.startswith("transformers.models.") and m is not None]
    diag = torch.diag

    def diagonal(x: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.diagonal(x) if x.dim() == 2 and not args and not kwargs else \
            diag(x, *args, **kwargs)

    patches = [(m, "linear_sum_assignment", _first_k) for m in modules
               if hasattr(m, "linear_sum_assignment")] + [(torch, "diag", diagonal)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
