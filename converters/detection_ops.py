"""The operators detectors export: torchvision's (`torchvision.ops`) RoIAlign's bilinear samples
and non-maximum suppression's box overlaps, deformable attention's samples (`grid_sample`:
Deformable DETR's and its kin's, Mask2Former's), with `converters.ops`' handlers (registered
on import, by `converters`)."""

from __future__ import annotations

from converters.ops import Cost, NodeView, _out, register


@register("RoiAlign", testcases=(
    (dict(op_type="RoiAlign", attrs=dict(sampling_ratio=2),
          in_shapes=[(2, 256, 50, 50), (10, 4), (10,)], out_shapes=[(10, 256, 7, 7)]),
     10 * 256 * 7 * 7 * 2 * 2 * 8),
    # an adaptive ratio (0): taken as 2
    (dict(op_type="RoiAlign", attrs=dict(sampling_ratio=0),
          in_shapes=[(1, 8, 9, 9), (3, 4), (3,)], out_shapes=[(3, 8, 2, 2)]), 3 * 8 * 4 * 4 * 8),
))
def roi_align(node: NodeView) -> Cost:
    """RoIAlign: each output the mean of `sampling_ratio`^2 bilinear samples of 4 taps (8
    FLOPs a sample); torchvision's adaptive ratio (0, the RoI's size over the output's) taken
    as 2. The backward scatters as many."""
    ratio = int(node.attrs.get("sampling_ratio", 0)) or 2
    return Cost(float(_out(node) * ratio * ratio * 8), 1.0)


@register("NonMaxSuppression", testcases=(
    (dict(op_type="NonMaxSuppression", in_shapes=[(1, 100, 4), (1, 1, 100)],
          out_shapes=[(30, 3)]), 1 * 1 * 100 * 100 * 12),
))
def non_max_suppression(node: NodeView) -> Cost:
    """Non-maximum suppression: the overlap of every pair of a batch and class's N boxes (12
    FLOPs a pair, as the CUDA kernel's mask computes them all); boxes kept have no gradient."""
    b, c, n = node.in_shapes[1]
    return Cost(float(b * c * n * n * 12), 0.0)


@register("GridSample", testcases=(
    # 300 queries x 4 points of 8 heads' [32, 20, 20] values: 4 taps (8 FLOPs) an output
    (dict(op_type="GridSample", attrs=dict(mode="bilinear"),
          in_shapes=[(8, 32, 20, 20), (8, 300, 4, 2)], out_shapes=[(8, 32, 300, 4)]),
     8 * 32 * 300 * 4 * 8),
    (dict(op_type="GridSample", attrs=dict(mode="nearest"),
          in_shapes=[(1, 2, 4, 4), (1, 3, 3, 2)], out_shapes=[(1, 2, 3, 3)]), 0),
))
def grid_sample(node: NodeView) -> Cost:
    """GridSample: each output a bilinear sample of 4 taps (8 FLOPs), a bicubic one of 16
    (32), a nearest one a copy (opset 16's mode names and opset 20's). The backward scatters
    as many into the input's gradient and the grid's."""
    per_out = {"bilinear": 8, "linear": 8, "bicubic": 32, "cubic": 32}.get(
        node.attrs.get("mode", "bilinear"), 0)
    return Cost(float(per_out * _out(node)), 1.0)
