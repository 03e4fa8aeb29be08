"""Which attention kernel a step priced from a spec sheet runs: the one the job asks, or where
it asks none, the one PyTorch's scaled_dot_product_attention chooses (FlashAttention at half
precision on compute capability 8.0 and later), with a note saying which and why."""

from __future__ import annotations

from mdot_jax.errors import RequestError
from mdot_jax.options import FLASH_ATTN
from mdot_jax.serving.memory import HALF

_NO_FLASH = "PyTorch runs FlashAttention only at half precision on compute capability 8.0 and later"


def choose(asked: str | None, cc: float, precision: str, blocks: list, calls: int,
           eager_class: str | None) -> tuple[str, str | None]:
    """The attention a step runs (`options.ATTENTION`) and a note saying why (None: none to
    say): the one `asked`, or where it says none, PyTorch's choice on a GPU of compute
    capability `cc` at `precision` for the `calls` of the attention `blocks` that call SDPA
    (the others run as the graph shows them); the note names `eager_class`, a config's model
    class that never calls PyTorch's SDPA."""
    if not blocks:
        if asked in ("flash", FLASH_ATTN):
            raise RequestError("attention: the model has no attention blocks (MatMul, "
                               "Softmax, MatMul) to fuse", "attention")
        return "eager", None
    runs_flash = precision in HALF and cc >= 8
    if asked == FLASH_ATTN:
        if not runs_flash:
            raise RequestError(f"attention: the flash-attn package ({FLASH_ATTN}) runs at "
                               "half precision on compute capability 8.0 and later (this "
                               f"is {precision} on {cc:g})", "attention")
        return FLASH_ATTN, (f"attention: {FLASH_ATTN} (the flash-attn package) priced as "
                            "FlashAttention" + ("; each sliding window over its own keys, no "
                                                "mask" if any(b.window for b in blocks) else ""))
    if asked:
        if asked == "flash" and not runs_flash:
            return asked, (f"attention: flash as asked, but {_NO_FLASH} (this is {precision} "
                           f"on {cc:g}): its memory-efficient kernel runs instead, priced as "
                           "FlashAttention, not measured")
        return asked, None
    if runs_flash and not calls:
        return "eager", ("attention: eager (the model computes softmax(Q K^T) V itself: its "
                         "export calls no scaled_dot_product_attention)")
    if runs_flash and calls < len(blocks):
        return "flash", (f"attention: flash for the {calls} of {len(blocks)} attention blocks "
                         "that call scaled_dot_product_attention; the others as the model "
                         "computes them (eager)")
    if runs_flash:
        at = "bf16, fp8's attention" if precision == "fp8" else precision
        return "flash", (f"attention: flash (PyTorch's scaled_dot_product_attention runs "
                         f"FlashAttention at {at} on compute capability {cc:g}); give "
                         "attention eager for a model that computes softmax(Q K^T) V itself"
                         + (f", as transformers' {eager_class} does (fused training code does "
                            "not)" if eager_class else ""))
    return "eager", (f"attention: eager (as the graph shows it: {_NO_FLASH}; this is "
                     f"{precision} on {cc:g})")
