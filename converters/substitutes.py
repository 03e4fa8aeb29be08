"""Functions of transformers' model modules that training replaces by fused kernels, exported
as those kernels' work while `from_torch` traces a model (a registry: name -> substitute).

- `torch_chunk_gated_delta_rule` (Qwen3-Next, Qwen3.5, OLMo-hybrid): `linear_attention.chunked`;
- `chunk_kimi_delta_attention` (Kimi Linear): `linear_attention.per_channel`;
- `mamba2_split_conv1d_scan_combined` (Mamba-2 and its hybrids): `state_space.combined`;
- `mamba_selective_scan` (Mamba-1 and its hybrids): `state_space.selective_scan`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from converters.linear_attention import FUNCTION as GATED_DELTA_RULE
from converters.linear_attention import PER_CHANNEL, chunked, per_channel
from converters.state_space import FUNCTION as MAMBA2_SCAN
from converters.state_space import SCAN, combined, heads_and_groups, selective_scan


class Substitute(NamedTuple):
    function: Callable
    what: str  # the layers it computes
    kernels: str  # whose kernels its work is
    # a model's state space heads and groups (what tensor parallelism must divide), or None
    state_space: Callable[[Any], dict | None] = lambda module: None


SUBSTITUTES = {
    GATED_DELTA_RULE: Substitute(chunked, "gated delta rule",
                                 "flash-linear-attention's chunked kernels"),
    PER_CHANNEL: Substitute(per_channel, "Kimi delta attention",
                            "flash-linear-attention's chunked KDA kernels"),
    MAMBA2_SCAN: Substitute(combined, "Mamba-2 state space layers",
                            "mamba_ssm's fused conv1d, chunked scan and gated norm",
                            heads_and_groups),
    SCAN: Substitute(selective_scan, "Mamba-1 state space layers",
                     "mamba_ssm's selective scan (one memory-bound kernel each way)"),
}


def described(names: str) -> list[Substitute]:
    """The substitutes a model's metadata names (comma-separated)."""
    return [SUBSTITUTES[name] for name in names.split(",") if name in SUBSTITUTES]


@contextlib.contextmanager
def substituted(module: Any) -> Iterator[list[str]]:
    """`module` (a torch model) with every registered function its layers' modules define
    replaced by its substitute, restored after; yields the names replaced."""
    patched = []
    for where in filter(None, map(sys.modules.get, {type(m).__module__ for m in module.modules()})):
        for name, substitute in SUBSTITUTES.items():
            if callable(getattr(where, name, None)):
                patched.append((where, name, getattr(where, name)))
                setattr(where, name, substitute.function)
    try:
        yield sorted({name for _, name, _ in patched})
    finally:
        for where, name, original in patched:
            setattr(where, name, original)
