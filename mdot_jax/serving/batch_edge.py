"""A batch past the largest one a checkpoint was trained on (its edge, `E`): priced at `E` and
grown as the step grew over its last doubling, from `E / 2` to `E` (that growth's exponent
clamped to [0, 1]), not by networks and trees that go flat or bend where they saw nothing
([study](../../docs/studies/batch-beyond-trained.md))."""

from __future__ import annotations

import math
from collections.abc import Sequence


def edge(trained: Sequence[int] | None, batch: int) -> int | None:
    """The largest of the `trained` batches where `batch` is past it (and it has a half);
    else None."""
    if not trained or batch <= max(trained) or max(trained) < 2:
        return None
    return max(trained)


def growth(t_half: float, t_edge: float, ratio: float) -> float:
    """The step's growth from the edge to `ratio` times it, given its times at the edge's half
    and at the edge: `ratio ** e`, e the doubling's exponent in [0, 1]."""
    e = min(1.0, max(0.0, math.log2(t_edge / t_half))) if t_half > 0 < t_edge else 1.0
    return ratio ** e


def said(batch: int, trained: Sequence[int], grown: float) -> str:
    """The warning of a batch priced from the edge."""
    top = max(trained)
    far = batch > 10 * top
    return (f"batch size {batch} is {'far (over 10x) ' if far else ''}past the trained range "
            f"{min(trained)}-{top}: priced at batch {top} and grown {grown:.3g}x, as the step "
            f"grew from batch {top // 2} to {top}: "
            + ("a guess, not a prediction" if far else "extrapolation"))
