"""Data-parallel training on N GPUs (PyTorch DistributedDataParallel) from a single-GPU step
priced from the spec sheet (`serving.spec_sheet`).

The rules:
- every GPU computes the step at the per-GPU batch (`--batch-size`, as DDP scripts give it);
- the gradients (fp32: also under AMP, whose master weights are fp32; Megatron-LM's at fp16 in
  fp16, `memory.param_bytes`) are all-reduced in DDP's buckets of `BUCKET_MB`, by a ring: each
  GPU sends and receives 2 (N - 1) / N of the bytes over the slowest link of the ring, plus
  2 (N - 1) steps of the link's latency per bucket; or, where the GPUs span nodes and it is
  faster, by NCCL's tree (a chain through each node's GPUs, a binary tree over the nodes:
  2 ((GPUs a node - 1) x the node link's latency + log2(nodes) x the tree's network hop) a
  bucket, the bytes twice at `TREE_SHARE` of the ring's bandwidth), as NCCL chooses per call;
  all-gathers and reduce-scatters are rings (NCCL has no tree for them);
- the links: NVLink where the GPU has it and every GPU of the ring reaches the others by it
  (`GPU.nvswitch`: SXM parts on their boards; PCIe cards only pairwise, by a bridge), at the
  share of its bandwidth rings achieve (`NVLINK_EFFICIENCY`), else PCIe; between nodes, the
  network, one NIC per node (`network_gbs`); bandwidths per direction (the catalog's NVLink
  and PCIe figures count both directions);
- buckets are all-reduced while the backward pass goes on: the first is ready after 1/B of it,
  the last only at its end, so what shows is max(C / B, C - backward (B - 1) / B) of an
  all-reduce costing C in B buckets; never less than the last bucket, so a step is never
  shorter than its compute;
- the optimizer update follows the all-reduce on every GPU, as in one.

Sharded (ZeRO's stages): `zero1` shards the optimizer state (with any master weights:
Megatron-LM's distributed optimizer) over the N replicas, `zero2` the gradients too, `fsdp`
(FSDP / ZeRO-3) the weights too. ZeRO-1 and -2 reduce-scatter the gradients in units of
`BUCKET_MB` behind the backward (ZeRO-2 every micro-batch, as it frees them), each GPU updates
its 1/N, and the updated weights are all-gathered after the update, with nothing to hide
behind (each at its width: Megatron-LM's distributed optimizer gathers its half-type model).
FSDP all-gathers the weights before the forward and again before the backward and
reduce-scatters the gradients (3 (N - 1) / N of the parameter bytes in all, against the
2 (N - 1) / N of an all-reduce; at AMP in the half type, as its mixed-precision policy gathers
the weights; N - 1 ring steps' latency a collective, three collectives a unit) unit by unit (a
layer each, as transformer auto-wrapping makes them, and the root; DDP's buckets where the
model has no layers), prefetched under the forward and the backward as DDP's buckets are
under the backward: the first unit's gather and the last unit's reduce-scatter show. It holds
a unit's gathered weights, the next unit's (prefetched) and the unit's unsharded gradients.
HSDP (`hsdp`: FSDP's HYBRID_SHARD, FSDP2's 2-D mesh) is FSDP over a node's replicas (ranks
fill nodes in order), replicated across the nodes: its gathers and reduce-scatters stay in the
node, and each unit's reduced gradient shard is all-reduced over the replicas holding the same
shard (one a node: over the network, every GPU of a node at once), behind the backward with
its reduce-scatter, every micro-batch; the state sharded over the node's replicas alone.
Under tensor and pipeline parallelism (`model_parallel`) the replicas are what is left of the
GPUs, each holding a stage's share.

Expert parallel (`ep`, a mixture of experts): its experts split over ep neighbouring
replicas, each GPU holding E / ep of them (`model_parallel.shard_experts`: each runs E / ep
experts over ep times the rows); the experts' gradients (and FSDP's gathers of them) go over
the n / ep replicas holding the same experts, the rest over all n. Every layer with
experts exchanges its routed tokens all-to-all over the ep GPUs (`expert_exchange`): dispatch
and combine in the forward, again in the backward and in a recomputed forward, each GPU sending
and receiving (ep - 1) / ep of tokens x top k x width activations, on the critical path: to
its node's peers over the node's link, to the others over its share of the network (every GPU
of a node exchanging at once), the slower of the two.
"""

from __future__ import annotations

import dataclasses
import math

from mdot_jax.errors import RequestError
from mdot_jax.gpu.catalog import GPU
from mdot_jax.options import INTERCONNECTS, SHARDED_WEIGHTS, STRATEGIES
from mdot_jax.serving.memory import HALF, param_bytes
from mdot_jax.serving.prediction import GAPS, Prediction

BUCKET_MB = 25  # DDP's default bucket_cap_mb
NETWORK_GBS = 25.0  # between nodes, per direction, unless told: a 200 Gb/s NIC
# per ring step, one way; NVLink's, and the share of its bandwidth a ring achieves, fitted on
# XLA's measured H100 collectives (`benchmarks/bench_collectives.py`); PCIe's and the
# network's: their datasheet figures, nothing of them measured
LATENCY_US = {"nvlink": 3.5, "pcie": 5.0, "network": 10.0}
NVLINK_EFFICIENCY = 0.74
# NCCL's tree all-reduce, from its tuning model (NVIDIA/nccl src/graph/tuning.cc), not fitted:
# the least of its corrections of the tree's bandwidth (Simple protocol, medium sizes), and its
# tree's network hop against its ring's step; both leave the tree to where it clearly wins
TREE_SHARE = 0.5
TREE_HOP = 5.0


@dataclasses.dataclass(frozen=True)
class Link:
    name: str  # nvlink | pcie | network
    gbs: float  # GB/s per direction
    latency_s: float
    tree_latency_s: float | None = None  # an all-reduce's by NCCL's tree; None: in one node


def ring_link(gpu: GPU, gpus_per_node: int, nodes: int, interconnect: str | None,
              network_gbs: float = NETWORK_GBS) -> Link:
    """The slowest link of a ring over `nodes` x `gpus_per_node` GPUs."""
    if interconnect not in (None, *INTERCONNECTS):
        raise RequestError(f"interconnect {interconnect!r}: choose from {list(INTERCONNECTS)}",
                           "interconnect")
    nvlink = gpu.nvlink_gbs > 0 and (gpu.nvswitch or gpus_per_node <= 2)
    if interconnect == "nvlink" and not nvlink and gpus_per_node > 1:
        raise RequestError(f"interconnect 'nvlink': the {gpu.name} has no NVLink that joins "
                           f"{gpus_per_node} GPUs (PCIe cards pair by a bridge at most)",
                           "interconnect")
    name = interconnect or ("nvlink" if nvlink else "pcie")
    gbs = gpu.nvlink_gbs / 2 * NVLINK_EFFICIENCY if name == "nvlink" else gpu.pcie_gbs / 2
    if gbs <= 0:  # a --device-spec without the link (its NIC hangs off PCIe too)
        raise RequestError(f"device_spec: the {gpu.name} has no {name}_gbs on its spec sheet; "
                           "GPUs that exchange gradients need their link's bandwidth",
                           "device_spec")
    link = Link(name, gbs, LATENCY_US[name] * 1e-6)
    if nodes > 1 and network_gbs < gbs:
        link = Link("network", network_gbs, LATENCY_US["network"] * 1e-6)
    return link


def group_link(gpu: GPU, gpus_per_node: int, nodes: int, interconnect: str | None,
               network_gbs: float, size: int, stride: int) -> Link:
    """The link of a ring over `size` GPUs `stride` ranks apart (ranks fill a node's
    `gpus_per_node` GPUs in order): the node's links while the ring stays in a node; else the
    slower of them and the network, shared by the rings of a node that all leave it at once,
    at the mean latency of the ring's hops (`inside` - 1 in a node, one to the next node)."""
    inside = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    link = ring_link(gpu, inside, 1, interconnect, network_gbs)
    if size <= inside:
        return link
    rings = max(gpus_per_node // inside, 1)  # rings through one node's network
    net = ring_link(gpu, inside, 2, interconnect, network_gbs / rings)
    network = LATENCY_US["network"] * 1e-6
    hop = ((inside - 1) * link.latency_s + network) / inside
    tree = 2 * ((inside - 1) * link.latency_s
                + math.ceil(math.log2(math.ceil(size / inside))) * TREE_HOP * network)
    return dataclasses.replace(net if net.gbs < link.gbs else link, latency_s=hop,
                               tree_latency_s=tree)


def allreduce_ms(nbytes: float, gpus: int, link: Link, buckets: int, tree: bool = True
                 ) -> float:
    """An all-reduce of `nbytes` over `gpus` GPUs in `buckets` buckets, ms: a ring, or NCCL's
    tree where the link spans nodes and it is faster (`tree`: an all-reduce, not the ring an
    all-gather or reduce-scatter is half of)."""
    if gpus <= 1:
        return 0.0
    steps = 2 * (gpus - 1)
    s = steps / gpus * nbytes / (link.gbs * 1e9) + steps * link.latency_s * buckets  # ring
    if tree and link.tree_latency_s is not None:
        s = min(s, 2 * nbytes / (TREE_SHARE * link.gbs * 1e9) + link.tree_latency_s * buckets)
    return 1e3 * s


def all_to_all_ms(nbytes: float, gpus: int, link: Link, inside: int | None = None,
                  network: Link | None = None) -> float:
    """An all-to-all of `nbytes` a GPU over `gpus` GPUs, `inside` of them in a node (default:
    all), ms: each GPU sends (gpus - 1) / gpus of them, one peer a step, to its node's peers
    over `link` and to the others over its share of the node's `network` at once."""
    inside = min(inside or gpus, gpus)
    near = (inside - 1) / gpus * nbytes / (link.gbs * 1e9)
    far = (gpus - inside) / gpus * nbytes / (network.gbs * 1e9) if network else 0.0
    latency = (network or link).latency_s
    return 1e3 * (max(near, far) + (gpus - 1) * latency)


def exchange_links(gpu: GPU, gpus_per_node: int, interconnect: str | None, network_gbs: float,
                   ep: int, stride: int) -> tuple[Link, int, Link | None]:
    """An all-to-all group of `ep` GPUs `stride` ranks apart: its node's link, how many of it
    share a node, and a GPU's share of the node's network where the group leaves the node
    (every GPU of the node exchanging at once)."""
    inside = max(1, min(ep, gpus_per_node // stride))
    network = Link("network", network_gbs / gpus_per_node, LATENCY_US["network"] * 1e-6) \
        if ep > inside else None
    return ring_link(gpu, inside, 1, interconnect), inside, network


def expert_exchange(p: Prediction, moe: dict, ep: int, tokens: int, width: int, act_bytes: int,
                    stage_layers: int, passes: int, link: Link, inside: int,
                    network: Link | None) -> Prediction:
    """`p` with the all-to-alls of expert parallelism over `ep` GPUs, `inside` of them in a
    node (module docstring): in each of `stage_layers` layers with experts, `passes` passes
    (forward, backward, a recomputed forward) each dispatching and combining `tokens` x top k
    x `width` activations of `act_bytes`, every micro-batch."""
    nbytes = float(tokens * moe["top_k"] * width * act_bytes)
    count = 2 * passes * stage_layers * p.grad_accum
    ms = count * all_to_all_ms(nbytes, ep, link, inside, network)
    phases = dict(p.phases, communication=p.phases.get("communication", 0.0) + ms)
    over = f"{link.name} ({link.gbs:g} GB/s per direction)" + (
        f" and the network ({network.gbs:g} GB/s a GPU)" if network and ep > inside else "")
    note = (f"expert parallel over {ep} GPUs ({moe['experts'] // ep} of {moe['experts']} experts "
            f"each): {count} all-to-alls of {nbytes / 1e6:.3g} MB ({ms:.3g} ms) over {over}, "
            "not hidden: not measured")
    return p.with_phases(phases, warnings=[*p.warnings, note])


def updating(operators: list[dict] | None, share: float, what: str, gaps: bool = False
             ) -> list[dict] | None:
    """`operators` with the optimizer's update over `share` of the parameters (`what`);
    `gaps`: the host's gaps issuing it too (`GAPS`: its kernels as many as its tensors)."""
    if operators is None or share == 1.0:
        return operators
    return [dict(o, ms=o["ms"] * share, name=f"{o['name']}, {what}: {share:.3g} of them")
            if o["type"] == "optimizer" else dict(o, ms=o["ms"] * share)
            if gaps and o["name"] == GAPS["update"] else o for o in operators]


def hidden(comm: float, compute: float, units: int) -> float:
    """What of `comm` ms in `units` pieces, each ready as 1/units of `compute` is done, shows."""
    return max(comm / units, comm - compute * (units - 1) / units)


def data_parallel(p: Prediction, params: int, gpu: GPU, gpus_per_node: int, nodes: int = 1,
                  interconnect: str | None = None, network_gbs: float = NETWORK_GBS,
                  strategy: str = "ddp", optimizer: str = "sgd", grad_accum: int = 1,
                  model_parallel: int = 1, after_flush: bool = False,
                  precision: str = "fp32", units: int = 0, experts: int = 0,
                  ep: int = 1, stride: int = 0, framework: str = "pytorch",
                  trained: float = 1.0, weight_bytes: float | None = None,
                  copies: float = 0.0) -> Prediction:
    """`p` (one GPU's iteration of `grad_accum` micro-batches, with its phases, over
    `params` parameters) as a data-parallel iteration over the replicas of nodes x
    gpus_per_node GPUs, `model_parallel` GPUs each, replicas `stride` ranks apart (default
    `model_parallel`; Megatron-LM's order: its tensor-parallel degree), with
    `strategy` (`options.STRATEGIES`): `phases` gains the communication that shows, memory
    follows the strategy. DDP all-reduces once an iteration (`no_sync` on the other micro-batches),
    behind the last backward, or after it as Megatron-LM does (`after_flush`: its gradient
    buffers are reduced once the backward, and a pipeline's flush, are done); ZeRO-1 and -2
    reduce-scatter the gradients behind the backward (ZeRO-2 every micro-batch), update their
    shard and all-gather the weights after it; FSDP gathers and reduce-scatters for every
    micro-batch, in the half type at AMP (its mixed-precision policy: the weights' `param_dtype`,
    which the gradients' reduction keeps), in `units` (the model's layers and its root; 0: in
    DDP's buckets). `experts`: of the `params` (a GPU's), those of the experts it holds, the
    model's split `ep` ways (module docstring). `framework`: whose gradients and state
    (`memory.param_bytes`: DDP's gradients all-reduced at their width, Megatron-LM's fp16 ones
    in fp16; its distributed optimizer shards the master weights too). `trained`: the share of
    the parameters trained (the rest frozen: no gradient to reduce, no state, never gathered
    again after an update); `weight_bytes`: a weight's bytes on average where the frozen ones
    are held otherwise (`TrainingJob.frozen_weights`; FSDP gathers them so); `copies`: bytes
    of autocast's weight copies `p` counts (`memory.autocast_copies`), which FSDP's half-type
    gathers make unneeded. One replica: `p` itself."""
    if strategy not in STRATEGIES:
        raise RequestError(f"strategy {strategy!r}: choose from {list(STRATEGIES)}", "strategy")
    n = gpus_per_node * nodes // model_parallel
    if n == 1:
        return p
    held = param_bytes(precision, optimizer, framework)
    stride = stride or model_parallel
    # the replicas a GPU's state is sharded over (HSDP: its node's) and the groups of them
    shards = math.gcd(n, max(1, gpus_per_node // stride)) if strategy == "hsdp" else n
    link = group_link(gpu, gpus_per_node, nodes, interconnect, network_gbs, shards, stride)
    experts = experts if ep > 1 else 0  # not split: held and reduced as the rest
    groups = [(4.0 * (params - experts), shards, link)]  # bytes a GPU holds, shards, the link
    if ep > 1:  # the experts a GPU holds: on the n / ep replicas ep replicas apart
        groups.append((4.0 * experts, n // ep, group_link(
            gpu, gpus_per_node, nodes, interconnect, network_gbs, n // ep, stride * ep)))
    nbytes = sum(b for b, _, _ in groups)
    buckets = max(1, math.ceil(nbytes / (BUCKET_MB * 2 ** 20)))

    def rings(width: float, pieces: int, tree: bool = False) -> float:  # the groups'
        # all-reduces of `pieces` (`tree`: NCCL's choice; else rings, gathers' and scatters')
        return sum(allreduce_ms(width * b, r, lk, max(1, round(pieces * b / nbytes)), tree)
                   for b, r, lk in groups)

    unsharded = sum(b * (r - 1) / r for b, r, _ in groups)  # what sharding takes off a GPU
    k = grad_accum  # the phases are of k micro-batches: the pieces compute hides behind, one
    fw, bw = p.passes_ms(k)  # a collective, on its own stream, runs through all of a pass
    phases = dict(p.phases)
    if strategy == "ddp":
        pieces = max(1, math.ceil(trained * buckets))  # the trained parameters' gradients
        total = rings(held.gradients / 4 * trained, pieces, tree=True)  # in their type
        shown = total if after_flush else hidden(total, bw, pieces)
        # PyTorch DDP's buckets: a copy of the gradients; Megatron-LM's (`after_flush`)
        # contiguous buffer is the gradients themselves
        memory = dict(model_states=0.0 if after_flush  # in the gradients' type (bf16: half)
                      else trained * nbytes * held.gradients / 4 / 1e9)
    else:
        # GB of gathered or unsharded tensors: a bucket, or what there is to fill one (ZeRO's:
        # the trained parameters' gradients and updated weights, in their types; FSDP
        # gathers the frozen too)
        moved = nbytes if strategy in SHARDED_WEIGHTS else \
            trained * nbytes * max(held.gradients, held.model) / 4
        in_flight = min(BUCKET_MB * 2 ** 20, moved) / 1e9
        if strategy in SHARDED_WEIGHTS:  # gathered for each micro-batch's passes, both
            width = 0.5 if precision in HALF else 1.0  # the weights' and gradients' half type
            if weight_bytes is not None:  # frozen weights held in fewer bytes, gathered so
                width = min(width, weight_bytes / 4)
            pieces = units or buckets  # its collectives: one a unit (a ring's steps each)
            half = rings(width, pieces) / 2  # a gather of every weight; the trained reduced
            across = 0.0  # HSDP: each reduced shard all-reduced over the other nodes' replicas
            if shards < n:
                across = trained * allreduce_ms(width * nbytes / shards, n // shards, group_link(
                    gpu, gpus_per_node, nodes, interconnect, network_gbs, n // shards,
                    stride * shards), pieces)
            total = ((2 + trained) * half + across) * k
            shown = k * (hidden(half, fw, pieces)
                         + hidden((1 + trained) * half + across, bw, pieces))
            if units:  # a unit's weights, the next one's, the unit's gradients
                in_flight = (2 + trained) * width * nbytes / units / 1e9
        else:  # reduce-scattered behind the backward (zero2: each micro-batch), gathered after
            times = k if strategy == "zero2" else 1  # the gradients' width, the weights'
            rs, ag = (trained * rings(b / 4, buckets) / 2 for b in (held.gradients, held.model))
            scatter = rs if after_flush else hidden(rs, bw, buckets)
            total, shown = rs * times + ag, scatter * times + ag
        shard = sum(b / r for b, r, _ in groups) / nbytes  # of a GPU's parameters, its shard
        if "update" in phases:  # a step with one
            phases["update"] *= shard
        p = dataclasses.replace(p, operators=updating(p.operators, shard, "its shard"))
        memory = dict(model_states=-held.sharded(strategy, trained, weight_bytes) / 4
                      * unsharded / 1e9, working=in_flight)
        if strategy in SHARDED_WEIGHTS and model_parallel == 1:  # half-type units gathered
            # and freed: no autocast copy (a stage's activations count none either)
            memory["activations"] = -copies / 1e9
    what = "gradient reduce-scatter and all-gather of the updated weights"  # ZeRO-1, -2
    if strategy == "ddp":
        what = "gradient all-reduce"
    elif strategy in SHARDED_WEIGHTS:
        what = "weight all-gathers (forward and backward) and gradient reduce-scatter" + (
            " in the half type" if precision in HALF else "")
    over = f"over {n} GPUs" if shards == n else (
        f"within a node's {shards} replicas, each reduced shard all-reduced over the "
        f"{n // shards} nodes, {n} GPUs in all")
    hidden_in = (f"{units} units (its layers and the root)" if strategy in SHARDED_WEIGHTS
                 and units else f"{buckets} pieces of {BUCKET_MB} MB")
    warning = (f"{strategy}: {what} {over} ({total:.3g} ms, {total - shown:.3g} "
               f"ms of it hidden behind compute in {hidden_in}) priced "
               f"from the {link.name} bandwidth ({link.gbs:g} GB/s per direction)"
               + (" and the network's" if shards < n else "") + ": not measured")
    phases["communication"] = phases.get("communication", 0.0) + shown
    return dataclasses.replace(p.with_memory(**memory), iteration_ms=sum(phases.values()),
                               interval_ms=None, warnings=[*p.warnings, warning], phases=phases)


def accumulate(p: Prediction, micro_batches: int) -> Prediction:
    """`p` (one micro-batch's step, with its phases) as an iteration of `micro_batches`
    forward and backward passes, each issued by the host (its launch gaps, but those its
    update adds: `Prediction.gaps`) with its own communication (context
    parallelism's), and one optimizer update (gradient accumulation); its band, a relative
    one, scales with it. One micro-batch: `p` itself."""
    if micro_batches == 1:
        return p
    repeated = ("forward", "backward", "recomputation", "launch gaps", "communication")
    phases = {k: v * micro_batches if k in repeated else v for k, v in p.phases.items()}
    if "launch gaps" in phases:
        phases["launch gaps"] -= (micro_batches - 1) * p.gaps("update")
    return p.with_phases(phases, grad_accum=micro_batches)
