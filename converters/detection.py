"""An object detector's or a mask segmenter's training step from its config (DETR and its kin:
transformers' `...ForObjectDetection`; Mask2Former, MaskFormer: `...ForUniversalSegmentation`):
`OBJECTS` boxes or masks an image, matched to the queries as its loss does (`converters.patches
.matched_queries`), the graph exported at the batch (each image's targets are a list the loss
walks)."""

from __future__ import annotations

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
