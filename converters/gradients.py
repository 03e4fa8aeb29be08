"""Which trainable parameters a training step's backward reaches, and whether the model's
own code checkpoints activations.

A parameter with `requires_grad` may still get no gradient: a teacher run under
`torch.no_grad()` inside the model (distillation, DINO's or BYOL's EMA teacher), or an output
`.detach()`ed before the rest. The exported graph cannot say so (the tracer runs everything
without gradients), so the forward is run once more on the meta device, with the parameters'
and inputs' shapes alone (`torch.func.functional_call`: the model's own tensors untouched),
and the backward of the sum of its outputs asks autograd which parameters it reaches. Torch's
optimizers skip a parameter whose gradient is None, so such parameters are frozen for the
step's price.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from converters.torch_inputs import tensors_in, to_meta


def unreached(module: Any, args: tuple, keywords: Sequence[str] | None = None) -> list[str]:
    """Names of `module`'s parameters that require a gradient but get none from the backward
    of its forward on `args` (a dict's values by `keywords`). Empty where the forward cannot
    run on the meta device (code that reads values) or no output carries a gradient (an
    inference export, read as its training step): nothing is known then."""
    import torch

    meta = {n: torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)
            for n, t in (*module.named_parameters(), *module.named_buffers())}
    inputs = to_meta(args)
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    was_training = module.training
    try:
        module.train()
        with warnings.catch_warnings(), torch.enable_grad(), checkpoint_calls():
            warnings.simplefilter("ignore")
            out = torch.func.functional_call(
                module, meta, kwargs=dict(zip(keywords, inputs))) if keywords else \
                torch.func.functional_call(module, meta, inputs)
            leaves = [t for t in tensors_in(out) if t.requires_grad and t.is_floating_point()]
            if not leaves or not trained:
                return []
            grads = torch.autograd.grad(sum(t.sum() for t in leaves),
                                        [meta[n] for n in trained], allow_unused=True)
    except Exception:  # noqa: BLE001 (any model code): unknown, every parameter trained
        return []
    finally:
        module.train(was_training)
    return [n for n, g in zip(trained, grads) if g is None]


# the flags that turn a library's activation checkpointing on, per module
CHECKPOINT_FLAGS = ("gradient_checkpointing", "grad_checkpointing")  # transformers', timm's


def unread(module: Any, read: set[str]) -> dict | None:
    """What of `module`'s parameters the traced step never reads (no name of a tensor among the
    graph's inputs `read`: a vision-language model given tokens alone, a head its forward does
    not call): their count and the largest modules none of whose parameters is read, or the
    parameter itself where its module's others are (at most 3, layers' indices as *). None
    where every one is read."""
    names: dict[int, list[str]] = {}  # a tensor's names (a tied one has several)
    for n, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    missed = {k for k, ns in names.items() if not read.intersection(ns)}
    if not missed:
        return None
    where: dict[str, None] = {}
    for name, m in module.named_modules():
        held = {id(p) for p in m.parameters()}
        if held and held <= missed and not any(name.startswith(w + ".") for w in where):
            where[name] = None
    for k in missed:  # one held beside parameters that are read (DINOv2's mask token): by name
        if not any(n.startswith(w + ".") for n in names[k] for w in where):
            where[names[k][0]] = None
    said = dict.fromkeys(".".join("*" if s.isdigit() else s for s in w.split(".")) for w in where)
    return {"params": sum(p.numel() for p in module.parameters() if id(p) in missed),
            "in": list(said)[:3]}


# `torch.utils.checkpoint.checkpoint`'s own keywords (the rest are the function's)
CHECKPOINT_OPTIONS = ("use_reentrant", "context_fn", "determinism_check", "debug",
                      "preserve_rng_state")


@contextlib.contextmanager
def checkpoint_calls() -> Iterator[list[int]]:
    """Within it, `torch.utils.checkpoint.checkpoint` runs its function plainly (the same
    values, and gradients reach the same parameters; the tracer fails on the reentrant form's
    autograd.Function and `torch.autograd.grad` refuses it) and appends to the list yielded,
    however the model's code reached the function (the module's attribute or a name imported
    before: both call the module's `_checkpoint_impl`)."""
    import torch.utils.checkpoint as module

    calls: list[int] = []
    # torch >= 2.12 routes both through `_checkpoint_impl`; before, only the module's name
    name = "_checkpoint_impl" if hasattr(module, "_checkpoint_impl") else "checkpoint"
    original = getattr(module, name)

    def impl(function: Any, args: tuple, kwargs: dict, **options: Any) -> Any:
        calls.append(1)
        return function(*args, **kwargs)

    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        for option in CHECKPOINT_OPTIONS:
            kwargs.pop(option, None)
        return impl(function, args, kwargs)

    setattr(module, name, impl if name == "_checkpoint_impl" else checkpoint)
    try:
        yield calls
    finally:
        setattr(module, name, original)


def checkpoints(module: Any) -> bool:
    """Whether a module of `module` turned its library's activation checkpointing on
    (`model.gradient_checkpointing_enable()`, timm's `set_grad_checkpointing()`)."""
    return any(getattr(m, flag, False) is True for m in module.modules()
               for flag in CHECKPOINT_FLAGS)
