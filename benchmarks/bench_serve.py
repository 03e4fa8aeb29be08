"""How fast the scheduler-facing paths answer: `mdot plan` over every GPU x 4 counts, and
`mdot serve` under 1 and 8 concurrent clients.

    python benchmarks/bench_serve.py --out benchmarks/results/serve

What is measured (on this machine, nothing else heavy running):
1. `plan`: a 1,451-operator model (a 32-layer GPT-2-style decoder of width 512 at 2,048
   tokens, built on the meta device) on all 22 catalogued GPUs x 1, 2, 4, 8 GPUs, AMP bf16,
   FSDP, 1e9 tokens: wall time of `serving.plan.plan`, the conversion included (target: 10 s).
2. `serve`: `mdot serve` started as its own process; a ResNet-50 uploaded once; then for 10 s
   each, 1 and 8 client threads (httpx) posting /v1/predict (AMP fp16, batch 64): the same
   request over and over (`repeated`: the service's answer cache after the first); `distinct`
   requests of the cached model (GPU type and count change every time, over the GPUs priced
   from their spec sheets: each priced); and
   `new-batch` (batch sizes 1-4096: each converted and priced). Reported: requests/s, p50
   and p99 latency (target: 50 requests/s with 8 clients for a cached model).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _plan(tmp: Path) -> dict:
    import onnx

    from converters import from_hf_config
    from mdot_jax.serving import plan as planning
    from mdot_jax.serving.request import TrainingJob

    path = tmp / "gpt.onnx"
    onnx.save(from_hf_config(dict(model_type="gpt2", n_embd=512, n_layer=32, n_head=8,
                                  n_positions=2048, vocab_size=50257), seq_len=2048), path)
    job = TrainingJob(model=str(path), batch_size=4, seq_len=2048, precision="amp-bf16",
                      strategy="fsdp", optimizer="adamw", train_tokens=10 ** 9,
                      gpus=(1, 2, 4, 8))
    t = time.perf_counter()
    options = planning.plan(planning.Plan(job))
    seconds = time.perf_counter() - t
    ops = options[0].prediction.num_ops if options[0].prediction else None
    return dict(plans=len(options), operators=ops, seconds=seconds)


def _serve(tmp: Path, seconds: float) -> dict:
    import httpx
    import onnx
    import torch
    import torchvision

    from converters import from_torch

    model = tmp / "resnet50.onnx"
    onnx.save(from_torch(torchvision.models.resnet50(), torch.randn(2, 3, 224, 224)), model)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", "import sys; from mdot_jax.cli import "
                               "main; sys.exit(main(sys.argv[1:]))", "serve", "--port",
                               str(port), "--cache-dir", str(tmp / "cache")])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=120) as c:
            sha = c.post("/v1/models", content=model.read_bytes()).json()["model"]
            job = dict(model=sha, device="h100-sxm", precision="amp-fp16", batch_size=64)
            c.post("/v1/predict", json=job)  # the conversion and the step model, once
        out = {}
        for mode in ("repeated", "distinct", "new-batch"):
            for clients in (1, 8):
                out[f"{mode}/{clients}"] = _load(url, job, mode, clients, seconds)
                print(mode, clients, out[f"{mode}/{clients}"], file=sys.stderr)
        return out
    finally:
        server.terminate()
        server.wait(30)


def _load(url: str, job: dict, mode: str, clients: int, seconds: float) -> dict:
    import httpx

    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.spec_sheet import spec_gpu

    devices = [g.name for g in catalog.catalog().values()  # priced from their spec sheets
               if g.tflops.get("fp16") and spec_gpu(g.name, None, None)]

    latencies: list[float] = []
    errors = [0]
    counter = iter(range(10 ** 9))
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client():
        with httpx.Client(base_url=url, timeout=120) as c:
            while time.perf_counter() < stop:
                with lock:
                    n = next(counter)
                body = job if mode == "repeated" else dict(job, batch_size=1 + n % 4096) \
                    if mode == "new-batch" else dict(job, device=devices[n % len(devices)],
                                                     gpus=1 + n // len(devices))
                t = time.perf_counter()
                r = c.post("/v1/predict", json=body)
                with lock:
                    latencies.append(time.perf_counter() - t)
                    errors[0] += r.status_code != 200
    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = sorted(1e3 * x for x in latencies)
    return dict(requests=len(ms), errors=errors[0], requests_per_s=len(ms) / wall,
                p50_ms=statistics.median(ms), p99_ms=ms[min(len(ms) - 1, int(0.99 * len(ms)))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = dict(plan=_plan(Path(tmp)), serve=_serve(Path(tmp), args.seconds))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"plan: {result['plan']['plans']} plans in {result['plan']['seconds']:.1f} s")
    for k, v in result["serve"].items():
        print(f"serve {k}: {v['requests_per_s']:.1f} requests/s, p99 {v['p99_ms']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
