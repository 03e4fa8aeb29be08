"""`mdot calibrate`: give a checkpoint the error bands its recipe showed on held-out families
(the rows of an `mdot evaluate --split family` run on the same dataset)."""

from __future__ import annotations

from pathlib import Path

from mdot_jax.data.dataset import Dataset
from mdot_jax.evaluation.evaluate import read_results
from mdot_jax.serving import checkpoint
from mdot_jax.serving.calibration import Calibration, from_results


def calibrate(path: str | Path, results_dir: str | Path, ds: Dataset,
              methods: tuple[str, ...] | None = None) -> Calibration:
    """Error bands for the checkpoint at `path` from a leave-family-out evaluation of the same
    recipe on the same dataset (`mdot evaluate --split family`, results in `results_dir`);
    `methods` default to the checkpoint's members (`member_methods`; as many methods as
    members, or the bands would be another prediction's). Written into the checkpoint's
    metadata and model card."""
    meta = checkpoint.read_metadata(path)
    rows = read_results(results_dir)
    if not rows:
        raise ValueError(f"{results_dir}: no evaluation results")
    fingerprints = {ds.fingerprint(), meta["dataset"].get("fingerprint")}
    fingerprints |= {r["dataset"] for r in rows}
    if len(fingerprints) > 1:
        raise ValueError(f"the checkpoint, the dataset {ds.root} and the results in "
                         f"{results_dir} are not of one dataset (fingerprints "
                         f"{sorted(map(str, fingerprints))})")
    splits = {r["split"] for r in rows}
    if splits != {"family"}:
        raise ValueError(f"{results_dir}: results of a {'/'.join(sorted(splits))} split; the "
                         "bands are for unseen model families (evaluate with --split family)")
    members = member_methods(meta)
    methods = methods or members
    if len(methods) != len(members):  # else the bands would describe another prediction
        raise ValueError(f"{path} predicts with {' x '.join(members)}: give as many methods, "
                         f"not {', '.join(methods)}")
    cal = from_results(rows, ds.samples, methods,
                       source=f"{Path(results_dir).name}, leave-family-out")
    checkpoint.attach_calibration(path, cal)
    return cal


def member_methods(meta: dict) -> tuple[str, ...]:
    """The `mdot evaluate` methods whose rows describe a checkpoint's members: its network
    (`ModelConfig.method`: `gnn`, `mdot-pe-none`, ...), `lightgbm` with a companion, and
    its operator-sum line (`op-sum`, or `op-sum-params` with a parameter term)."""
    line = meta.get("op_sum")
    return (checkpoint.model_config(meta).method, *(["lightgbm"] if meta.get("companion") else []),
            *([("op-sum-params" if line.get("e") else "op-sum")] if line else []))
