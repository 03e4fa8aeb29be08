"""The words a training job may use, each vocabulary defined once (the request, the CLI's
choices, the profilers, the spec sheet and the features all read them from here)."""

from converters.dims import MAX_BATCH_TOKENS as MAX_BATCH_TOKENS  # a micro-batch's tokens
from converters.dims import MAX_LENGTH

# what a workload may name: fp32 (PyTorch's defaults: cuDNN convolutions may use TF32,
# matmuls do not), tf32 (both do), amp-*: autocast to that half type (fp16 with a scaler),
# bf16: the whole model in bfloat16, fp8: amp-bf16 with the linear layers' GEMMs in FP8
# (Transformer Engine's or torchao's float8 training, scaled per tensor)
PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16", "bf16", "fp8")
MEASURED_PRECISIONS = PRECISIONS[:4]  # what the profilers measure
SPEC_SHEET_PRECISIONS = (*MEASURED_PRECISIONS, "bf16", "fp8")  # what the spec sheet prices
AUTOCAST = ("amp-fp16", "amp-bf16", "fp8")  # the precisions autocast runs
HALF = frozenset({*AUTOCAST, "bf16"})  # activations in a half type: under autocast, or pure bf16
# the one-hot of the workload features of checkpoint format 2 (widths fixed by the weights):
# each precision reads as the one of these it runs like
FEATURE_PRECISIONS = ("fp32", "amp-fp16", "bf16")
FEATURE_PRECISION_OF = {"fp32": "fp32", "tf32": "fp32", "amp-fp16": "amp-fp16",
                        "amp-bf16": "amp-fp16", "bf16": "bf16"}

# the optimizer of the step: SGD with momentum 0.9, nesterov (timm's benchmark), Adam, AdamW
OPTIMIZERS = ("sgd", "adam", "adamw")
MEASURED_OPTIMIZERS = ("sgd", "adamw")  # what the profilers train with
SPEC_SHEET_OPTIMIZERS = (*OPTIMIZERS, "muon", "adamw-8bit")  # what the spec sheet prices

ARITHMETIC = ("fp32", "tf32", "fp16", "bf16", "fp8")  # the formats a GPU's peaks are given for

MAX_INT = 2 ** 31 - 1  # the largest dim or count a request may name (ONNX and numpy use int32)
MAX_TOKENS = MAX_LENGTH  # the longest sequence a request may name (`converters.dims`)

LAYOUTS = ("nchw", "nhwc")  # of image data (nhwc: channels-last; `gpu.cnn_kernels`)
STEPS = ("train", "fwd-bwd")  # the whole step, or forward and backward without the update
# of the data parallelism (tensor and pipeline: their degrees): DDP; ZeRO stage 1 (optimizer
# state sharded), 2 (and gradients), FSDP / ZeRO-3 (and weights), HSDP (FSDP over a node's
# replicas, replicated across nodes: FSDP's HYBRID_SHARD, FSDP2's 2-D mesh)
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
SHARDED_WEIGHTS = ("fsdp", "hsdp")  # the strategies that shard (and gather) the weights
INTERCONNECTS = ("nvlink", "pcie")  # between the GPUs of a node
# what a step keeps in the host's memory (DeepSpeed's ZeRO-Offload): the optimizer (its state,
# the fp32 master weights and the update, on the CPU), or the parameters too (ZeRO-3's
# offload_param: each layer's weights copied in for its forward and backward)
OFFLOADS = ("optimizer", "params")
OFFLOAD_OPTIMIZERS = ("adam", "adamw")  # DeepSpeed's CPU Adam (others: torch.optim on the CPU)
CHECKPOINTING = ("full", "selective")  # activation checkpointing: every layer, or attention's core
# the kernels a step runs: eager PyTorch's (autocast, torch.optim's foreach), or Megatron-LM's
# (the model in the half type with fp32 master weights, fused softmax, fused Adam)
FRAMEWORKS = ("pytorch", "megatron")
# how frozen parameters are held (a base model loaded in the half type, or QLoRA's 4 bits)
FROZEN_WEIGHTS = ("bf16", "fp16", "nf4")
# fused scaled_dot_product_attention, as the graph shows it, or the flash-attn package
# (transformers' attn_implementation "flash_attention_2": a sliding window over its keys alone)
ATTENTION = ("flash", "eager", "flash_attention_2")
FLASH_ATTN = "flash_attention_2"
# (field, a value another tool's vocabulary gives it) -> what it is called here
CHOICE_HINTS = {
    ("strategy", "tp"): " (tensor parallelism: give tp)",
    ("strategy", "pp"): " (pipeline parallelism: give pp)",
    ("strategy", "zero3"): " (ZeRO stage 3 shards the weights too: fsdp)",
    ("attention", "sdpa"): " (transformers' sdpa is PyTorch's scaled_dot_product_attention: "
                           "flash, which runs the kernel SDPA chooses)",
    ("activation_checkpointing", "none"): " (none: leave it out)"}
SCHEDULES = ("1f1b", "gpipe", "interleaved")  # pipeline-parallel schedules
GPU_PRICERS = ("kernel", "trees")  # a GPU step model's operator pricer: Flax network, LightGBM
