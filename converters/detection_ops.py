"""The operators torchvision's detectors export (`torchvision.ops`): RoIAlign's bilinear samples
and non-maximum suppression's box overlaps, with `converters.ops`' handlers (registered on
import, by `converters`)."""

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
