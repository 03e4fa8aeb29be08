"""Measured LLM training steps on one GPU: our own ground truth for fused attention, activation
checkpointing and the tokens/s of a decoder, what `mdot predict` prices from a config.

    python -m mdot_jax.measure.llm_steps OUT.jsonl [--seconds 120] [--dry-run]

The steps: first one GEMM-bound step (a 1.3B GPT-2, 24 layers of 2048, at 2,048 tokens,
flash attention, no checkpointing), then GPT-2-style decoders (124M: 12 layers of 768; 350M:
24 of 1024; Hugging Face's `GPT2LMHeadModel`, GELU with erf) at 1,024, 2,048 and 4,096
tokens, each with attention `flash` (`attn_implementation="sdpa"`: PyTorch picks
FlashAttention) and `eager`, with and without full activation checkpointing
(`gradient_checkpointing_enable`); micro-batches of 8,192 tokens, autocast to bf16, AdamW
(torch.optim's default implementation). A step is forward,
cross-entropy over the vocabulary, backward and the update, CUDA synchronised; 2 untimed, then
the median of 5. Each row carries the config and the fields of a `TrainingJob` that prices it,
the peak memory allocated, what the host issued in one more step under the profiler (kernel
launches on a GPU, ATen operators), the GPU's busy time in that step (`gpu_ms`: its kernels'
own times summed) and its `BUSIEST` kernels by time (name, launches, ms; on a CPU the ATen
operators by their own host time), or why it could not run (out of memory). Rows are
appended as they are measured and a second run skips what is there; no step starts after
`--seconds`. On a CPU (`--dry-run`) a 2-layer model of width 64 at 64 tokens, fp32.
"""

from __future__ import annotations

import statistics
import sys
import time

from mdot_jax.measure import resumable

SIZES = {"gpt2-124m": dict(n_layer=12, n_embd=768, n_head=12),
         "gpt2-350m": dict(n_layer=24, n_embd=1024, n_head=16)}
TOKENS = (1024, 2048, 4096)
# one step where the GEMMs are the time (what an FSDP shard of an LLM runs), measured first
GEMM_BOUND = ("gpt2-1.3b", dict(n_layer=24, n_embd=2048, n_head=16), 2048, "flash", None)
BATCH_TOKENS = 8192
DRY = {"gpt2-tiny": dict(n_layer=2, n_embd=64, n_head=4)}
BUSIEST = 30  # kernels (ATen operators on a CPU) of the profiled step kept, by time


def plan(dry: bool) -> list[dict]:
    """Every step to measure, as the rows' `job` and `config`: the GEMM-bound one, then
    the rest smallest first."""
    steps = [] if dry else [GEMM_BOUND]
    steps += [(name, size, tokens, attention, ckpt)
              for name, size in (DRY if dry else SIZES).items()
              for tokens in ((64,) if dry else TOKENS)
              for attention in ("flash", "eager") for ckpt in (None, "full")]
    return [dict(key=f"{name}/t{tokens}/{attention}/{ckpt or 'none'}",
                 config=dict(model_type="gpt2", vocab_size=50257, n_positions=tokens,
                             activation_function="gelu", **size),
                 job=dict(seq_len=tokens, batch_size=2 if dry else BATCH_TOKENS // tokens,
                          precision="fp32" if dry else "amp-bf16", optimizer="adamw",
                          attention=attention, activation_checkpointing=ckpt))
            for name, size, tokens, attention, ckpt in steps]


def measure(row: dict, device: str, warmup: int = 2, repeats: int = 5) -> dict:
    """The row with `ms` (median), `ms_all` and `peak_gb`, or `error` (out of memory)."""
    import torch
    import transformers

    job, cfg = row["job"], dict(row["config"])
    cfg.pop("model_type")
    impl = "sdpa" if job["attention"] == "flash" else "eager"
    torch.manual_seed(0)
    with torch.device(device):  # built where it trains: a 1.3B model in a second, not a minute
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            **cfg, use_cache=False, attn_implementation=impl))
    if job["activation_checkpointing"]:  # the newer name where the installed version has it
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg["vocab_size"], (job["batch_size"], job["seq_len"]), device=device)
    half = job["precision"] == "amp-bf16"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=half):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(warmup + repeats):
            sync()
            t = time.perf_counter()
            step()
            sync()
            if i >= warmup:
                times.append(1e3 * (time.perf_counter() - t))
        peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
        return dict(row, ms=statistics.median(times), ms_all=times, peak_gb=peak,
                    **_counts(step, device))
    except torch.OutOfMemoryError:
        return dict(row, error="out of memory")


def _counts(step, device: str) -> dict:
    """What the host issues in one more `step`, under the profiler (after the timed ones):
    `launches`, the kernels launched (CUDA's launch calls; None on a CPU), and `aten_ops`, the
    ATen operators dispatched, nested ones included."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                 ) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    if cuda:  # the kernels, by their own GPU time
        timed = [(e.key, e.count, e.self_device_time_total / 1e3) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA]
    else:  # the ATen operators, by their own host time
        timed = [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in events
                 if e.key.startswith("aten::")]
    timed.sort(key=lambda x: -x[2])
    return dict(launches=sum(e.count for e in events if "LaunchKernel" in e.key) if cuda
                else None, aten_ops=sum(e.count for e in events if e.key.startswith("aten::")),
                gpu_ms=sum(t for *_, t in timed) if cuda else None,
                busiest=[[name[:100], n, round(t, 4)] for name, n, t in timed[:BUSIEST]])


def main(argv: list[str] | None = None) -> int:
    return resumable.main(argv, __doc__.splitlines()[0], plan, measure)


if __name__ == "__main__":
    sys.exit(main())
