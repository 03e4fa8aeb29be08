"""Data-parallel training on N GPUs (PyTorch DistributedDataParallel) from a single-GPU step
priced from the spec sheet (`serving.spec_sheet`).

The rules:
- every GPU computes the step at the per-GPU batch (`--batch-size`, as DDP scripts give it);
- the gradients (fp32: also under AMP, whose master weights are fp32) are all-reduced in DDP's
  buckets of `BUCKET_MB`, by a ring: each GPU sends and receives 2 (N - 1) / N of the bytes
  over the slowest link of the ring, plus 2 (N - 1) steps of the link's latency per bucket;
- the links: NVLink where the GPU has it and every GPU of the ring reaches the others by it
  (SXM parts on an NVSwitch board; PCIe cards only pairwise, by a bridge), else PCIe; between
  nodes, the network, one NIC per node (`network_gbs`); bandwidths per direction (the
  catalog's NVLink and PCIe figures count both directions);
- buckets are all-reduced while the backward pass goes on: the first is ready after 1/B of it,
  the last only at its end, so what shows is max(C / B, C - backward (B - 1) / B) of an
  all-reduce costing C in B buckets; never less than the last bucket, so a step is never
  shorter than its compute;
- the optimizer update follows the all-reduce on every GPU, as in one.
"""

from __future__ import annotations

import dataclasses
import math

from mdot_jax.data.gpus import GPU
from mdot_jax.serving.predict import Prediction

BUCKET_MB = 25  # DDP's default bucket_cap_mb
LATENCY_US = {"nvlink": 2.0, "pcie": 5.0, "network": 10.0}  # per ring step, one way
INTERCONNECTS = ("nvlink", "pcie")
STRATEGIES = ("ddp",)  # FSDP, tensor and pipeline parallel are not priced


@dataclasses.dataclass(frozen=True)
class Link:
    name: str  # nvlink | pcie | network
    gbs: float  # GB/s per direction
    latency_s: float


def ring_link(gpu: GPU, gpus_per_node: int, nodes: int, interconnect: str | None,
              network_gbs: float) -> Link:
    """The slowest link of a ring over `nodes` x `gpus_per_node` GPUs."""
    if interconnect not in (None, *INTERCONNECTS):
        raise ValueError(f"--interconnect {interconnect!r}: choose from {list(INTERCONNECTS)}")
    switched = any(k in gpu.name for k in ("sxm", "nvl"))
    nvlink = gpu.nvlink_gbs > 0 and (switched or gpus_per_node <= 2)
    if interconnect == "nvlink" and not nvlink and gpus_per_node > 1:
        raise ValueError(f"--interconnect nvlink: the {gpu.name} has no NVLink that joins "
                         f"{gpus_per_node} GPUs (PCIe cards pair by a bridge at most)")
    name = interconnect or ("nvlink" if nvlink else "pcie")
    gbs = (gpu.nvlink_gbs if name == "nvlink" else gpu.pcie_gbs) / 2
    link = Link(name, gbs, LATENCY_US[name] * 1e-6)
    if nodes > 1 and network_gbs < gbs:
        link = Link("network", network_gbs, LATENCY_US["network"] * 1e-6)
    return link


def allreduce_ms(nbytes: float, gpus: int, link: Link, buckets: int) -> float:
    """A ring all-reduce of `nbytes` over `gpus` GPUs in `buckets` buckets, ms."""
    if gpus <= 1:
        return 0.0
    steps = 2 * (gpus - 1)
    return 1e3 * (steps / gpus * nbytes / (link.gbs * 1e9) + steps * link.latency_s * buckets)


def data_parallel(p: Prediction, params: int, gpu: GPU, gpus_per_node: int, nodes: int = 1,
                  interconnect: str | None = None, network_gbs: float = 25.0) -> Prediction:
    """`p` (one GPU's step, with its phases) as a DDP step over nodes x gpus_per_node GPUs:
    `phases` gains the all-reduce's exposed ms, memory DDP's copy of the gradients in its
    buckets. One GPU: `p` itself."""
    n = gpus_per_node * nodes
    if n == 1:
        return p
    link = ring_link(gpu, gpus_per_node, nodes, interconnect, network_gbs)
    nbytes = 4.0 * params
    buckets = max(1, math.ceil(nbytes / (BUCKET_MB * 2 ** 20)))
    total = allreduce_ms(nbytes, n, link, buckets)
    backward = p.phases.get("backward", 0.0)
    exposed = max(total / buckets, total - backward * (buckets - 1) / buckets)
    warning = (f"gradient all-reduce over {n} GPUs ({total:.3g} ms, {total - exposed:.3g} ms "
               f"of it hidden behind the backward pass in {buckets} buckets of {BUCKET_MB} MB) "
               f"priced from the {link.name} bandwidth ({link.gbs:g} GB/s per direction): not "
               "measured")
    return dataclasses.replace(
        p, iteration_ms=p.iteration_ms + exposed, interval_ms=None,
        warnings=[*p.warnings, warning], memory_gb=p.memory_gb + nbytes / 1e9,
        phases={**p.phases, "all-reduce": exposed})
