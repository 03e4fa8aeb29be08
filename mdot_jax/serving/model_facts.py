"""What a model says of itself once converted: the sizes its sequence was converted at (its
batch, image side or sequence length, tokens a sample) and what its kind of graph means for a
prediction of its training step."""

from __future__ import annotations

from converters import OperatorSequence
from converters.dims import converted_batch
from mdot_jax.errors import RequestError


def check_converted(seq: OperatorSequence, batch_size: int, image_size: int | None = None,
                    seq_len: int | None = None, cp: int = 1) -> None:
    """A converted sequence carries its batch (dim 0 of its data inputs) and its input size
    (`input_size_of`) in its shapes: it predicts at those only (a sequence length may be `cp`
    times its own: the piece of a sequence one GPU of a context-parallel group runs)."""
    shapes = [s for s in seq.meta.get("inputs", {}).values() if s]
    if shapes and (batch := converted_batch(seq)) != batch_size:
        raise RequestError(f"batch_size {batch_size}: the operator sequence {seq.name!r} was "
                           f"converted at batch {batch}; convert the model at batch "
                           f"{batch_size} instead", "batch_size")
    have = input_size_of(seq)
    tokens = tokens_of(seq) or have  # token ids beside audio (Whisper's targets), an image
    image = (seq.meta.get("head") or {}).get("image") or []  # a vision-language model's
    for field, size, fits in (("image_size", image_size, (have, *image)),
                              ("seq_len", seq_len, (tokens, tokens * cp))):
        if size and size not in fits:
            raise RequestError(f"{field} {size}: the operator sequence {seq.name!r} was "
                               f"converted at input size {fits[0]}; convert the model at "
                               f"{size} instead", field)


def input_size_of(seq: OperatorSequence) -> int:
    """Image side or sequence length, from the data input of `seq.input_kind`."""
    kind, shape = seq.kind_input
    if not shape:
        return 1
    if kind == "image":  # NCHW, or NHWC when the channels are last
        return int(shape[1] if shape[3] in (1, 3) and shape[1] not in (1, 3) else shape[3])
    return int(shape[-1])


def tokens_of(seq: OperatorSequence) -> int:
    """Tokens a sample: the length of its token ids (an integer [B, T] input, beside an image
    or audio where the model reads one; a multiple-choice model's, times its choices), 0
    where it has none."""
    if seq.input_kind == "tokens":
        return input_size_of(seq) * ((seq.meta.get("head") or {}).get("choices") or 1)
    ints = seq.meta.get("integer_inputs") or ()
    return next((int(s[-1]) for n, s in seq.meta.get("inputs", {}).items()
                 if len(s) == 2 and n in ints), 0)


def graph_warnings(g: dict, precision: str | None = None) -> list[str]:
    """What the kind of graph (`converters.kind.graph_kind`) says about a prediction of its
    training step: another framework's export, an inference one, uncosted control flow; with
    the `precision` a checkpoint's device was measured at, weights in another (a GPU's pricer
    says its own)."""
    out = []
    only = next((p for p in ("tf2onnx", "jax2onnx") if g.get("producer", "").startswith(p)),
                None)  # exporters of other frameworks, which write inference graphs only
    if only:
        out.append(f"exported by {only}: priced as eager PyTorch trains the graph (its kernels "
                   "one by one, torch.optim's update); the fusion of a compiled step (XLA's) is "
                   "not priced")
    if g.get("kind") == "inference":
        evidence = " and ".join(
            f"{n} BatchNormalization {how}" for n, how in (
                (g["batchnorm_inference"], "in inference mode"),
                (g.get("batchnorm_folded", 0), "folded into Conv")) if n)
        exact = (f"export the model from PyTorch in training mode, if there is one: {only} "
                 "exports inference graphs only" if only else "export the training graph "
                 "(converters.from_torch, or torch.onnx.export(..., "
                 "training=TrainingMode.TRAINING))")
        out.append(f"an inference graph ({evidence}): priced with its BatchNormalization in "
                   "training mode, but Dropout that the exporter removed is not priced; for "
                   f"the exact step {exact}")
    if loss := g.get("no_loss"):
        out.append(f"the graph ends at logits of {loss['classes']:,} classes a position (output "
                   f"'{loss['logits']}') with no loss: " + (
                       "priced with the loss a language model trains on (cross-entropy over "
                       "them in fp32, as transformers computes it); export with labels "
                       "(from_torch(model, {'input_ids': ids, 'labels': ids})) to price your "
                       "own" if loss["added"] else "priced as converted, as a checkpoint's "
                       "steps were measured: their loss taken over the outputs, outside the "
                       "graphs it read"))
        if tokens := loss.get("one_of"):
            out.append(f"the graph's logits are of one position of each sequence of {tokens:,} "
                       "tokens (an inference forward: nanoGPT's without targets): its head"
                       + " and loss" * loss["added"] + " priced over that one; export the "
                       "forward with its targets (labels) to price the training step")
    if g.get("control_flow"):
        out.append(f"control flow {g['control_flow']}: the bodies of these operators are not "
                   "costed")
    if precision and g.get("precision", "fp32") != "fp32":
        out.append(f"the graph's weights are {g['precision']}; the prediction is for "
                   f"{precision} training as the checkpoint's device was measured")
    return out
