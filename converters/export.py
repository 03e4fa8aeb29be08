"""Framework -> ONNX exporters of the *training* graph, weight-free.

Each exporter returns an `onnx.ModelProto` whose parameters are shaped graph inputs (no weight
values: a ViT-B export is KBs) and whose model metadata names the data inputs
(`mdot.data_inputs`), so the loader can tell data from parameters.

PyTorch: we use the TorchScript ("legacy") exporter, `dynamo=False`, with
`training=TrainingMode.TRAINING`, `do_constant_folding=False` and `export_params=False`:
- training mode keeps BatchNormalization with `training_mode=1` (batch statistics, the work a
  training step does) and keeps Dropout, instead of folding BN into the preceding Conv;
- `export_params=False` turns every parameter and buffer into a shaped graph input;
- it traces in about a second for a ResNet-50, where the dynamo exporter runs torch.export and
  decomposes into many more aten-level nodes, which costs minutes across the ~840 timm models.
The batch dim of every input is exported as dynamic, so one export serves every batch size.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import onnx

from converters.checks import merged_aliases
from converters.errors import ConversionError
from converters.gradients import checkpoint_calls, checkpoints, unreached, unread
from converters.patches import PACKED, complex_buffers, patched
from converters.recording import on_example, shares
from converters.selected import SUPPRESSED_KEY, unpacked
from converters.sequence import (
    CHECKPOINTED_KEY,
    DATA_INPUTS_KEY,
    FROZEN_KEY,
    LINEAR_KEY,
    LISTED_KEY,
    PACKED_KEY,
    PARAMS_KEY,
    SDPA_KEY,
    SELECTED_KEY,
    STATE_SPACE_KEY,
    UNREAD_KEY,
)
from converters.state_space import DOMAIN
from converters.substitutes import SUBSTITUTES, substituted
from converters.symbolics import SDPA_SOFTMAX
from converters.symbolics import register as register_symbolics
from converters.torch_inputs import (
    batch_axes,
    batch_first,
    data_input_names,
    example_args,
    is_array,
    listed,
    positional_forward,
    probe,
    to_meta,
    unwrapped,
)

OPSET = 17
FALLBACK_OPSET = 18  # only for graphs with ops opset 17 lacks (Col2Im)
# a model on the meta device that the tracer cannot run there (code reading values) is traced
# again on a CPU copy of zeros up to this size
CPU_FALLBACK_BYTES = 4e9


def _mark_data_inputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    model.metadata_props.add(key=DATA_INPUTS_KEY, value=",".join(names))
    return model


@contextlib.contextmanager
def _quiet_fds():
    """Silences stdout and stderr down to the file descriptors: on failure the exporter's C++
    prints the whole Torch IR graph (thousands of lines) before raising."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def _meta_constants_as_zeros(torch, active: bool):
    """On the meta device, the tracer folds tensors computed from constants alone (Llama's
    rotary `inv_freq`, MPT's ALiBi slopes) into graph constants that have no values, which
    common-subexpression elimination and ONNX lowering read: they become zeros of their shape
    and dtype (the graph's shapes, all we read, hold)."""
    if not active:
        yield
        return
    passes = {name: getattr(torch._C, name) for name in ("_jit_pass_cse", "_jit_pass_onnx")}

    def fill(block) -> None:
        for node in block.nodes():
            for sub in node.blocks():
                fill(sub)
            if (node.kind() == "prim::Constant" and node.hasAttribute("value")
                    and node.kindOf("value") == "t" and node.t("value").is_meta):
                value = node.t("value")
                node.t_("value", torch.zeros(value.shape, dtype=value.dtype))

    def filled(run):
        def patched(graph, *args):
            fill(graph)
            return run(graph, *args)
        return patched

    for name, run in passes.items():  # before the first pass that reads constants' values
        setattr(torch._C, name, filled(run))
    try:
        yield
    finally:
        for name, run in passes.items():
            setattr(torch._C, name, run)


@contextlib.contextmanager
def _meta_convolutions(torch, active: bool):
    """On the meta device a convolution runs PyTorch's Python meta kernel, which the tracer
    records in its place (its shape arithmetic and an empty tensor: no Conv, no weight) or
    which fails on the sizes it records as tensors ("cond must be a bool"). There, each
    `F.conv1d` / `conv2d` / `conv3d` with explicit padding is one operator, its output shaped
    by the convolution's arithmetic, that exports as ONNX's Conv (Mamba-2's and the gated
    delta rule's causal convolutions)."""
    if not active:
        yield
        return
    import torch.nn.functional as F
    from torch.onnx import symbolic_helper as sh

    class Conv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, stride, padding, dilation, groups):  # [N, C, *L] -> [N, O, *L']
            spatial = [(int(n) + 2 * p - d * (int(k) - 1) - 1) // s + 1 for n, k, s, p, d in
                       zip(x.shape[2:], w.shape[2:], stride, padding, dilation)]
            return x.new_empty((int(x.shape[0]), int(w.shape[0]), *spatial))

        @staticmethod
        def symbolic(g, x, w, b, stride, padding, dilation, groups):
            inputs = (x, w) if b is None or sh._is_none(b) else (x, w, b)
            return g.op("Conv", *inputs, strides_i=stride, pads_i=list(padding) * 2,
                        dilations_i=dilation, group_i=groups)

    def meta(run, n: int):
        def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
            if not input.is_meta or isinstance(padding, str):
                return run(input, weight, bias, stride, padding, dilation, groups)
            dims = [tuple(map(int, v)) if isinstance(v, (tuple, list)) else (int(v),) * n
                    for v in (stride, padding, dilation)]  # sizes the tracer made tensors: ints
            return Conv.apply(input, weight, bias, *dims, int(groups))
        return conv

    saved = {f"conv{n}d": getattr(F, f"conv{n}d") for n in (1, 2, 3)}
    for name, run in saved.items():
        setattr(F, name, meta(run, int(name[4])))
    try:
        yield
    finally:
        for name, run in saved.items():
            setattr(F, name, run)


def from_torch(module: Any, example_inputs: Any, *, input_names: Sequence[str] | None = None,
               dynamic_batch: bool = True, opset: int = OPSET) -> onnx.ModelProto:
    """Exports a `torch.nn.Module`'s training graph (forward in train mode) to ONNX.

    Args:
      module: the model; it is traced in train mode, then its mode and buffers are restored
        (BatchNorm's running statistics, which the traced forward moves).
      example_inputs: a tensor, a tuple (of tensors, or lists or dicts of them: a `batch`
        dict), or a dict passed by keyword (a tokenizer's output); they fix every dim but the
        batch.
      input_names: names for the data inputs (default a dict's keys, else `input0`, ...).
      dynamic_batch: export dim 0 of every input as the symbolic dim `batch`.
    """
    import torch

    if torch.get_default_device().type == "meta":  # called inside `with torch.device("meta")`:
        with torch.device("cpu"):  # trace as outside it (what the exporter makes is the CPU's)
            return from_torch(module, example_inputs, input_names=input_names,
                              dynamic_batch=dynamic_batch, opset=opset)
    register_symbolics(torch, OPSET, FALLBACK_OPSET)
    module = unwrapped(module)
    args, keywords = example_args(module, example_inputs)
    on_meta = any(p.is_meta for p in module.parameters())
    real = args  # as given: a CPU copy's export (below) reads its values
    if on_meta:  # a model built under `torch.device("meta")`: trace it there, allocating nothing
        args = to_meta(args)
    names = data_input_names(args, keywords, input_names)
    given, (batch, transposed) = args, probe(module, args, keywords, names)
    if samples := listed(module, args, keywords, names):  # torchvision's detection models'
        batch = samples["size"]  # images, each [C, H, W]
    args = batch_first(args, keywords, transposed)  # the graph takes every batch at dim 0
    buf = io.BytesIO()
    was_training, retry, fused = module.training, False, []
    buffers = dict(module.named_buffers())  # the tensors themselves, and their values
    kept = {n: b.detach().clone() for n, b in buffers.items() if not b.is_meta}
    # a Hugging Face model returns its key-value cache, no tensor: the step keeps none (T5's
    # encoder and decoder each read a copy of the model's config)
    cached: list[Any] = list({id(c): c for m in module.modules() if getattr(
        c := getattr(m, "config", None), "use_cache", None) is True}.values())
    try:
        for config in cached:
            config.use_cache = False
        module.train()
        with warnings.catch_warnings(), _quiet_fds(), _meta_constants_as_zeros(torch, on_meta), \
                _meta_convolutions(torch, on_meta), patched(torch), \
                positional_forward(module, args, keywords, transposed) as traced, \
                torch.no_grad(), \
                substituted(module) as fused, checkpoint_calls() as checkpointed, \
                complex_buffers(torch, module):
            # torch.no_grad(): no graph for a backward, a third the memory
            warnings.simplefilter("ignore")
            SDPA_SOFTMAX.clear()
            drawn = torch.random.get_rng_state()  # the example runs again on these draws
            torch.onnx.export(  # a BytesIO works as the file
                module, traced, buf,  # type: ignore[arg-type]
                dynamo=False, export_params=False,
                training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                input_names=names, opset_version=opset, custom_opsets={DOMAIN: 1},
                dynamic_axes=batch_axes(args, keywords, names, batch, bool(samples))
                if dynamic_batch else None)
        sized = any(op in buf.getvalue() for op in (b"NonZero", b"NonMaxSuppression"))
        selected = on_example(torch, module, given, keywords, drawn) if sized and not on_meta \
            else []
    except Exception as e:  # exporter errors are many and untyped; keep the first line
        # e.g. aten::col2im (VOLO) exists from opset 18 on: export again there
        retry = opset < FALLBACK_OPSET and f"version {FALLBACK_OPSET}" in str(e)
        big = "2GiB limit" in str(e)  # constants it holds (a mask over a batch's image patches)
        cpu = _on_cpu(torch, module) if not (retry or big) and on_meta and \
            _state_bytes(module) <= CPU_FALLBACK_BYTES else None
        if cpu is not None and not any(p.is_meta for p in cpu.parameters()):  # (a mode that
            # keeps tensors on the meta device copies none to the CPU: no second try)
            zeros = tuple(torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor)
                          and a.is_meta else a for a in real)  # a CPU example's values kept
            # (the end tokens T5's and BART's classifiers select)
            example = zeros if keywords is None else dict(zip(keywords, zeros))
            try:
                return from_torch(cpu, example, input_names=input_names,
                                  dynamic_batch=dynamic_batch, opset=opset)
            except ConversionError:  # a weight divided by (D-FINE's box scale): NaN boxes the
                if not callable(getattr(cpu, "init_weights", None)):  # loss refuses; once more
                    raise  # with the model's own initial weights (a Hugging Face model's)
                with torch.no_grad():
                    cpu.init_weights()
                return from_torch(cpu, example, input_names=input_names,
                                  dynamic_batch=dynamic_batch, opset=opset)
        if not retry:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            msg = msg.split(". Therefore")[0]  # (not where to write it: a file is no help)
            hint = "; the values its graph holds (a mask over the example's image patches) " \
                "pass protobuf's 2 GB: a smaller image_size or batch exports" if big else \
                "" if not on_meta else "; it does not trace on the meta device" + (
                f" and holds more than {CPU_FALLBACK_BYTES / 1e9:g} GB to trace on the CPU: "
                "build a smaller config with the same layer shapes on the CPU" if cpu is None
                else ", and no CPU copy of it can be made here")
            if "selected index k out of range" in msg:  # torch.topk of more than there is
                hint += ("; a top-k asks for more than its tensor holds (a two-stage detector's "
                         "num_queries outnumbering its image's tokens: a larger image_size)")
            if isinstance(example_inputs, list) and "missing" in msg:  # one argument, a list
                hint += "; several inputs go as a tuple (or a dict by name), not a list"
            if any(isinstance(m, torch.ao.quantization.FakeQuantizeBase)
                   for m in module.modules()):
                hint += ("; quantization-aware training's fake quantization does not export "
                         "as a training step: export the float model (before prepare_qat), "
                         "priced without its fake quantization's elementwise passes")
            elif type(e).__name__ == "UnsupportedOperatorError":  # ctc_loss, lgamma, fft_rfft
                hint += ("; ONNX has no form of it: export a forward without it (a loss: no "
                         "labels given, so that the model returns its outputs)")
            raise ConversionError(f"torch export of {type(module).__name__} failed: "
                                  f"{type(e).__name__}: {msg}{hint}") from None
    finally:  # the user's module as it was: its mode, each buffer the tensor it held (a forward
        module.train(was_training)  # may replace one: a rotary cache grown), with its values
        with torch.no_grad():  # (BatchNorm's running statistics, moved in place)
            for n, b in buffers.items():
                owner, _, attr = n.rpartition(".")
                module.get_submodule(owner)._buffers[attr] = b
                if n in kept:
                    b.copy_(kept[n])
        for config in cached:
            config.use_cache = True
    if retry:
        return from_torch(module, example_inputs, input_names=input_names,
                          dynamic_batch=dynamic_batch, opset=FALLBACK_OPSET)
    model = unpacked(_mark_data_inputs(onnx.load_from_string(buf.getvalue()), names))
    params = [name for name, _ in module.named_parameters()]
    _unmerge(model, set(params) | {name for name, _ in module.named_buffers()})
    model.metadata_props.add(key=PARAMS_KEY, value=",".join(params))
    model.metadata_props.add(key=SDPA_KEY, value=",".join(map(str, SDPA_SOFTMAX)))
    frozen = [name for name, p in module.named_parameters() if not p.requires_grad]
    if frozen := frozen + unreached(module, given, keywords):  # no gradients
        model.metadata_props.add(key=FROZEN_KEY, value=",".join(frozen))
    if checkpointed or checkpoints(module):  # the step runs a forward again: said, not priced
        model.metadata_props.add(key=CHECKPOINTED_KEY, value="1")
    if missed := unread(module, {i.name for i in model.graph.input}):
        model.metadata_props.add(key=UNREAD_KEY, value=json.dumps(missed))
    if fused:
        model.metadata_props.add(key=LINEAR_KEY, value=",".join(fused))
    if samples:  # its batch: a list of samples, each its own input
        model.metadata_props.add(key=LISTED_KEY, value=json.dumps(samples))
    if selected and (found := shares(model, selected, batch if batch is not None else next(
            (a.shape[0] for a in args if hasattr(a, "shape") and a.dim()), None))):
        model.metadata_props.add(key=SELECTED_KEY, value=json.dumps(found[0]))
        if found[1]:  # what a detector's non-maximum suppressions kept
            model.metadata_props.add(key=SUPPRESSED_KEY, value=json.dumps(found[1]))
    if PACKED:  # run padded (`patches.packed_sequences`)
        model.metadata_props.add(key=PACKED_KEY, value=json.dumps(len(PACKED)))
    for shape in filter(None, (SUBSTITUTES[name].state_space(module) for name in fused)):
        model.metadata_props.add(key=STATE_SPACE_KEY, value=json.dumps(shape))
    return model


def _state_bytes(module: Any) -> int:
    """Bytes of a module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _on_cpu(torch, module: Any) -> Any:
    """A copy of a meta-device `module` on the CPU, its tensors zeros (an index buffer, such as
    a relative position table's, stays in range) and its tied weights tied: the graph is the
    same; the user's module stays on the meta device."""
    import copy

    cpu = copy.deepcopy(module).to_empty(device="cpu")
    first: dict[int, str] = {}  # to_empty gives each module its own tensor: tie them again
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            owner, _, attr = name.rpartition(".")
            setattr(cpu.get_submodule(owner), attr, cpu.get_parameter(first[id(p)]))
        else:
            first[id(p)] = name
    with torch.no_grad():
        for t in (*cpu.parameters(), *cpu.buffers()):
            t.zero_()
    return cpu


def _unmerge(model: onnx.ModelProto, tensors: set[str]) -> None:
    """Gives back every parameter and buffer its own graph input where the exporter merged it.

    The TorchScript exporter deduplicates tensors by data pointer and shape; on the meta device
    every pointer is null, so all equal-shaped weights collapse into one input and each other
    name becomes `Identity(first)`: GPT-2 125M would count 47M parameters. Truly shared
    weights are one entry of `named_parameters()` and are left alone. In place.
    """
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    aliases = merged_aliases(graph, set(inputs), tensors)
    for node in aliases:
        copy = graph.input.add()
        copy.CopyFrom(inputs[node.input[0]])
        copy.name = node.output[0]
    if aliases:
        given = {n.output[0] for n in aliases}  # each now a graph input of its own
        keep = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in given)]
        del graph.node[:]
        graph.node.extend(keep)


INFERENCE_EXPORTERS = ("torchscript", "dynamo")


def inference_export(module: Any, example_inputs: Any, *, exporter: str = "torchscript",
                     input_names: Sequence[str] | None = None) -> onnx.ModelProto:
    """The inference graph a user gets from `torch.onnx.export(model.eval(), x, f)` with the
    `exporter`'s defaults (weights exported, constant folding on; the dynamo exporter is
    torch's default since 2.9), with a dynamic batch dim. It folds BatchNormalization into
    Conv and drops Dropout: what `converters.training_view` reads back as a training step, and
    what `mdot dataset resequence --view` measures predicting from. No data-input metadata:
    the loader tells data from weights as it does for any file."""
    import torch

    if exporter not in INFERENCE_EXPORTERS:
        raise ConversionError(f"exporter {exporter!r}: one of {INFERENCE_EXPORTERS}")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    names = list(input_names or [f"input{i}" for i in range(len(args))])
    was_training = module.training
    try:
        module.eval()
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            dynamic = {n: {0: "batch"} for n in names}
            if exporter == "dynamo":
                program = torch.onnx.export(module, args, dynamo=True, input_names=names,
                                            dynamic_axes=dynamic, verbose=False)
                if program is None:
                    raise RuntimeError("the dynamo exporter returned no program")
                return program.model_proto
            with tempfile.TemporaryDirectory() as tmp:  # a file: weights over 2 GB go to
                path = os.path.join(tmp, "model.onnx")  # external data, left unread
                torch.onnx.export(module, args, path, dynamo=False, input_names=names,
                                  dynamic_axes=dynamic)
                return onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - exporter errors are many and untyped
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = msg.split(". Should contain")[0]  # not the hundreds of model types known
        raise ConversionError(f"{exporter} export of {type(module).__name__} failed: "
                              f"{type(e).__name__}: {msg}") from None
    finally:
        module.train(was_training)


def from_flax(fn: Any, example_inputs: Sequence[Any], *, input_names: Sequence[str] | None
              = None, opset: int = OPSET) -> onnx.ModelProto:
    """Exports a JAX/Flax callable with jax2onnx (`pip install jax2onnx`).

    jax2onnx's `value_info` can be wrong, so it is cleared here; the loader re-infers shapes.
    `example_inputs` are `jax.ShapeDtypeStruct`s or arrays; the first dim can be a symbol
    name (e.g. `("B", 224, 224, 3)`) to keep the batch dynamic.
    """
    for i, x in enumerate(example_inputs):
        if not (is_array(x) or isinstance(x, (tuple, list))):
            raise ConversionError(
                f"example_inputs[{i}]: a {type(x).__name__}, not an array or a shape; "
                "parameters go in the function, not its inputs (from_flax(lambda x: "
                "model.apply(params, x), [shape]))")
    try:
        from jax2onnx import to_onnx
    except ImportError:
        raise ConversionError("from_flax needs jax2onnx: pip install jax2onnx") from None
    try:
        with _quiet_fds():  # jax2onnx logs what it changes (a batch norm to inference)
            model = to_onnx(fn, list(example_inputs), opset=opset)
    except Exception as e:  # noqa: BLE001 - reported as one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = msg.split(". Should contain")[0]  # not the hundreds of model types known
        raise ConversionError(f"jax2onnx export failed: {type(e).__name__}: {msg}") from None
    if not isinstance(model, onnx.ModelProto):  # newer jax2onnx may return an IR model
        model = onnx.load_from_string(model.SerializeToString())
    del model.graph.value_info[:]
    inits = {i.name for i in model.graph.initializer}
    names = input_names or [i.name for i in model.graph.input if i.name not in inits]
    return _mark_data_inputs(model, names)


def from_keras(model: Any, input_signature: Sequence[Any], *, opset: int = OPSET
               ) -> onnx.ModelProto:
    """Exports a Keras model's training-mode call with tf2onnx (`pip install tensorflow-cpu
    tf2onnx`, best in an environment of their own: TensorFlow pins other numpy and protobuf).

    The model is traced as `tf.function(model(x, training=True))` and converted with
    `tf2onnx.convert.from_function`: `from_keras` fails on Keras 3 models (onnx/tensorflow-onnx
    #2448, a KeyError on Keras-tensor output names), and training mode keeps Dropout and the
    batch statistics of BatchNormalization in the graph. `None` dims of the signature (the
    batch) stay symbolic.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
        import tf2onnx
    except ImportError:
        raise ConversionError("from_keras needs tensorflow and tf2onnx: "
                              "pip install tensorflow-cpu tf2onnx") from None
    fn = tf.function(lambda *xs: model(xs[0] if len(xs) == 1 else list(xs), training=True))
    try:
        proto, _ = tf2onnx.convert.from_function(
            fn, input_signature=list(input_signature), opset=opset,
            custom_op_handlers={"StatelessRandomUniformV2": (_random_uniform_like, ())})
    except Exception as e:  # noqa: BLE001 - reported as one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = msg.split(". Should contain")[0]  # not the hundreds of model types known
        raise ConversionError(f"tf2onnx export failed: {type(e).__name__}: {msg}") from None
    inits = {i.name for i in proto.graph.initializer}
    # the trainable weights are the variables the function reads; tf2onnx folds the reads
    # of some (biases, BatchNorm scale and shift) into constants, which are then not counted
    variables = [i.name for i in proto.graph.initializer if "ReadVariableOp" in i.name]
    proto.metadata_props.add(key=PARAMS_KEY, value=",".join(variables))
    return _mark_data_inputs(proto, [i.name for i in proto.graph.input if i.name not in inits])


def _random_uniform_like(ctx, node, name, args):
    """tf2onnx handler: Keras 3 Dropout's StatelessRandomUniformV2(shape, key, counter, alg),
    which tf2onnx does not convert, as RandomUniformLike(ConstantOfShape(shape))."""
    shape = ctx.make_node("Cast", [node.input[0]], attr={"to": onnx.TensorProto.INT64})
    zeros = ctx.make_node("ConstantOfShape", shape.output)
    ctx.replace_inputs(node, zeros.output.copy())
    node.type = "RandomUniformLike"
    for attr in list(node.attr):
        del node.attr[attr]
