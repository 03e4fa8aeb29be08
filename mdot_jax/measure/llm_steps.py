"""Measured LLM training steps on one GPU: our own ground truth for fused attention, activation
checkpointing and the tokens/s of a decoder, what `mdot predict` prices from a config.

    python -m mdot_jax.measure.llm_steps OUT.jsonl [--seconds 120] [--dry-run] [--keys-with TEXT]

The steps: first one GEMM-bound step (a 1.3B GPT-2, 24 layers of 2048, at 2,048 tokens,
flash attention, no checkpointing), then two mixtures of experts at 2,048 tokens (a Mixtral of
8 experts, top 2, and a Qwen3-MoE of 64, top 8; 8 layers of 1024, with the experts
implementation transformers picks, recorded), then GPT-2-style decoders (124M: 12 layers of
768; 350M: 24 of 1024; Hugging Face's `GPT2LMHeadModel`, GELU with erf) at 1,024, 2,048 and 4,096
tokens, each with attention `flash` (`attn_implementation="sdpa"`: PyTorch picks
FlashAttention) and `eager`, with and without full activation checkpointing
(`gradient_checkpointing_enable`); after the mixtures, the 1.3B and the 124M fine-tuned with
LoRA (`converters.lora`: rank 16 on every linear layer but the head, the rest frozen; at 2,048
and 1,024 tokens, flash) and the 124M trained with torch.optim.Muon over its weight matrices
(AdamW over the embeddings, norms and biases), then a vision-language model fine-tuned
on one 448 x 448 image a sample (`VLM`: Qwen2.5-VL's 32-block encoder, whose windows
transformers' SDPA path runs as a loop of calls, before a 24-layer text model of 896; 1,024
tokens a sample, the image's 256 among them, as its processor lays them out: `_image_text`),
the 124M and the 1.3B trained in bf16 throughout (`model.to(torch.bfloat16)`, no autocast:
`BF16`, beside their autocast twins);
last, the 124M (1,024 tokens) and the 1.3B
compiled with `torch.compile` (Inductor, its default mode; the kit measures them in a step of
its own, `--keys-with /compiled`), each beside its eager twin; micro-batches of 8,192 tokens,
autocast to bf16, AdamW (torch.optim's default implementation, over the trained parameters).
A step is forward, cross-entropy over the vocabulary, backward and the update, CUDA
synchronised; 2 untimed (a compiled model compiles in them), then the median of 5. Each row
carries the config and the fields of a `TrainingJob` that prices it, the peak memory
allocated, what the host issued in one more step under the profiler (kernel launches on a
GPU, ATen operators), the GPU's busy time in that step (`gpu_ms`: its kernels' own times
summed), its `BUSIEST` kernels by time (name, launches, ms; on a CPU the ATen operators by
their own host time) and who ran the time (`callers`: ATen operators and backward functions,
`profiler.CALLERS`), or why it could not run (out of memory, a failed compilation). Rows
are appended as they are measured and a second run skips what is there; no step starts after
`--seconds`. On a CPU (`--dry-run`) a 2-layer model of width 64 at 64 tokens, fp32 (compiled
by AOTAutograd alone: no code generated; the vision-language model's 2 blocks on 112 x 112
images).
"""

from __future__ import annotations

import statistics
import time

from converters.hf_config import EXPERT_COUNTS
from converters.lora import add_adapters
from mdot_jax.measure import resumable
from mdot_jax.measure.profiler import profiled

SIZES = {"gpt2-124m": dict(n_layer=12, n_embd=768, n_head=12),
         "gpt2-350m": dict(n_layer=24, n_embd=1024, n_head=16)}
TOKENS = (1024, 2048, 4096)
# one step where the GEMMs are the time (what an FSDP shard of an LLM runs), measured first
GEMM_BOUND = ("gpt2-1.3b", dict(n_layer=24, n_embd=2048, n_head=16), 2048, "flash", None)
# mixtures of experts (`converters.experts` prices them as balanced routing): real routing
MOE = {"mixtral-0.8b": dict(model_type="mixtral", hidden_size=1024, intermediate_size=3584,
                            num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                            num_local_experts=8, num_experts_per_tok=2, vocab_size=32000),
       "qwen3moe-0.6b": dict(model_type="qwen3_moe", hidden_size=1024, intermediate_size=3072,
                             moe_intermediate_size=512, num_hidden_layers=8, head_dim=64,
                             num_attention_heads=16, num_key_value_heads=4, num_experts=64,
                             num_experts_per_tok=8, vocab_size=32000)}
BATCH_TOKENS = 8192
LORA = (("gpt2-1.3b", GEMM_BOUND[1], 2048), ("gpt2-124m", SIZES["gpt2-124m"], 1024))
LORA_RANK = 16
# steps compiled with torch.compile (Inductor, its default mode; on a CPU's dry run
# AOTAutograd without code generation), each beside an eager twin of the plan
COMPILED = (("gpt2-124m", SIZES["gpt2-124m"], 1024), GEMM_BOUND[:3])
# torch.optim.Muon over the weight matrices, AdamW over the rest (`gpu.muon`)
MUON = ("gpt2-124m", SIZES["gpt2-124m"], 1024)
# the whole model in bfloat16 (weights, gradients, AdamW's state), beside autocast twins
BF16 = (("gpt2-124m", SIZES["gpt2-124m"], 1024), GEMM_BOUND[:3])
# a vision-language model fine-tuned on one image a sample (`converters.vision_language`):
# Qwen2.5-VL's encoder (its windows a loop of SDPA calls) before a Qwen2.5-0.5B-shaped text
VLM = ("qwen2.5-vl-1.2b", dict(
    model_type="qwen2_5_vl", image_token_id=151655, video_token_id=151656,
    vision_start_token_id=151652,
    text_config=dict(model_type="qwen2_5_vl_text", hidden_size=896, intermediate_size=4864,
                     num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     vocab_size=151936, tie_word_embeddings=True,
                     rope_scaling=dict(type="mrope", mrope_section=[8, 12, 12])),
    vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                       out_hidden_size=896, patch_size=14, spatial_merge_size=2,
                       temporal_patch_size=2, window_size=112, in_chans=3,
                       fullatt_block_indexes=[7, 15, 23, 31])), 1024, 448)
DRY = {"gpt2-tiny": dict(n_layer=2, n_embd=64, n_head=4)}
DRY_VLM = ("qwen2.5-vl-tiny", dict(
    VLM[1], image_token_id=500, video_token_id=501, vision_start_token_id=502,
    text_config=dict(model_type="qwen2_5_vl_text", hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=512, rope_scaling=dict(type="mrope", mrope_section=[2, 3, 3])),
    vision_config=dict(VLM[1]["vision_config"], depth=2, hidden_size=32, intermediate_size=64,
                       num_heads=4, out_hidden_size=64, window_size=56,
                       fullatt_block_indexes=[1])), 64, 112)
DRY_MOE = {"mixtral-tiny": dict(model_type="mixtral", hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2, vocab_size=1000)}


def plan(dry: bool) -> list[dict]:
    """Every step to measure, as the rows' `job` and `config`: the GEMM-bound one, the
    mixtures of experts, the LoRA ones, the Muon one, the rest smallest first, then the
    compiled ones."""
    gpt2 = dict(model_type="gpt2", vocab_size=50257, activation_function="gelu")

    def twins(rows, how: dict) -> list:  # (name, size, tokens): flash, with the fields `how`
        return [(name, dict(gpt2, **size), tokens, "flash", None, how) for name, size, tokens
                in ([(n, s, 64) for n, s in DRY.items()] if dry else rows)]

    steps = [] if dry else [(GEMM_BOUND[0], dict(gpt2, **GEMM_BOUND[1]), *GEMM_BOUND[2:], {})]
    steps += [(name, config, 64 if dry else 2048, "flash", None, {})
              for name, config in (DRY_MOE if dry else MOE).items()]
    steps += twins(LORA, {"lora_rank": LORA_RANK}) + twins([MUON], {"optimizer": "muon"})
    name, config, tokens, side = DRY_VLM if dry else VLM
    steps.append((name, config, tokens, "flash", None, {"image_size": side}))
    steps += twins(BF16, {"precision": "bf16"})
    steps += [(name, dict(gpt2, **size), tokens, attention, ckpt, {})
              for name, size in (DRY if dry else SIZES).items()
              for tokens in ((64,) if dry else TOKENS)
              for attention in ("flash", "eager") for ckpt in (None, "full")]
    steps += twins(COMPILED, {"compile": True})
    return [dict(key=f"{name}/t{tokens}/{attention}/{ckpt or 'none'}{_mark(how)}",
                 config=dict(config, **({_POSITIONS[config["model_type"]]: tokens}
                                        if config["model_type"] in _POSITIONS else {})),
                 job={**dict(seq_len=tokens, batch_size=2 if dry else BATCH_TOKENS // tokens,
                             precision="fp32" if dry else "amp-bf16", optimizer="adamw",
                             attention=attention, activation_checkpointing=ckpt), **how})
            for name, config, tokens, attention, ckpt, how in steps]


def _mark(how: dict) -> str:
    """The end of a row's key for the job's fields beside the plan's own (`/lora16`,
    `/compiled`, `/muon`, `/bf16`): its twin's key is the rest."""
    return (f"/lora{how['lora_rank']}" if "lora_rank" in how else "") + \
        ("/compiled" if how.get("compile") else "") + \
        (f"/{how['optimizer']}" if "optimizer" in how else "") + \
        (f"/{how['precision']}" if "precision" in how else "")


# a config's positions, set to the row's tokens (a vision-language model keeps its own)
_POSITIONS = {"gpt2": "n_positions", "mixtral": "max_position_embeddings",
              "qwen3_moe": "max_position_embeddings"}


def measure(row: dict, device: str, warmup: int = 2, repeats: int = 5) -> dict:
    """The row with `ms` (median), `ms_all` and `peak_gb`, or `error` (out of memory)."""
    import torch
    import transformers

    job, cfg = row["job"], dict(row["config"])
    impl = "sdpa" if job["attention"] == "flash" else "eager"
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg, use_cache=False)
    auto = transformers.AutoModelForImageTextToText if job.get("image_size") else \
        transformers.AutoModelForCausalLM
    with torch.device(device):  # built where it trains: a 1.3B model in a second, not a minute
        model = auto.from_config(config, attn_implementation=impl)
    experts = getattr(model.config, "_experts_implementation", None) if any(
        k in cfg for k in EXPERT_COUNTS) else None  # what routed the tokens
    if job["activation_checkpointing"]:  # the newer name where the installed version has it
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    if job.get("lora_rank"):
        add_adapters(model, job["lora_rank"])
    if job["precision"] == "bf16":  # the whole model: its gradients and AdamW's state follow
        model.to(torch.bfloat16)
    model.train()
    compiled = None
    if job.get("compile"):  # compiled in the untimed steps
        compiled = "inductor" if device == "cuda" else "aot_eager"
        model = torch.compile(model, backend=compiled)
    trained = [p for p in model.parameters() if p.requires_grad]
    if job["optimizer"] == "muon":  # the weight matrices, not the embeddings or the head
        tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        tables.add(id(model.get_output_embeddings().weight))
        matrix = [p.ndim == 2 and id(p) not in tables for p in trained]
        opts = [torch.optim.Muon([p for p, m in zip(trained, matrix) if m], lr=0.02),
                torch.optim.AdamW([p for p, m in zip(trained, matrix) if not m], lr=1e-4)]
    else:
        opts = [torch.optim.AdamW(trained, lr=1e-4)]
    inputs = _image_text(config, job, device) if job.get("image_size") else dict(
        input_ids=torch.randint(0, cfg["vocab_size"], (job["batch_size"], job["seq_len"]),
                                device=device))
    half = job["precision"] == "amp-bf16"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=half):
            loss = model(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
        for opt in opts:
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
                    **({"experts_implementation": experts} if experts else {}),
                    **({"compile_backend": compiled} if compiled else {}),
                    **profiled(step, device))
    except torch.OutOfMemoryError:
        return dict(row, error="out of memory")
    except Exception as e:  # a compiler that fails on the lent machine: said, the rest runs
        if not compiled:
            raise
        return dict(row, error=f"torch.compile ({compiled}): {type(e).__name__}: {e}"[:500])


def _image_text(config, job: dict, device: str) -> dict:
    """A Qwen-VL batch as its processor makes it: each sample one image of `image_size`
    pixels a side (its patches [t h w, C t p p] in a row, its grid [1, h, w]) and `seq_len`
    tokens, of which the first opens the image and the next N are its placeholders (N: the
    grid's cells over the merge), the rest text; the ids drawn below the special ones."""
    import torch

    vision, b = config.vision_config, job["batch_size"]
    side = job["image_size"] // vision.patch_size
    cells = side * side // vision.spatial_merge_size ** 2
    text = min(config.image_token_id, config.vision_start_token_id)
    ids = torch.randint(0, text, (b, job["seq_len"]), device=device)
    ids[:, 0] = config.vision_start_token_id
    ids[:, 1:1 + cells] = config.image_token_id
    pixels = torch.randn(b * side * side, vision.in_chans * vision.temporal_patch_size
                         * vision.patch_size ** 2, device=device)
    grid = torch.tensor([[1, side, side]] * b, device=device)
    return dict(input_ids=ids, pixel_values=pixels, image_grid_thw=grid)


def main(argv: list[str] | None = None) -> int:
    return resumable.main(argv, __doc__.splitlines()[0], plan, measure)


if __name__ == "__main__":
    resumable.finish(main())
