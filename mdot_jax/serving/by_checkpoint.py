"""A job priced by a checkpoint trained on measured steps of its devices (`serving.front`
chooses it and checks the job asks nothing only a GPU's spec sheet prices)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from converters import OperatorSequence
from mdot_jax.serving.model_source import sequence
from mdot_jax.serving.prediction import Prediction
from mdot_jax.serving.request import TrainingJob


class Checkpoint:
    """A checkpoint trained on measured steps of its devices."""
    FROZEN = ("this checkpoint learned steps that train every parameter and prices this one "
              "so (a GPU priced from its spec sheet prices the frozen ones)")

    def __init__(self, job: TrainingJob):
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
        seq = self._sequence(b)
        fixed = isinstance(job.model, OperatorSequence) or str(job.model).endswith(".npz")
        return seq, self.predictor.predict(
            seq, batch_size=b, image_size=job.image_size, seq_len=job.seq_len,
            precision=job.precision, layout=job.layout, device=job.device,
            optimizer=job.optimizer,  # a batch past the trained ones: from the model at others
            at_batch=None if fixed else self._sequence)

    def _sequence(self, b: int) -> OperatorSequence:
        """The job's model at batch `b` as the checkpoint reads it (`Predictor.read`: less a
        loss it never read, said)."""
        seq, said = self.predictor.read(
            sequence(self.job, b, int(self.predictor.trained.feature_cfg.fused)))
        self.notes += [said] * bool(said and said not in self.notes)
        return seq

    def parallel(self, one: Prediction, seq, n: int) -> Prediction:
        return one

    def mfu(self, seq, p: Prediction) -> None:
        return None  # the device's peak is not known to a checkpoint

    def operators(self, seq, p: Prediction, b: int) -> tuple[list[dict], str]:
        return self.predictor.operators(seq, p, b)


def _predictor(checkpoint: str | None):
    """The checkpoint's `Predictor`, loaded (and its networks compiled) once while its
    folder is unchanged."""
    from mdot_jax.storage.shipped import resolve_checkpoint

    path = resolve_checkpoint(checkpoint)
    stat = Path(path).stat()
    return _loaded(str(path), (stat.st_ino, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _loaded(path: str, stamp: tuple):
    from mdot_jax.serving.predict import Predictor

    return Predictor.load(path)


def machine_note(devices: Sequence[str]) -> str | None:
    """When this machine is a CPU and a CPU checkpoint's devices are other CPUs (family, model
    or vector extensions of another generation: per-model times differ 1.1-3x), what to say:
    the prediction is for those devices, and `mdot adapt` makes one for this machine."""
    from mdot_jax.measure.device import cpu_info, device_slug, is_cpu

    cpus = [d for d in devices if is_cpu(d)]
    info = cpu_info()
    if not cpus or "cpu_family" not in info:
        return None
    here = device_slug(dict(info, device_kind="cpu", threads=0)).removesuffix("-0t")
    if any(d.rsplit("-", 1)[0] == here for d in cpus):
        return None
    return (f"this machine is {here}, the checkpoint predicts for {', '.join(cpus)}: another "
            "CPU (models run 1.1-3x faster or slower, not by one factor); for this machine, "
            "run `mdot adapt` (docs: README, Predict for your machine)")
