"""A step that keeps its optimizer in the host's memory (DeepSpeed's ZeRO-Offload,
`offload_optimizer: cpu`), or its parameters too (ZeRO-3's `offload_param: cpu`), priced from
the spec sheet: what the GPU no longer holds, the copies over PCIe, the update on the CPU.

The rules (DeepSpeed's schedule; nothing of it measured here):
- each GPU's process owns the optimizer state of its shard of the trained parameters (ZeRO's
  stages: 1 / replicas of them; HSDP's: 1 / a node's replicas; one GPU: all), kept on the host
  with their fp32 master weights and fp32 gradients; the GPU keeps the weights the strategy
  keeps in the weights' type (DeepSpeed's model in the half type under AMP), with `params`
  only the layers in flight (FSDP's units), and of the gradients only those in flight (a
  unit's, or a bucket of `parallel.BUCKET_MB`);
- every micro-batch the GPU copies its shard of the gradients to the host in the weights'
  type (half under AMP) as the backward produces them: hidden behind the backward as FSDP's
  reduce-scatters are (`parallel.hidden`);
- the update runs on the host's CPUs over every GPU's shard of a node at once: one pass reading
  the master weights, the state and the gradients and writing the master weights, the state
  and the weights' copy for the GPU (`HOST_PASS`), at the host's memory bandwidth (`host_gbs`,
  a node's; its datasheet peak: the update is at least this long), on the critical path;
- the updated weights then go back to the GPU over PCIe, on the critical path, before the
  strategy's all-gather;
- with `params`, every micro-batch's forward and backward also copy each layer's weights in
  (the GPU's shard, then the strategy's gathers), prefetched behind the compute as FSDP's
  gathers are;
- a GPU's PCIe link moves `pcie_gbs` / 2 a direction, and no more than its share of the host's
  memory bandwidth, which the node's GPUs copy into at once.
"""

from __future__ import annotations

import dataclasses
import math

from mdot_jax.errors import RequestError
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.parallel import BUCKET_MB, hidden
from mdot_jax.options import SHARDED_WEIGHTS
from mdot_jax.serving.memory import HALF, OPTIMIZER_STATE, param_bytes
from mdot_jax.serving.prediction import GAPS, Prediction

# bytes a parameter the host's update moves beside the state (read and written) and the
# weights' copy for the GPU (written at their width): the fp32 master weights read and
# written, the fp32 gradient read
HOST_PASS = 2 * 4 + 4


def host_gbs(gpu: GPU, asked: float | None) -> tuple[float, str]:
    """The host memory bandwidth a node (GB/s) the update runs at, and where it is from."""
    if gpu.nvlink_gpus:  # a Grace CPU beside each pair, joined by NVLink-C2C, not PCIe
        raise RequestError(f"offload: the {gpu.name}'s host is a Grace CPU joined by "
                           "NVLink-C2C, not priced here", "offload")
    if asked:
        return asked, "as given"
    if not gpu.host_gbs:
        raise RequestError(f"host_gbs: offload updates on the host's CPUs at its memory "
                           f"bandwidth, and the {gpu.name} has no reference system in the "
                           "catalog: give host_gbs (GB/s a node: sockets x DDR channels x "
                           "MT/s x 8 bytes; two sockets of eight DDR5-4800: 614)", "host_gbs")
    return gpu.host_gbs, "its reference system's host (`mdot devices --json`)"


def offload(p: Prediction, what: str, params: int, gpu: GPU, *, gpus_per_node: int,
            nodes: int, strategy: str, optimizer: str, precision: str, trained: float,
            grad_accum: int, units: int, host: float | None,
            weight_bytes: float | None = None) -> Prediction:
    """`p` (a data-parallel iteration of `grad_accum` micro-batches over `params` parameters a
    GPU, `trained` of them trained, the strategy's sharding applied; `units`: FSDP's, its
    layers and the root) with `what` (`options.OFFLOADS`) kept on the host: the module
    docstring's rules. `host`: the host's memory bandwidth a node, GB/s (None: the catalog's);
    `weight_bytes`: a weight's bytes on average where frozen ones are held otherwise."""
    replicas = gpus_per_node * nodes
    stages = SHARDED_WEIGHTS if what == "params" else ("zero1", "zero2", *SHARDED_WEIGHTS)
    if replicas > 1 and strategy not in stages:
        raise RequestError(f"strategy {strategy!r}: offload {what} over {replicas} GPUs runs "
                           f"under ZeRO: give strategy {' or '.join(stages)}", "strategy")
    gbs, source = host_gbs(gpu, host)
    shards = math.gcd(replicas, gpus_per_node) if strategy == "hsdp" else replicas
    mine = params / shards  # the parameters whose state this GPU's process owns
    width = 2 if precision in HALF else 4  # of the weights and gradients copied
    state = 4.0 * OPTIMIZER_STATE[optimizer]
    held = param_bytes(precision, optimizer)
    pcie = min(gpu.pcie_gbs / 2, gbs / gpus_per_node)  # GB/s a GPU, a direction

    def ms(nbytes: float, rate: float) -> float:
        return nbytes / rate / 1e6

    k = grad_accum
    fw, bw = p.passes_ms(k)
    pieces = units or max(1, math.ceil(width * mine / (BUCKET_MB * 2 ** 20)))
    copy = ms(width * mine * trained, pcie)  # the gradients out (a micro-batch's), or back in
    shown = k * hidden(copy, bw, pieces)
    update = ms((2 * state + HOST_PASS + width) * mine * trained * gpus_per_node, gbs)
    # what the GPU held of the weights and gradients (the strategy's), and holds now
    weights = mine if strategy in SHARDED_WEIGHTS else params
    grads = trained * (mine if strategy in ("zero2", *SHARDED_WEIGHTS) else params)
    before = weight_bytes or held.model
    gpu_bytes = ((held.optimizer + held.master) * trained * mine + held.gradients * grads
                 + (before - min(width, before)) * weights)
    host_bytes = (state + 4 + 4) * trained * mine  # state, master weights, fp32 gradients
    fetch = ms(width * mine, pcie) if what == "params" else 0.0  # the weights in, a pass
    if what == "params":  # each layer's weights in for its forward and its backward
        shown += k * (hidden(fetch, fw, pieces) + hidden(fetch, bw, pieces))
        gpu_bytes += min(width, before) * weights
        host_bytes += width * mine
    phases = {**p.phases, "update": update, "host copies": shown + copy}
    if "launch gaps" in phases:  # the GPU issues no update kernels
        phases["launch gaps"] -= p.gaps("update")
    node_gb = gpus_per_node * host_bytes / 1e9  # the host's memory a node
    operators = p.operators and [
        dict(o, ms=update, name=f"{optimizer} update on the host's CPUs") if o["type"] ==
        "optimizer" else o for o in p.operators if o["name"] != GAPS["update"]]
    # in flight: on several GPUs, the strategy's (`parallel.data_parallel`); on one, a unit's
    # gradients (or a bucket's, of no more than there are), with `params` its weights and the
    # next unit's, as FSDP's
    in_flight = 0.0
    if replicas == 1:
        in_flight = trained * width * params / units if units else min(
            width * BUCKET_MB * 2 ** 20, trained * width * params)
        in_flight += 2 * width * params / units if what == "params" and units else 0.0
    said = (f"offload {what}: {optimizer}'s state, fp32 master weights and gradients"
            + (" and the weights" if what == "params" else "") + f" on the host "
            f"({node_gb:.3g} GB of a node's memory); the update on its "
            f"CPUs at {gbs:g} GB/s ({source}; its peak, so at least {update:.3g} ms), "
            f"gradients out and weights in over PCIe at {pcie:g} GB/s a direction "
            f"({(k + 1) * copy + 2 * k * fetch:.3g} ms, {shown + copy:.3g} ms of it not hidden "
            "behind compute): not measured")
    warnings = [w for w in p.warnings if not w.startswith(f"the {optimizer} update priced")]
    return dataclasses.replace(
        p.with_memory(model_states=-min(gpu_bytes / 1e9, p.memory_parts.get("model_states", 0.0)),
                      working=in_flight / 1e9), phases=phases,
        operators=operators, iteration_ms=sum(phases.values()), interval_ms=None,
        warnings=[*warnings, said], host_memory_gb=node_gb)
