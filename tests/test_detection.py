"""Detectors' training steps (torchvision's): a batch given as a list of images, the sizes
non-maximum suppression and chained selections decide, and the operators they export
(`converters.torch_inputs.listed`, `converters.recording`, `converters.selected`,
`converters.symbolics`, `converters.detection_ops`)."""

import json

import numpy as np
import pytest

from converters import ConversionError, convert, from_torch
from converters.dims import converted_batch
from converters.selected import SUPPRESSED_KEY
from converters.sequence import CONFIG_FIELDS, LISTED_KEY, SELECTED_KEY

torch = pytest.importorskip("torch")


def _meta(graph, key):
    return next((p.value for p in graph.metadata_props if p.key == key), None)


class Stacked(torch.nn.Module):
    """Takes its images as a list, each [C, H, W], and stacks them, as torchvision's
    detectors do; boxes a list too, [K, 4] an image."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, images, boxes=None):
        x = self.conv(torch.stack(images))  # [N, 4, H, W]
        extra = 0 if boxes is None else sum(b.sum() for b in boxes)
        return x.mean() + extra


def test_a_list_of_images_is_a_batch_of_its_length_and_no_other():
    """A list of 2 images [3, 16, 16] and 2 boxes each [2, 4] took dim 0 as the batch: the
    boxes' 2 (or the images' 3 channels), so `--batch-size 8` grew the boxes (the channels)
    and priced 2 images: a silent wrong answer. The list's length is the batch, fixed."""
    images = [torch.randn(3, 16, 16) for _ in range(2)]
    graph = from_torch(Stacked(), (images, [torch.rand(2, 4), torch.rand(2, 4)]))
    said = json.loads(_meta(graph, LISTED_KEY))
    assert said == {"size": 2, "inputs": ["input0_0", "input0_1"]}
    seq = convert(graph, batch_size=2)
    assert converted_batch(seq) == 2 and seq.meta["inputs"]["input0_0"] == [3, 16, 16]
    assert seq.meta["inputs"]["input1_0"] == [2, 4]
    with pytest.raises(ConversionError, match=r"its batch is a list of 2 samples \(input0_0, "
                       r"input0_1\).*export a list of 8 to predict --batch-size 8"):
        convert(graph, batch_size=8)


def test_a_list_of_inputs_each_with_its_batch_is_no_list_batch():
    """Feature maps [B, C, H, W] given as a list (an FPN head's) are read at their own B."""

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 1)

        def forward(self, maps):
            return sum(self.conv(m).mean() for m in maps)

    graph = from_torch(Head(), ([torch.randn(2, 4, 8, 8), torch.randn(2, 4, 4, 4)],))
    assert _meta(graph, LISTED_KEY) is None
    assert convert(graph, batch_size=6).meta["inputs"]["input0_1"] == [6, 4, 4, 4]


@torch.jit.script_if_tracing
def _first(levels: torch.Tensor, level: int) -> torch.Tensor:
    return torch.where(levels == level)[0]  # scripted: a list of unknown length


def test_where_of_a_mask_in_scripted_code_is_one_dim_per_index():
    """`torch.where(mask)[0]` where the list's length is not known to the trace (torchvision's
    RoI pooling by level) exported SplitToSequence with a split of 1, which keeps the dim:
    [N, 1] indices, so RoIAlign's boxes came out [N, 1, 5] ("expected to have rank 2")."""

    class Pick(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):  # [B, 4]
            y = self.lin(x)
            return y[_first((y[:, 0] > 0).long(), 1)].sum(0)  # [4]

    graph = from_torch(Pick(), torch.randn(16, 4))
    assert not any("Sequence" in n.op_type for n in graph.graph.node)
    seq = convert(graph, batch_size=32)
    picked = max(i for i, op in enumerate(seq.op_names) if op == "Gather")  # y[indices]
    assert seq.unknown_ops == {} and seq.config[picked, CONFIG_FIELDS.index("out_rank")] == 2


def test_integer_masks_combine_as_pytorch_does():
    """`a | b`, `a & b`, `a ^ b`, `~a` of uint8 masks (torchvision's samplers), and a bool
    with an int (CPM-Ant's), did not export ("bitwise OR for non-boolean input values"):
    ONNX's bitwise operators, from opset 18."""

    class Masks(torch.nn.Module):
        def forward(self, a, b):  # uint8 [B, 5]
            return ((a | b) ^ (a & b)) + ~a + (a | (b > 2))

    a = torch.tensor([[0, 1, 2, 255, 7]], dtype=torch.uint8)
    b = torch.tensor([[3, 1, 4, 0, 9]], dtype=torch.uint8)
    graph = from_torch(Masks(), (a, b))
    from onnx.reference import ReferenceEvaluator

    run = ReferenceEvaluator(graph).run(None, {"input0": a.numpy(), "input1": b.numpy()})
    np.testing.assert_array_equal(run[0], Masks()(a, b).numpy())
    assert convert(graph, batch_size=3).unknown_ops == {}


def test_a_random_permutation_exports_as_the_order_of_random_draws():
    """`torch.randperm` (the detectors' balanced samplers) had no ONNX form."""

    class Sample(torch.nn.Module):
        def forward(self, x):  # [B, 8]
            return x[:, torch.randperm(8)[:3]].sum()

    seq = convert(from_torch(Sample(), torch.randn(2, 8)), batch_size=4)
    assert {"RandomUniformLike", "TopK"} <= set(seq.op_names) and seq.unknown_ops == {}


class Proposals(torch.nn.Module):
    """A detector's proposal filter: scores kept above a threshold, suppressed, then the top
    of what is left, each from what the one before kept (torchvision's RPN)."""

    def __init__(self):
        super().__init__()
        self.score = torch.nn.Linear(4, 1)
        torch.nn.init.zeros_(self.score.weight)  # every score 0.5 until trained
        torch.nn.init.zeros_(self.score.bias)

    def forward(self, boxes):  # [N, 4] boxes, one image
        import torchvision

        scores = self.score(boxes).squeeze(-1).sigmoid()  # [N]
        keep = torch.where(scores > 0.3)[0]
        boxes, scores = boxes[keep], scores[keep]
        keep = torchvision.ops.nms(boxes, scores, 0.5)
        boxes = boxes[keep]
        return boxes[boxes[:, 0] > boxes[:, 0].mean()].sum()


def test_what_non_maximum_suppression_keeps_is_sized_as_on_the_example():
    """A NonMaxSuppression's count was unknown ("output shape unknown"): `from_torch` records
    the share of its boxes torchvision's `nms` kept on the example, and the selections after
    it take theirs in the order run."""
    pytest.importorskip("torchvision")
    torch.manual_seed(0)
    xy = torch.rand(64, 2) * 100
    boxes = torch.cat([xy, xy + 5 + torch.rand(64, 2) * 30], 1)
    graph = from_torch(Proposals(), boxes)
    kept = json.loads(_meta(graph, SUPPRESSED_KEY))
    assert len(kept) == 1 and 0 < next(iter(kept.values())) < 1
    assert len(json.loads(_meta(graph, SELECTED_KEY))) == 2
    seq = convert(graph, batch_size=64)
    assert seq.unknown_ops == {} and "NonMaxSuppression" in set(seq.op_names)


def test_a_size_drawn_at_random_is_the_one_the_trace_drew():
    """A detector draws its training image size at random (Keypoint R-CNN's min_size): the
    example ran again on other draws, its selections read other sizes than the graph's, and
    none was sized."""

    class Drawn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):  # [B, 8]
            n = int(torch.randint(2, 9, ()).item())  # a size drawn each step
            y = self.lin(x)[:, :n]
            return y[y > 0].sum()

    for seed in range(4):
        torch.manual_seed(seed)
        graph = from_torch(Drawn(), torch.randn(4, 8))
        assert _meta(graph, SELECTED_KEY) is not None, seed
        assert convert(graph, batch_size=4).unknown_ops == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["retinanet_resnet50_fpn", "fasterrcnn_resnet50_fpn"])
def test_torchvisions_detectors_train_at_the_images_given(name):
    """RetinaNet (one stage) and Faster R-CNN (proposals suppressed, RoIs pooled) price their
    training step at the 2 images given, on a GPU; another batch is one line."""
    models = pytest.importorskip("torchvision.models.detection")
    from mdot_jax import TrainingJob, predict

    model = getattr(models, name)(weights=None, weights_backbone=None, min_size=256,
                                  max_size=256)
    targets = [dict(boxes=torch.tensor([[10.0, 20, 100, 120], [50, 60, 200, 220]]),
                    labels=torch.tensor([1, 2])) for _ in range(2)]
    graph = from_torch(model, ([torch.randn(3, 256, 256) for _ in range(2)], targets))
    p = predict(TrainingJob(model=graph, batch_size=2, device="a100-sxm-80gb",
                            precision="amp-bf16"))
    assert p.parameters == sum(q.numel() for q in model.parameters())
    assert 0 < p.iteration_ms < 1000 and not any("unknown to the converter" in w
                                                 for w in p.warnings)
    with pytest.raises(Exception, match="a list of 2 samples"):
        predict(TrainingJob(model=graph, batch_size=4, device="a100-sxm-80gb"))
