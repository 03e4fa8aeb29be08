"""The TorchScript exporter's symbolics we add or replace (`register`): what a training graph
of the models we export needs at our opset, each an ONNX rendering of what the aten operator
computes (noise as random draws: their values are never read, their shapes and kernels are)."""

from __future__ import annotations

from typing import Any

import onnx

_REGISTERED = False
# each scaled_dot_product_attention an export emits: how many Softmax nodes its graph held
# before this call's (its own Softmax's ordinal among the graph's Softmax nodes, in order)
SDPA_SOFTMAX: list[int] = []
_COUNTED: list = []  # this export's graph's last node counted, and its Softmax nodes up to it


def softmax_nodes(graph: Any) -> int:
    """The Softmax nodes `graph` holds, counted from where this export's last count ended
    (walking back from the graph's end; all of them at its first call, or where that node is
    gone): an encoder's thousands of window calls would count the whole graph each."""
    if not SDPA_SOFTMAX:  # a new export
        _COUNTED.clear()
    last, count = _COUNTED or (None, 0)
    node, new = graph.return_node().prev(), 0
    while node is not last and node.kind() != "prim::Param":
        new += node.kind() == "onnx::Softmax"
        node = node.prev()
    count = (count if node is last else 0) + new
    _COUNTED[:] = [graph.return_node().prev(), count]
    return count


def register(torch: Any, opset: int, fallback_opset: int) -> None:
    """Registers, once, the symbolics the TorchScript exporter lacks at `opset` (rms_norm,
    training-mode feature_dropout, diff, cumsum of a bool tensor, uniform and exponential noise,
    expm1, grouped-query SDPA, complex rotary embeddings, a mask's `&=`, `|=`, `^=`, `.mT`,
    elementwise formulas: logaddexp, xlogy, cumprod, isin, take_along_dim, randperm, ...) or gets
    wrong: with a dynamic batch (col2im, at `fallback_opset`), negative axes (permute), or for
    the rest of the graph (repeat_interleave)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from torch.onnx import symbolic_helper as sh

    def like(g, v, x):  # a constant of x's type
        return g.op("CastLike", g.op("Constant", value_t=torch.tensor(v)), x)

    def rms_norm(g, x, normalized_shape, weight, eps):
        axes = list(range(-len(sh._get_const(normalized_shape, "is", "normalized_shape")), 0))
        eps = 1e-6 if sh._is_none(eps) else sh._get_const(eps, "f", "eps")
        sq = g.op("Mul", x, x)
        mean_sq = (g.op("ReduceMean", sq, axes_i=axes, keepdims_i=1) if g.opset < 18 else
                   g.op("ReduceMean", sq, g.op("Constant", value_t=torch.tensor(axes)),
                        keepdims_i=1))
        y = g.op("Div", x, g.op("Sqrt", g.op("Add", mean_sq, like(g, eps, x))))
        return y if sh._is_none(weight) else g.op("Mul", y, weight)

    def feature_dropout(g, x, p, train):  # Dropout2d/3d: costed like Dropout
        ratio = g.op("Constant", value_t=torch.tensor(sh._get_const(p, "f", "p"),
                                                      dtype=torch.float32))
        return g.op("Dropout", x, ratio, g.op("Constant", value_t=torch.tensor(True)))

    @sh.parse_args("v", "v", "v", "is", "is", "is")
    def col2im(g, x, output_size, kernel_size, dilation, padding, stride):
        # torch's own opset-18 symbolic needs the static size of `output_size`, which the
        # dynamic batch hides; a fold is always 2-D, so it is not needed
        return g.op("Col2Im", x, output_size, kernel_size, dilations_i=dilation or [1, 1],
                    pads_i=list(padding) * 2 if padding else [0] * 4,
                    strides_i=stride or [1, 1])

    @sh.parse_args("v", "i", "i", "v", "v")
    def diff(g, x, n, dim, prepend, append):  # Hugging Face masks take torch.diff
        if n != 1:
            return sh._unimplemented("diff", "n > 1")
        parts = [t for t in (prepend, x, append) if not sh._is_none(t)]
        x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else x

        def const(v):
            return g.op("Constant", value_t=torch.tensor([v]))

        return g.op("Sub", g.op("Slice", x, const(1), const(2 ** 62), const(dim)),
                    g.op("Slice", x, const(0), const(-1), const(dim)))

    def cumsum(g, x, dim, dtype=None):  # of a bool mask, as torch sums it (as int64)
        from torch.onnx import symbolic_opset11

        if x.type().scalarType() == "Bool":
            x = g.op("Cast", x, to_i=onnx.TensorProto.INT64)
        return symbolic_opset11.cumsum(g, x, dim, dtype)

    def repeat_interleave(g, x, repeats, dim=None, output_size=None):
        # torch's symbolic adds the rank to a negative `dim` in place, in the constant node
        # the graph pools: every later -1 of the model became that number (Cohere's rotary
        # interleave turned its rotate_half's stack(dim=-1) into stack(dim=2))
        from torch.onnx import symbolic_opset13

        if not sh._is_none(dim):
            dim = g.op("Constant", value_t=torch.tensor(sh._get_const(dim, "i", "dim")))
        return symbolic_opset13.repeat_interleave(g, x, repeats, dim, output_size)

    def expm1(g, x):  # xIELU's activation (Apertus)
        return g.op("Sub", g.op("Exp", x), like(g, 1.0, x))

    @sh.parse_args("v", "f", "v")
    def exponential(g, x, lambd, generator):  # in-place noise: a router's jitter (PhiMoE)
        u = g.op("RandomUniformLike", x)
        return g.op("Div", g.op("Neg", g.op("Log", g.op("Sub", like(g, 1.0, x), u))),
                    like(g, lambd, x))

    def repeat_heads(g, t, q):  # t [B, Hkv, S, D] to q's heads [B, Hq, S, D], each kv head
        # Hq / Hkv times in turn (transformers' repeat_kv), by the graph's own shapes where
        # the trace left the counts unknown (Qwen3.5's images: positions joined on meta)
        def dims(shape, start, end):
            return sh._slice_helper(g, shape, axes=[0], starts=[start], ends=[end])

        have, want = g.op("Shape", t), g.op("Shape", q)
        b, kv, rest, heads = dims(have, 0, 1), dims(have, 1, 2), dims(have, 2, 4), \
            dims(want, 1, 2)
        x = g.op("Expand", sh._unsqueeze_helper(g, t, [2]),  # [B, Hkv, Hq / Hkv, S, D]
                 g.op("Concat", b, kv, g.op("Div", heads, kv), rest, axis_i=0))
        return g.op("Reshape", x, g.op("Concat", b, heads, rest, axis_i=0))

    @sh.parse_args("v", "v", "v", "v", "f", "b", "v", "b")
    def sdpa(g, q, k, v, mask, p, causal, scale, gqa):  # grouped-query: K and V repeated
        from torch.onnx import symbolic_opset14

        if gqa:
            heads, kv = (sh._get_tensor_sizes(t) for t in (q, k))
            if heads and kv and heads[-3] and kv[-3]:
                times = g.op("Constant", value_t=torch.tensor(heads[-3] // kv[-3]))
                k, v = (repeat_interleave(g, t, times, g.op("Constant",
                                                            value_t=torch.tensor(-3)))
                        for t in (k, v))
            elif sh._get_tensor_rank(q) == 4 and sh._get_tensor_rank(k) == 4:
                k, v = (repeat_heads(g, t, q) for t in (k, v))
            else:
                return sh._unimplemented("scaled_dot_product_attention",
                                         "enable_gqa with heads of unknown count", q)
        SDPA_SOFTMAX.append(softmax_nodes(g.graph))  # the Softmax nodes before this call's
        return symbolic_opset14.scaled_dot_product_attention(g, q, k, v, mask, p, causal,
                                                             scale, False)

    # complex tensors (Llama 4's and DeepSeek-V2's rotary: polar, view_as_complex, a product,
    # view_as_real) as real ones with a last axis of 2 (real, imaginary): what view_as_real
    # shows, so the views are identities; a product is complex where the traced value was
    def complex_at(g, i: int) -> bool:  # the traced input i (-1: the output) was complex
        node = g.original_node
        t = (node.output() if i < 0 else list(node.inputs())[i]).type()
        return getattr(t, "scalarType", lambda: None)() in ("ComplexFloat", "ComplexDouble",
                                                              "ComplexHalf")

    def to(g, x, *args):
        from torch.onnx import symbolic_opset9

        return x if complex_at(g, -1) else symbolic_opset9.to(g, x, *args)

    def pair(g, re, im):
        last = g.op("Constant", value_t=torch.tensor([-1]))
        return g.op("Concat", g.op("Unsqueeze", re, last), g.op("Unsqueeze", im, last), axis_i=-1)

    def parts(g, z):
        return (g.op("Gather", z, g.op("Constant", value_t=torch.tensor(i)), axis_i=-1)
                for i in (0, 1))

    def polar(g, r, theta):
        return pair(g, g.op("Mul", r, g.op("Cos", theta)), g.op("Mul", r, g.op("Sin", theta)))

    def as_is(g, x):
        return x

    def mul(g, x, y):
        from torch.onnx import symbolic_opset9

        cx, cy = complex_at(g, 0), complex_at(g, 1)
        if not (cx or cy):
            return symbolic_opset9.mul(g, x, y)
        if not (cx and cy):  # a complex tensor (float32 pairs, as rotaries compute) by a real
            z, r = (x, y) if cx else (y, x)
            return g.op("Mul", z, g.op("Cast", r, to_i=onnx.TensorProto.FLOAT))
        (a, b), (c, d) = parts(g, x), parts(g, y)
        return pair(g, g.op("Sub", g.op("Mul", a, c), g.op("Mul", b, d)),
                    g.op("Add", g.op("Mul", a, d), g.op("Mul", b, c)))

    def view(g, x, size):  # a complex tensor's view: its pairs' shape ends in 2
        from torch.onnx import symbolic_opset9

        if complex_at(g, 0):
            size = sh._maybe_get_const(size, "is")
            size = g.op("Concat", size, g.op("Constant", value_t=torch.tensor([2])), axis_i=0) \
                if sh._is_value(size) else g.op("Constant", value_t=torch.tensor([*size, 2]))
        return symbolic_opset9.view(g, x, size)

    @sh.parse_args("v", "is")
    def permute(g, x, dims):  # ONNX's perm takes no negative axes (Mamba-2's permute(0, -2, ...))
        rank = len(dims)  # a permutation names every axis
        perm = [d % rank for d in dims]
        return x if perm == list(range(rank)) else g.op("Transpose", x, perm_i=perm)

    # what ONNX has no operator of, as the formula of operators it has (each the value torch
    # computes, but at -0.0 and infinities)
    def logaddexp(g, a, b):  # max + log(1 + e^-|a - b|)
        return g.op("Add", g.op("Max", a, b), g.op("Log", g.op("Add", like(g, 1.0, a), g.op(
            "Exp", g.op("Neg", g.op("Abs", g.op("Sub", a, b)))))))

    def hypot(g, a, b):
        return g.op("Sqrt", g.op("Add", g.op("Mul", a, a), g.op("Mul", b, b)))

    def xlogy(g, x, y):  # 0 where x is 0
        return g.op("Where", g.op("Equal", x, like(g, 0.0, x)), like(g, 0.0, x),
                    g.op("Mul", x, g.op("Log", y)))

    def copysign(g, a, b):
        return g.op("Mul", g.op("Abs", a), g.op("Where", g.op("Less", b, like(g, 0.0, b)),
                                                like(g, -1.0, a), like(g, 1.0, a)))

    def trunc(g, x):
        return g.op("Where", g.op("Less", x, like(g, 0.0, x)), g.op("Ceil", x), g.op("Floor", x))

    def frac(g, x):
        return g.op("Sub", x, trunc(g, x))

    def sinc(g, x):  # sin(pi x) / (pi x), 1 at 0
        px = g.op("Mul", x, like(g, 3.141592653589793, x))
        return g.op("Where", g.op("Equal", x, like(g, 0.0, x)), like(g, 1.0, x),
                    g.op("Div", g.op("Sin", px), px))

    @sh.parse_args("v", "v", "v", "f")
    def addcdiv(g, x, a, b, value):
        q = g.op("Div", a, b)
        return g.op("Add", x, q if value == 1 else g.op("Mul", q, like(g, float(value), q)))

    @sh.parse_args("v", "v", "b", "b")
    def isin(g, x, test, unique, invert):  # any of x == test's elements, over them
        hit = g.op("Equal", sh._unsqueeze_helper(g, x, [-1]), sh._reshape_helper(
            g, test, g.op("Constant", value_t=torch.tensor([-1]))))
        found = g.op("Cast", g.op("ReduceMax", g.op("Cast", hit, to_i=onnx.TensorProto.INT32),
                                  axes_i=[-1], keepdims_i=0), to_i=onnx.TensorProto.BOOL)
        return g.op("Not", found) if invert else found

    @sh.parse_args("v", "v", "i")
    def take_along_dim(g, x, index, dim):
        if sh._get_tensor_rank(x) != sh._get_tensor_rank(index) or dim is None:
            return sh._unimplemented("take_along_dim", "an index of another rank, or no dim", x)
        return g.op("GatherElements", x, index, axis_i=dim)

    @sh.parse_args("v", "i", "v")
    def cumprod(g, x, dim, dtype):  # e^(cumsum log|x|), its sign by the negatives so far
        axis = g.op("Constant", value_t=torch.tensor(dim))
        real = x.type().scalarType() in ("Float", "Double", "Half", "BFloat16")
        size = g.op("Exp", g.op("CumSum", g.op("Log", g.op("Abs", x if real else g.op(
            "Cast", x, to_i=onnx.TensorProto.DOUBLE))), axis))
        size = size if real else g.op("CastLike", g.op("Round", size), x)
        negatives = g.op("CumSum", g.op("Cast", g.op("Less", x, like(g, 0.0, x)),
                                        to_i=onnx.TensorProto.INT64), axis)
        odd = g.op("Equal", g.op("Mod", negatives, g.op("Constant", value_t=torch.tensor(2))),
                   g.op("Constant", value_t=torch.tensor(1)))
        return g.op("Where", odd, g.op("Neg", size), size)

    @sh.parse_args("v", "i")
    def logcumsumexp(g, x, dim):  # the max + log cumsum e^(x - max)
        top = g.op("ReduceMax", x, axes_i=[dim], keepdims_i=1)
        return g.op("Add", top, g.op("Log", g.op("CumSum", g.op("Exp", g.op("Sub", x, top)),
                                                 g.op("Constant", value_t=torch.tensor(dim)))))

    def full(g, sizes, value, dtype, *rest):  # torch.full(size, 0) without a dtype is the
        # fill's type (int64), which torch's symbolic makes float (SmolVLM's position ids)
        from torch.onnx import symbolic_opset9

        kind = getattr(g.original_node.output().type(), "dtype", lambda: None)()
        fill = sh._maybe_get_const(value, "t")
        if not sh._is_none(dtype) or kind is None or kind.is_floating_point or \
                sh._is_value(fill):
            return symbolic_opset9.full(g, sizes, value, dtype, *rest)
        if sh._maybe_get_const(sizes, "is") == []:
            sizes = g.op("Constant", value_t=torch.tensor([], dtype=torch.int64))
        return g.op("ConstantOfShape", sizes, value_t=fill.view(1).to(kind))

    def swapped(g, x):  # x.mT, x.mH, x.adjoint() (of real tensors): the last two axes swapped
        rank = sh._get_tensor_rank(x)
        if rank is None or rank < 2:
            return sh._unimplemented("mT", "an input of unknown rank or fewer than 2 axes", x)
        return g.op("Transpose", x, perm_i=[*range(rank - 2), rank - 1, rank - 2])

    @sh.parse_args("v", "i", "v")
    def unflatten(g, x, dim, sizes):  # torch's computes a negative dim in the graph (Add, Mod),
        # where the exporter's shape inference loses the output's rank and falls back to the
        # traced shapes: every size read downstream was a constant, the batch's too (Qwen4's
        # hyper-connections' unflatten(-1, ...))
        rank = sh._get_tensor_rank(x)
        if rank is None:
            return sh._unimplemented("unflatten", "an input of unknown rank", x)
        dim %= rank
        shape = g.op("Shape", x)
        head = sh._slice_helper(g, shape, axes=[0], starts=[0], ends=[dim])
        tail = sh._slice_helper(g, shape, axes=[0], starts=[dim + 1], ends=[rank])
        return sh._reshape_helper(g, x, g.op("Concat", head, sizes, tail, axis_i=0))

    @sh.parse_args("v", "f", "f", "v")
    def uniform(g, x, low, high, generator):  # in-place noise, e.g. Switch routers' jitter
        return g.op("RandomUniformLike", x, low_f=low, high_f=high)

    def randint_like(g, x, low, high, dtype, *_):  # integers drawn in [low, high) shaped as
        # x, which may be a mask (RT-DETR's noised labels): drawn as floats, then cast (torch's
        # symbolic draws x's own type: ONNX draws floats alone)
        lo, hi = (sh._get_const(v, "i", "bound") for v in (low, high))
        kind = sh._get_const(dtype, "i", "dtype")  # torch's scalar type, None for x's own
        draws = g.op("Floor", g.op("RandomUniformLike", x, low_f=lo, high_f=hi,
                                   dtype_i=onnx.TensorProto.FLOAT))
        return g.op("CastLike", draws, x) if kind is None else g.op(
            "Cast", draws, to_i=int(sh.scalar_type_to_onnx[kind]))

    def randperm(g, n, *_):  # detection's samplers: the order of n uniform draws
        size = sh._reshape_helper(g, n if sh._is_value(n) else g.op(
            "Constant", value_t=torch.tensor(n)), g.op("Constant", value_t=torch.tensor([1])))
        draws = g.op("RandomUniformLike", g.op("ConstantOfShape", size))
        return g.op("TopK", draws, size, axis_i=0, outputs=2)[1]

    from torch.onnx import symbolic_opset9, symbolic_opset13

    def pieces(g, x, dim, n):  # x's n slices along dim, as the list torch's code indexes
        return g.op("SequenceConstruct", *(g.op("Gather", x, g.op(
            "Constant", value_t=torch.tensor(k)), axis_i=dim) for k in range(n)))

    @sh.parse_args("v", "i", "i")
    def unbind(g, x, dim=0, _outputs=None):  # torch's gives SplitToSequence a split of 1,
        if _outputs is not None:  # which keeps the dim (ONNX reads keepdims only without one)
            return symbolic_opset13.unbind(g, x, dim, _outputs)
        sizes = sh._get_tensor_sizes(x) or []
        if dim >= len(sizes) or sizes[dim] is None:
            return g.op("SplitToSequence", x, axis_i=dim, keepdims_i=0)
        return pieces(g, x, dim, sizes[dim])

    def nonzero_numpy(g, x, _outputs=None):  # `torch.nonzero(mask, as_tuple=True)`: each
        rank = sh._get_tensor_rank(x)  # dim's indices [N]
        if rank is None or _outputs is not None:
            return unbind(g, symbolic_opset9.nonzero(g, x), 1, _outputs)
        return pieces(g, g.op("NonZero", x), 0, rank)  # of [rank, N]

    @sh.parse_args("v", "v", "v", "i")
    def where(g, condition, x=None, other=None, _outputs=None):  # `torch.where(mask)`: [N]s
        if x is not None:
            return symbolic_opset13.where(g, condition, x, other, _outputs)
        if not sh._is_bool(condition):
            condition = g.op("Cast", condition, to_i=onnx.TensorProto.BOOL)
        return nonzero_numpy(g, condition, _outputs)

    def bitwise(op):  # of integers (torchvision's uint8 sampling masks): ONNX's from opset
        def fn(g, *xs):  # 18 on, where the export is tried again
            if all(sh._is_bool(x) for x in xs):
                return g.op(op, *xs)
            if g.opset < fallback_opset:
                raise ValueError(f"an integer bitwise {op.lower()} exists in ONNX from version "
                                 f"{fallback_opset} on")
            kind = next(x for x in xs if not sh._is_bool(x))  # a bool with an int: as the int
            return g.op(f"Bitwise{op}", *(x if x.type().scalarType() == kind.type(
            ).scalarType() else g.op("CastLike", x, kind) for x in xs))
        return fn

    def antialiased(name, mode):  # `interpolate(..., antialias=True)` (DINOv2's, SigLIP2's
        def fn(g, x, size, align_corners, scales):  # position tables): PIL's filters (cubic's
            if g.opset < fallback_opset:  # a = -0.5, weights renormalised at the borders),
                raise ValueError(f"an antialiased resize exists in ONNX from version "  # ONNX's
                                 f"{fallback_opset} on")  # from opset 18 on
            out = sh._interpolate_helper(name, 4, mode)(g, x, size, align_corners, scales)
            out.node().i_("antialias", 1).i_("exclude_outside", 1).f_("cubic_coeff_a", -0.5)
            return out
        return fn

    torch.onnx.register_custom_op_symbolic("aten::col2im", col2im, fallback_opset)
    for name, mode in (("_upsample_bilinear2d_aa", "linear"), ("_upsample_bicubic2d_aa", "cubic")):
        torch.onnx.register_custom_op_symbolic(f"aten::{name}", antialiased(name, mode), opset)
    for op, names in (("And", ("__and_", "__iand_", "bitwise_and")),  # `mask &= other`
                      ("Or", ("__or_", "__ior_", "bitwise_or")),
                      ("Xor", ("__xor_", "__ixor_", "bitwise_xor")), ("Not", ("bitwise_not",))):
        for name in names:
            torch.onnx.register_custom_op_symbolic(f"aten::{name}", bitwise(op), opset)
    for name, fn in (("rms_norm", rms_norm), ("feature_dropout", feature_dropout),
                     ("diff", diff), ("cumsum", cumsum), ("repeat_interleave", repeat_interleave),
                     ("expm1", expm1), ("exponential", exponential), ("uniform", uniform),
                     ("scaled_dot_product_attention", sdpa), ("permute", permute),
                     ("polar", polar), ("view_as_complex", as_is), ("view_as_real", as_is),
                     ("lift_fresh", as_is),
                     ("mul", mul), ("to", to), ("view", view), ("unflatten", unflatten),
                     ("mT", swapped), ("mH", swapped), ("adjoint", swapped),
                     ("logaddexp", logaddexp),
                     ("hypot", hypot), ("xlogy", xlogy), ("copysign", copysign), ("trunc", trunc),
                     ("frac", frac), ("sinc", sinc), ("addcdiv", addcdiv), ("isin", isin),
                     ("take_along_dim", take_along_dim), ("cumprod", cumprod),
                     ("logcumsumexp", logcumsumexp), ("full", full), ("randperm", randperm),
                     ("randint_like", randint_like),
                     ("unbind", unbind), ("nonzero_numpy", nonzero_numpy), ("where", where)):
        torch.onnx.register_custom_op_symbolic(f"aten::{name}", fn, opset)
    _REGISTERED = True
