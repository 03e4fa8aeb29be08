"""A Hopper GPU whose kernels nobody measured: the H100 and the H200, each held out.

    python benchmarks/bench_hopper_held_out.py --out benchmarks/results/hopper-held-out

The method (docs/studies/hopper-held-out.md, written before any step was priced with a
held-out model): for each of the two GPUs, the shipped step model with every constant fitted
on that GPU's measurements replaced by the same fit on the other's (`held_out_info`), the
PyTorch host refitted with it on the other GPU's lease machines' launch-bound steps alone.
Each GPU's measured sets are priced by the shipped model and by its held-out one: MAPE and
median predicted / measured over all rows, the GPU set and the core set apart, transformers
and CNNs apart, with the two halves of the change apart (the constants alone, the host
alone); the kit's LLM steps by the shipped and the held-out model. Nothing is adopted.
Resumable: each finished part is kept in `--out`/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_machine_host import LEASES, core, core_kernels  # noqa: E402
from bench_tensor_cores import steps  # noqa: E402

SWEEPS = {"h100 sxm": "data/gpu-nvidia-h100-80gb-hbm3-lease-3/kernels.jsonl.xz",
          "h200 sxm": "data/gpu-nvidia-h200/kernels.jsonl.xz"}
LLM_STEPS = {"h100 sxm": "data/gpu-nvidia-h100-80gb-hbm3-lease-3/llm-steps.jsonl",
             "h200 sxm": "data/gpu-nvidia-h200/llm-steps.jsonl"}
OTHER = {"h100 sxm": "h200 sxm", "h200 sxm": "h100 sxm"}


def shipped_info() -> dict:
    """The shipped step model's constants (its `info`)."""
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    return StepModel.load(STEP_MODEL_DIR).info


def held_out_info(held: str, sweep_rows: list[dict]) -> dict:
    """The step model's constants measured on `held` (a catalog name of `SWEEPS`), refitted on
    the other Hopper GPU's sweep (`sweep_rows`), as the study's method says; the host apart."""
    from mdot_jax.gpu import streaming, tensor_cores

    source = SWEEPS[OTHER[held]]
    if held == "h200 sxm":  # its sweep gave fused attention, memory-bound kernels, FP8 GEMMs
        return dict(
            fused_attention=dict(tensor_cores.fit_attention(sweep_rows), source=source),
            streaming_kernels=dict(streaming.fit_sweep_rows(sweep_rows), source=source),
            fp8_gemms=dict(tensor_cores.fit_sweep_gemms(sweep_rows, "fp8"), source=source))
    # the H100's: tensor-core GEMMs (XLA's H100 table), the unaligned slowdown, channels-last
    constants = {}
    for arithmetic, precision in (("half", "bf16"), ("tf32", "tf32")):
        f = tensor_cores.fit_sweep_gemms(sweep_rows, precision)
        constants[arithmetic] = dict(share_compute=f["share_compute"],
                                     share_memory=f["share_memory"], fixed_ms=0.0,
                                     rows=f["rows"], mape=f["mape"])
    return dict(tensor_core_gemms=dict(constants=constants, gpu=f["gpu"], source=source),
                unaligned_gemms=None, channels_last=None)  # the H200 swept neither


def fitted_host(model, held: str, data: Path) -> float:
    """The PyTorch host (ms a kernel) `model` best explains the other GPU's lease machines'
    launch-bound steps with (`gpu_fit.best_host`)."""
    from mdot_jax.gpu import gpu_fit

    return gpu_fit.best_host([k for m, (_, device) in LEASES.items() if device == OTHER[held]
                              for k in core_kernels(model, m, data)])[0]


def held_out_models(held: str, data: Path, work: Path) -> tuple[dict[str, Path], dict]:
    """The held-out step model's folder under `work` (`held_out`), with the two halves of
    the change apart (`constants_only`, `host_only`: where the loss comes from), and what it
    changed."""
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR
    from mdot_jax.measure import kernel_sweep
    from mdot_jax.storage.checkpoint import step_model_copy

    info = held_out_info(held, kernel_sweep.read(SWEEPS[OTHER[held]]))
    w = work / held.replace(" ", "-")
    constants = step_model_copy(STEP_MODEL_DIR, w / "constants_only", **info)
    host = fitted_host(StepModel.load(constants), held, data)
    hosts = dict(shipped_info()["host_ms_per_kernel"], pytorch=host)
    return dict(held_out=step_model_copy(constants, w / "held_out", host_ms_per_kernel=hosts),
                constants_only=constants,
                host_only=step_model_copy(STEP_MODEL_DIR, w / "host_only",
                                          host_ms_per_kernel=hosts)
                ), dict(info, pytorch_host_ms=host)


def sets_of(held: str) -> dict[str, list[str]]:
    """Each lease machine's derived datasets of `held`, by machine."""
    return {m: list(sets) for m, (sets, device) in LEASES.items() if device == held}


def llm(held: str, folder: Path | None) -> dict:
    """MAPE and median ratio of `held`'s LLM steps priced with the step model `folder`."""
    from bench_llm_steps import price

    rows = [json.loads(x) for x in Path(LLM_STEPS[held]).read_text().splitlines() if x.strip()]
    priced, skipped = price(rows, checkpoint=str(folder) if folder else None)
    ratio = np.asarray([r["predicted_ms"] / r["measured_ms"] for r in priced])
    return dict(rows=len(priced), skipped=len(skipped),
                mape=float(100 * np.mean(np.abs(ratio - 1))), median_ratio=float(np.median(ratio)))


def _save(path: Path, r: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(r, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/hopper-held-out"))
    args = ap.parse_args(argv)
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    r = json.loads(path.read_text()) if path.exists() else {}
    for held in SWEEPS:
        g = r.setdefault(held, {})
        folders, g["changed"] = held_out_models(held, args.data, args.work)
        models = dict(shipped=StepModel.load(STEP_MODEL_DIR),
                      **{k: StepModel.load(f) for k, f in folders.items()})
        for machine, sets in sets_of(held).items():
            for scope, keep in (("gpu_set", lambda s: not core(s)), ("core_set", core)):
                for precision in ("amp-bf16", "fp32"):
                    name = f"{machine}/{precision}/{scope}"
                    chosen = [args.data / d for d in sets if precision in d]
                    if name not in g and chosen:
                        print(name, file=sys.stderr)
                        g[name] = steps(chosen, held, models, keep=keep)
                        _save(path, r)
        for which, f in (("shipped", None), ("held_out", folders["held_out"])):
            if f"llm/{which}" not in g:
                g[f"llm/{which}"] = llm(held, f)
                _save(path, r)
    for held, g in r.items():
        for name, v in g.items():
            if "all" in v:
                kinds = "  ".join(f"{k} {v[k]['rows']}: {v[k]['shipped']['mape']:.1f}% -> "
                                  f"{v[k]['held_out']['mape']:.1f}% (median "
                                  f"{v[k]['held_out']['median_ratio']:.2f})"
                                  for k in ("all", "transformer", "cnn") if k in v)
                print(f"{held} {name}: {kinds}")
        print(f"{held} LLM steps: {g['llm/shipped']['mape']:.1f}% -> "
              f"{g['llm/held_out']['mape']:.1f}% (median {g['llm/held_out']['median_ratio']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
