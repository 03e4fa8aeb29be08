"""What would make a step that does not fit its GPUs' memory fit: the job priced again with one
of its memory levers moved (`LEVERS`), each lever's smallest move that fits.

The rules:
- only a single prediction priced from a GPU's spec sheet (a checkpoint prices none of the
  levers) that does not fit (`Prediction.fits`) is looked at;
- a lever is a field of the job and its moves, least change first; where memory falls with
  every move (`monotone`), the largest move is priced first (not fitting: the lever cannot)
  and the smallest that fits is found by bisection; otherwise each move in turn; where that
  move is tight (`Prediction.tight`), the smallest that leaves room is said after it;
- the micro-batch lever keeps the global batch: `batch_size` a divisor of the job's, the
  accumulation grown to make up the rest;
- where no lever fits alone, the levers' largest moves are taken together in `LEVERS`' order
  (one the moves taken rule out passed over) until they fit, then each dropped that the rest
  fit without (the fewest levers together);
- a move the job cannot take (a precision the GPU lacks, a strategy the optimizer refuses) is
  passed over, never an error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from mdot_jax.errors import MdotError
from mdot_jax.serving.prediction import SPEC_SHEET, Prediction
from mdot_jax.serving.request import TrainingJob


@dataclass(frozen=True)
class Lever:
    """One field of a job that moves its memory: `moves(job, p)` -> changes of the job
    (field -> value), least change first."""

    moves: Callable[[TrainingJob, Prediction], list[dict[str, Any]]]
    monotone: bool = True  # memory falls with every move: bisect


def _checkpointing(job: TrainingJob, p: Prediction) -> list[dict[str, Any]]:
    after = {None: ["selective", "full"], "selective": ["full"]}.get(
        job.activation_checkpointing, [])
    return [dict(activation_checkpointing=c) for c in after]


def _micro_batch(job: TrainingJob, p: Prediction) -> list[dict[str, Any]]:
    b = p.batch_size
    if job.batch_size is None:  # the batch is the input shapes' own
        return []
    small = [d for d in range(1, math.isqrt(b) + 1) if b % d == 0]
    divisors = sorted({*small, *(b // d for d in small)} - {b}, reverse=True)
    return [dict(batch_size=d, grad_accum=job.grad_accum * (b // d)) for d in divisors]


def _optimizer(job: TrainingJob, p: Prediction) -> list[dict[str, Any]]:
    return [dict(optimizer="adamw-8bit")] if job.optimizer in ("adam", "adamw") else []


def _offload(job: TrainingJob, p: Prediction) -> list[dict[str, Any]]:
    """DeepSpeed's ZeRO-Offload: Adam's state on the host, then the parameters too."""
    after = {None: ["optimizer", "params"], "optimizer": ["params"]}.get(job.offload, [])
    return [dict(offload=o) for o in after] if job.optimizer in ("adam", "adamw") else []


def _precision(job: TrainingJob, p: Prediction) -> list[dict[str, Any]]:
    """Autocast to the GPU's half type (from fp32 or TF32), then the whole model in bf16 where
    the GPU has it."""
    from mdot_jax.gpu import catalog

    gpu = catalog.lookup(p.device)
    bf16 = gpu is None or bool(gpu.tflops.get("bf16"))  # a described GPU: said when priced
    if job.precision in (None, "fp32", "tf32"):
        after = ["amp-bf16" if bf16 else "amp-fp16"] + ["bf16"] * bf16
    elif job.precision in ("amp-bf16", "amp-fp16"):
        after = ["bf16"] * bf16
    else:  # bf16 and fp8 hold no less
        after = []
    return [dict(precision=c) for c in after]


def _strategy(job: TrainingJob, p: Prediction) -> list[dict[str, Any]]:
    if p.replicas < 2:  # nothing to shard over
        return []
    after = {"ddp": ["zero1", "zero2", "fsdp"], "zero1": ["zero2", "fsdp"], "zero2": ["fsdp"],
             "hsdp": ["fsdp"]}
    return [dict(strategy=s) for s in after.get(job.strategy, [])]


# field -> lever, in the order they are said
LEVERS: dict[str, Lever] = {
    "activation_checkpointing": Lever(_checkpointing),
    "batch_size": Lever(_micro_batch),
    "strategy": Lever(_strategy),
    "optimizer": Lever(_optimizer),
    "offload": Lever(_offload),
    "precision": Lever(_precision, monotone=False),
}


def _together(moves: list[dict[str, Any]], price: Callable[[dict], Prediction | None]
              ) -> list[dict[str, Any]]:
    """The fewest of `moves` that fit together: added in their order (one the others rule out
    passed over) until they fit, then each dropped that the rest fit without; none where all
    of them do not fit."""
    taken: list[dict[str, Any]] = []
    for move in moves:
        if (q := price(_merged([*taken, move]))) is None:
            continue  # a move the ones taken rule out (8-bit state and an offloaded Adam)
        taken.append(move)
        if q.fits:
            break
    else:
        return []
    for move in taken[:-1]:  # the last was needed to fit
        rest = [m for m in taken if m is not move]
        if _fitting(price(_merged(rest))):
            taken = rest
    return [_merged(taken)]


def _smallest(moves: list[dict[str, Any]], ok: Callable[[dict], bool], monotone: bool
              ) -> dict[str, Any] | None:
    """The first of `moves` that is `ok`: bisected where `monotone` (the last priced first:
    not ok, none is), else each in turn."""
    if not monotone:
        return next((m for m in moves if ok(m)), None)
    if not ok(moves[-1]):
        return None
    lo, hi = 0, len(moves) - 1  # moves[hi] is ok
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(moves[mid]) else (mid + 1, hi)
    return moves[hi]


def _merged(moves: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: v for m in moves for k, v in m.items()}


def _key(change: dict[str, Any]) -> tuple:
    return tuple(sorted(change.items()))


def _fitting(q: Prediction | None) -> bool:
    """Priced (the job could take the change) and fitting."""
    return q is not None and q.fits


def suggest(job: TrainingJob, p: Prediction, predict: Callable | None = None,
            progress: bool = False) -> Prediction:
    """`p` (the prediction of `job`) with `fits_with`: where it does not fit, each lever's
    smallest move that fits ({"change", "memory_gb", "iteration_ms", "tight":
    `Prediction.tight`}), or the fewest levers' largest moves together, or nothing (empty:
    none fits); `p` as it is where it fits or is not a spec sheet's."""
    if p.fits or not p.source.startswith(SPEC_SHEET) or job.several:
        return p
    from mdot_jax.serving import front

    pricer: Callable = predict or front.predict
    priced: dict[tuple, Prediction | None] = {}
    with tqdm(desc="what would fit", unit="price", disable=not progress, leave=False) as bar:

        def price(change: dict[str, Any]) -> Prediction | None:
            if (key := _key(change)) not in priced:
                bar.update()
                try:
                    priced[key] = pricer(dataclasses.replace(job, **change))
                except MdotError:  # a move this job cannot take
                    priced[key] = None
            return priced[key]

        def fits(change: dict[str, Any]) -> bool:
            return _fitting(price(change))

        def roomy(change: dict[str, Any]) -> bool:
            return fits(change) and not price(change).tight  # type: ignore[union-attr]

        found, largest = [], []  # each lever's largest move
        for lever in LEVERS.values():
            moves = lever.moves(job, p)
            if not moves:
                continue
            largest.append(moves[-1])
            for ok in (fits, roomy):  # the smallest move that fits; if tight, one with room
                if (move := _smallest(moves, ok, lever.monotone)) is None:
                    break
                if move not in found:
                    found.append(move)
                if not price(move).tight:  # type: ignore[union-attr]
                    break
        if not found and len(largest) > 1:
            found += _together(largest, price)
    out = []
    for change in found:
        q = priced[_key(change)]
        assert q is not None
        out.append(dict(change=change, memory_gb=q.memory_gb, iteration_ms=q.iteration_ms,
                        tight=q.tight))
    return dataclasses.replace(p, fits_with=out)
