"""A job priced by a checkpoint trained on measured steps of its devices (`serving.front`
chooses it and checks the job asks nothing only a GPU's spec sheet prices)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from converters import OperatorSequence
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from mdot_jax.serving.model_source import sequence
from mdot_jax.serving.prediction import Prediction
from mdot_jax.serving.request import TrainingJob


class Checkpoint:
    """A checkpoint trained on measured steps of its devices."""
    FROZEN = ("this checkpoint learned steps that train every parameter and prices this one "
              "so (a GPU priced from its spec sheet prices the frozen ones)")

    def __init__(self, job: TrainingJob):
        from mdot_jax.serving.predict import machine_note

        self.job, self.predictor = job, _predictor(job.checkpoint)
        members = self.predictor.member_labels
        name = self.predictor.path.name if self.predictor.path else "in memory"
        self.source = f"checkpoint {name}" + (
            ", geometric mean of " + " x ".join(members) if len(members) > 1 else "")
        adapted = self.predictor.adaptation
        note = machine_note([adapted.device] if adapted else self.predictor.devices)
        self.notes = [note] if note else []

    def step(self, b: int) -> tuple[OperatorSequence, Prediction]:
        job = self.job
        seq = at_fp32_width(sequence(job, b, int(self.predictor.trained.feature_cfg.fused)))
        return seq, self.predictor.predict(
            seq, batch_size=b, image_size=job.image_size, seq_len=job.seq_len,
            precision=job.precision, layout=job.layout, device=job.device,
            optimizer=job.optimizer)

    def parallel(self, one: Prediction, seq, n: int) -> Prediction:
        return one

    def mfu(self, seq, p: Prediction) -> None:
        return None  # the device's peak is not known to a checkpoint

    def operators(self, seq, p: Prediction, b: int) -> tuple[list[dict], str]:
        return self.predictor.operators(seq, p, b)


_ELEM = CONFIG_FIELDS.index("elem_bytes")
_READ, _WRITTEN, _INTENSITY = (LOAD_FIELDS.index(f) for f in
                               ("bytes_read", "bytes_written", "intensity"))


def at_fp32_width(seq: OperatorSequence) -> OperatorSequence:
    """`seq` as its fp32 export reads, the width of the exports a checkpoint learned from: a
    model exported in a half type (`meta["half_type"]`) has the bytes of its operators of
    2-byte elements doubled, and their intensity halved."""
    if not seq.meta.get("half_type"):
        return seq
    config, load = seq.config.copy(), seq.load.copy()
    half = config[:, _ELEM] == 2  # [N]
    config[half, _ELEM] = 4
    load[np.ix_(half, [_READ, _WRITTEN])] *= 2
    load[half, _INTENSITY] /= 2
    meta = {k: v for k, v in seq.meta.items() if k != "half_type"}
    return dataclasses.replace(seq, config=config, load=load, meta=meta)


def _predictor(checkpoint: str | None):
    """The checkpoint's `Predictor`, loaded (and its networks compiled) once while its
    folder is unchanged."""
    from mdot_jax.serving.predict import resolve_checkpoint

    path = resolve_checkpoint(checkpoint)
    stat = Path(path).stat()
    return _loaded(str(path), (stat.st_ino, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _loaded(path: str, stamp: tuple):
    from mdot_jax.serving.predict import Predictor

    return Predictor.load(path)
