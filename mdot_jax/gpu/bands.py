"""Bands of whole iterations measured where a job is what they measured.

`megatron_band` (a step model's metadata, written by `benchmarks/bench_megatron_band.py` where
its rule adopts it): the 80% band of log(measured / predicted) of vTrain's Megatron-DeepSpeed
iterations of GPT models on A100s, each model weighing the same. A prediction carries it only
where those iterations back it (`admits`): framework megatron on one of the band's GPUs at
one of its precisions, Megatron's fused softmax (no fused attention), full activation
checkpointing, the 1F1B schedule or no pipeline, no sequence, context or expert parallelism,
no offload, Adam or AdamW with DDP, the whole step, and a model made only of the operator
types of the decoders those iterations were priced as (a model with frozen parameters loses
every band at the front door).
"""

from __future__ import annotations

import dataclasses
import math

from converters.sequence import OperatorSequence
from mdot_jax.serving.prediction import Prediction


def admits(band: dict, gpu, job, seq: OperatorSequence, fused: bool) -> bool:
    """Whether `job` on `gpu` (its model `seq`, `fused` attention kernels or not) is what the
    band's iterations measured (module docstring)."""
    return (job.framework == "megatron" and gpu.name in band["gpus"]
            and job.precision in band["precisions"] and not fused
            and job.activation_checkpointing == "full"
            and job.schedule in (None, "1f1b") and job.virtual_stages is None
            and not job.sequence_parallel and job.cp == 1 and job.ep == 1
            and job.offload is None and job.strategy == "ddp" and job.optimizer in ("adam", "adamw")
            and job.step in (None, "train") and not seq.meta.get("experts")
            and set(map(str, seq.op_names)) <= set(band["op_types"]))


def megatron(p: Prediction, info: dict, gpu, job, seq: OperatorSequence,
             fused: bool) -> Prediction:
    """`p` with the step model's `megatron_band` where it `admits` the job, else as it is
    (a step model adapted to a user's steps: their band, where it has one)."""
    band = info.get("megatron_band")
    if band is None or info.get("adaptation") or not admits(band, gpu, job, seq, fused):
        return p
    return dataclasses.replace(
        p, interval_ms=(p.iteration_ms * math.exp(band["lo"]),
                        p.iteration_ms * math.exp(band["hi"])),
        band_from=f"{band['rows']:,} iterations of {band['models']} GPT models measured with "
                  f"Megatron-DeepSpeed on A100s ({band['source']}); left out one model at a "
                  f"time, the others' band held {band['mean_coverage']:.0%} of its iterations")
