"""Memory-bound kernels at a measured share of the bandwidth, the host the machine's: adopted or
not.

    python benchmarks/bench_machine_host.py --vtrain ../shared/datasets/vtrain \
        --neusight ../shared/datasets/neusight --onnx /tmp/ns-onnx \
        --out benchmarks/results/machine-host

Why (docs/studies/streaming-kernels.md): memory-bound kernels priced as the H200's sweep
measured them brought NeuSight's unseen GPUs from 15.3% to 8.3% and vTrain's multi-node rows
from 9.9% to 7.4%, but the host's time per kernel fitted on the H200 lease (33.7 us) made the
small steps of other machines too fast. The kit measured the same launch-bound steps (64 px /
32 tokens, the same models and batches) on three lease machines: the H100 of the first lease
took a median 1.49x the H200 lease's time, the second lease's 1.19x, on GPUs of the same SMs
and clock. The host is the machine's (and the framework's), not the GPU's.

Candidate: the shipped step model with
1. `streaming_kernels` (`gpu.streaming`): every memory-bound kernel at the constants fitted
   on the H200 sweep's add, mul, gelu, layer norm and softmax kernels (as in the streaming
   study), and
2. a host per framework (`host_ms_per_kernel`): `pytorch` fitted (`gpu_fit.best_host`) on the
   launch-bound steps (64 px / 32 tokens) of all three lease machines pooled (H200, H100 lease
   1, H100 lease 2); `megatron` chosen on vTrain's single-node rows of two of its eight
   models, hidden 1,024 x 12 layers and hidden 2,048 x 24 layers (360 rows, the calibration
   rows), of every other point of `gpu_fit.HOST_GRID` from 15 to 100 us the one of the least
   MAPE.
Baseline A: the shipped model. Baseline B: the shipped model with the two hosts fitted the
same way on the same rows (the same budget).

The rule, written before any confirming set is priced with the candidate or baseline B:
1. Five confirming sets, none of them in any fit: (a) vTrain's single-node rows of the other
   six models (1,080 rows), (b) its 109 multi-node rows (both `--framework megatron`);
   (c) our H100 GPU set, 224 px / 256 tokens, of the second lease and its confirming machine
   (AMP bf16 and fp32; the same machines as fitted core-set steps, other workloads);
   (d) timm's RTX 3090 NCHW rows (804, AMP fp16); (e) NeuSight's unseen GPUs' training
   labels from ONNX (fp32 fwd-bwd).
2. The candidate is adopted if, against each baseline, its MAPE is lower on at least 3 of the
   5 and higher on none by more than 2 points. If it is not, baseline B is adopted if it
   passes the same test against baseline A; otherwise nothing.
3. Reported whatever the outcome: all 1,440 single-node rows, the calibration rows, the H200
   GPU set (224 px / 256 tokens: not in the host fit), the fitted core-set steps per machine.
Seeds: none are drawn; every fit is a grid search or least squares. Resumable by stage from
`--out`/results.json; once shipped (`--ship`), the shipped model is the candidate, so a fresh
run compares it with itself: keep the results file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mdot_jax.gpu import gpu_fit
from mdot_jax.storage.checkpoint import step_model_copy

sys.path.insert(0, str(Path(__file__).parent))
from bench_tensor_cores import TIMM, steps  # noqa: E402
from bench_vtrain import _rows  # noqa: E402

SWEEP = Path("data/gpu-nvidia-h200/kernels.jsonl.xz")
LEASES = {  # derived datasets of each lease machine, and the GPU it had
    "h200": (("gpu-nvidia-h200-core-amp-bf16-fused", "gpu-nvidia-h200-amp-bf16-fused",
              "gpu-nvidia-h200-fp32-fused"), "h200 sxm"),
    "h100-lease-1": (("gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused",
                      "gpu-nvidia-h100-80gb-hbm3-fp32-fused"), "h100 sxm"),
    "h100-lease-2": (("gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused",
                      "gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused",
                      "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-amp-bf16-fused",
                      "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-fp32-fused"), "h100 sxm"),
}
CALIBRATION = {(1024, 12), (2048, 24)}  # vTrain models (hidden, layers) the megatron host sees
MEGATRON_GRID = [float(h) for h in gpu_fit.HOST_GRID[::2] if 0.015 <= h <= 0.1]  # 10 hosts


def core(s) -> bool:
    """A launch-bound core-set step (64 px / 32 tokens), not the GPU set (224 px / 256)."""
    return s.workload.input_size < 128


def core_kernels(model, machine: str, data: Path) -> list[tuple[list[float], float]]:
    """`gpu_fit.step_kernels` of a lease machine's (`LEASES`) launch-bound steps, priced by
    `model`: what its host is fitted on (`gpu_fit.best_host`)."""
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.gpu import catalog

    sets, device = LEASES[machine]
    return gpu_fit.step_kernels(model, [s for d in sets for s in load_dataset(
        str(data / d)).samples if core(s)], catalog.find(device))


def vtrain(data: Path, jobs: dict, scope: str, models: list[str] = ()) -> dict:
    """{name: {key: predicted / measured}} of vTrain's `scope` rows (of `models`
    'HIDDEN:LAYERS' if given) priced by `bench_vtrain.py` with Megatron's kernels, each job
    (name -> (checkpoint, folder), resumable there) in its own process, side by side."""
    procs = [subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("bench_vtrain.py")), str(data), "--only",
         scope, "--out", str(out), "--framework", "megatron", "--checkpoint", str(ckpt)]
        + [a for m in models for a in ("--model", m)], stdout=subprocess.DEVNULL)
        for ckpt, out in jobs.values()]
    if any(p.wait() for p in procs):
        raise SystemExit("bench_vtrain.py failed")
    measured = {r["key"]: r["ms"] for r in _rows(data)}
    return {name: {d["key"]: d["predicted_ms"] / measured[d["key"]] for d in map(
        json.loads, (out / "predictions.jsonl").read_text().splitlines())}
        for name, (_, out) in jobs.items()}


def mape(ratios) -> float:
    return float(100 * np.mean(np.abs(np.asarray(list(ratios)) - 1)))


def neusight_onnx(root: Path, cache: Path, ckpt: Path | None, out: Path) -> float:
    """MAPE of NeuSight's unseen GPUs' training labels, from ONNX, priced with `ckpt`."""
    if not (out / "onnx.json").exists():
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_gpu_ops.py")),
                        str(root), "--onnx", str(cache), "--out", str(out)]
                       + (["--model", str(ckpt)] if ckpt else []), check=True)
    return json.loads((out / "onnx.json").read_text())["mape"]["(unseen)"]["predicted"]


def decide(sets: dict) -> dict:
    """The rule's second point on `sets` (name -> {model: MAPE})."""
    def passes(new: str, old: str) -> dict:
        delta = {k: v[new] - v[old] for k, v in sets.items()}
        lower = sum(d < 0 for d in delta.values())
        return dict(delta=delta, lower=lower, passes=lower >= 3 and max(delta.values()) <= 2.0)
    c_a, c_b, b_a = (passes("candidate", "shipped"), passes("candidate", "shipped_hosts"),
                     passes("shipped_hosts", "shipped"))
    adopted = "candidate" if c_a["passes"] and c_b["passes"] else \
        "shipped_hosts" if b_a["passes"] else None
    return dict(candidate_vs_shipped=c_a, candidate_vs_shipped_hosts=c_b,
                shipped_hosts_vs_shipped=b_a, adopted=adopted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vtrain", type=Path, required=True)
    ap.add_argument("--neusight", type=Path, required=True)
    ap.add_argument("--onnx", type=Path, required=True, help="bench_gpu_ops.py's export cache")
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ship", action="store_true", help="once decided: write what the rule "
                    "adopted into the shipped step model's meta")
    ap.add_argument("--work", type=Path, default=Path("/tmp/machine-host"),
                    help="checkpoints and per-row predictions (not results)")
    args = ap.parse_args(argv)
    from mdot_jax.gpu import streaming
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR
    from mdot_jax.measure.kernel_sweep import read

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    r = json.loads(path.read_text()) if path.exists() else {}  # resumable by stage

    def save():
        path.write_text(json.dumps(r, indent=1) + "\n")

    w = args.work
    ckpts = {"shipped": STEP_MODEL_DIR}
    if "streaming_kernels" not in r:
        r["streaming_kernels"] = dict(streaming.fit_sweep_rows(read(SWEEP)), source=str(SWEEP))
        save()
    bases = {"shipped_hosts": STEP_MODEL_DIR,
             "candidate": step_model_copy(STEP_MODEL_DIR, w / "streaming",
                                          streaming_kernels=r["streaming_kernels"])}
    for name, base in bases.items():  # 1. the pytorch host, pooled over the three machines
        key = f"{name}/host_pytorch"
        if key not in r:
            model = StepModel.load(base)
            r[key] = gpu_fit.best_host([k for m in LEASES for k in core_kernels(
                model, m, args.data)])
            save()
        print(f"{name}: pytorch host {1e3 * r[key][0]:.1f} us", file=sys.stderr)
    if not all(f"{n}/host_megatron" in r for n in bases):  # 2. the megatron host
        grid: dict = {n: {} for n in bases}
        for h in MEGATRON_GRID:
            us = f"{1e3 * h:.1f}"
            jobs = {n: (step_model_copy(b, w / f"{n}-{us}us",
                                        host_ms_per_kernel=dict(megatron=h)),
                        w / f"vtrain-{n}-{us}us") for n, b in bases.items()}
            ratios = vtrain(args.vtrain, jobs, "single",
                            [f"{hd}:{ly}" for hd, ly in sorted(CALIBRATION)])
            for n, v in ratios.items():
                grid[n][us] = mape(v.values())
                print(f"{n}: megatron host {us} us: {grid[n][us]:.1f}% over {len(v)} "
                      "calibration rows", file=sys.stderr)
        for n, g in grid.items():
            best = min(g, key=g.__getitem__)
            r[f"{n}/host_megatron"] = dict(ms=float(best) / 1e3, calibration_mape=g[best],
                                           grid=g)
        save()
    for n, b in bases.items():
        ckpts[n] = step_model_copy(b, w / n, host_ms_per_kernel=dict(
            pytorch=r[f"{n}/host_pytorch"][0], megatron=r[f"{n}/host_megatron"]["ms"]))
    models = {n: StepModel.load(c) for n, c in ckpts.items()}
    for name, sets, device, keep, layout in (
            ("h100_gpu_set", LEASES["h100-lease-2"][0], "h100 sxm", lambda s: not core(s), None),
            ("rtx3090_timm_nchw", (TIMM,), "rtx 3090", None, "nchw"),
            ("h200_gpu_set", LEASES["h200"][0], "h200 sxm", lambda s: not core(s), None),
            ("h100_lease_1_core", LEASES["h100-lease-1"][0], "h100 sxm", core, None),
            ("h100_lease_2_core", LEASES["h100-lease-2"][0], "h100 sxm", core, None),
            ("h200_core", LEASES["h200"][0], "h200 sxm", core, None)):
        if name not in r:
            print(f"pricing {name}", file=sys.stderr)
            r[name] = steps([args.data / d for d in sets], device, models, layout, keep)
            save()
    committed = Path(__file__).parent / "results" / "vtrain-megatron" / "predictions.jsonl"
    rows = {x["key"]: (x["hidden"], x["layers"]) for x in _rows(args.vtrain)}
    for scope in ("single", "multi"):
        key = f"vtrain_{scope}"
        if key not in r:
            shipped = w / f"vtrain-shipped-{scope}"  # the shipped model's committed predictions
            shipped.mkdir(parents=True, exist_ok=True)
            (shipped / "predictions.jsonl").write_text("".join(
                line for line in committed.open() if json.loads(line)["key"].startswith(scope)))
            by = vtrain(args.vtrain, {n: (c, w / f"vtrain-{n}-{scope}")
                                      for n, c in ckpts.items()}, scope)
            r[key] = {part: {n: dict(mape=mape(v[k] for k in v if sel(rows[k])),
                                     median_ratio=float(np.median(
                                         [v[k] for k in v if sel(rows[k])])),
                                     rows=sum(sel(rows[k]) for k in v))
                             for n, v in by.items()}
                      for part, sel in (("all", lambda m: True),
                                        ("held_out", lambda m: m not in CALIBRATION),
                                        ("calibration", lambda m: m in CALIBRATION))
                      if scope == "single" or part == "all"}
            save()
    if "neusight_onnx_unseen" not in r:  # the shipped model's: the streaming study's status quo
        shipped = args.out / "ns-shipped" / "onnx.json"  # (the same model at fp32)
        shipped.parent.mkdir(exist_ok=True)
        shipped.write_bytes((Path(__file__).parent / "results" / "streaming-h200" /
                             "ns-status_quo" / "onnx.json").read_bytes())
        r["neusight_onnx_unseen"] = {
            n: neusight_onnx(args.neusight, args.onnx, None if n == "shipped" else c,
                             args.out / f"ns-{n}") for n, c in ckpts.items()}
        save()
    sets = {"vtrain_single_held_out": {n: v["mape"] for n, v in
                                       r["vtrain_single"]["held_out"].items()},
            "vtrain_multi": {n: v["mape"] for n, v in r["vtrain_multi"]["all"].items()},
            "h100_gpu_set": {n: r["h100_gpu_set"]["all"][n]["mape"] for n in ckpts},
            "rtx3090_timm_nchw": {n: r["rtx3090_timm_nchw"]["all"][n]["mape"] for n in ckpts},
            "neusight_onnx_unseen": r["neusight_onnx_unseen"]}
    r["decision"] = decide(sets)
    save()
    print(json.dumps(dict(sets=sets, decision=r["decision"]), indent=1))
    if args.ship and r["decision"]["adopted"]:
        ship(r, r["decision"]["adopted"])
    return 0


def ship(r: dict, adopted: str) -> None:
    """The shipped step model's meta gains what the rule adopted: the hosts (and the
    candidate's streaming kernels), its command saying how each was fitted."""
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    path = STEP_MODEL_DIR / StepModel.META
    meta = json.loads(path.read_text())
    if adopted == "candidate":
        meta["streaming_kernels"] = r["streaming_kernels"]
    meta["host_ms_per_kernel"] = dict(pytorch=r[f"{adopted}/host_pytorch"][0],
                                      megatron=r[f"{adopted}/host_megatron"]["ms"])
    meta["host_source"] = (
        "pytorch: gpu_fit.best_host over the launch-bound steps (64 px / 32 tokens) of three "
        f"lease machines pooled ({', '.join(d for sets, _ in LEASES.values() for d in sets)}); "
        "megatron: the least MAPE on vTrain's single-node rows of two models (hidden 1,024 x 12 "
        "and 2,048 x 24 layers), benchmarks/bench_machine_host.py")
    meta["command"] = meta["command"].split(" --streaming-kernels")[0] + (
        f" --streaming-kernels {SWEEP}" if adopted == "candidate" else "") + (
        "; the hosts: python benchmarks/bench_machine_host.py --vtrain ../shared/datasets/vtrain "
        "--neusight ../shared/datasets/neusight --onnx CACHE --out "
        "benchmarks/results/machine-host --ship")
    path.write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
