"""Members of a prediction combined: the network, the tree model and, where a checkpoint
carries one, the operator-sum line; each `[N]` milliseconds."""

from __future__ import annotations

import numpy as np


def combine(*members_ms: np.ndarray) -> np.ndarray:
    """`[N]`: the geometric mean of the members' predictions `[N]` each (all regress log
    time, so they are averaged in log space, equal weights)."""
    return np.exp(np.mean(np.log(np.asarray(members_ms, np.float64)), axis=0))


def spread(*members_ms: np.ndarray) -> np.ndarray:
    """`[N]`: how far the members' predictions `[N]` each are apart, max |log(t_i / t_j)|
    (for two members |log(t_a / t_b)|): where they disagree, the combination errs more."""
    logs = np.log(np.asarray(members_ms, np.float64))
    return logs.max(axis=0) - logs.min(axis=0)
