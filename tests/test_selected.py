"""Sizes the data decides (`converters.selected`): a boolean mask's selection exports with its
share of the example's elements and grows with the batch as the example's did."""

import json

import onnx
import pytest
from onnx import TensorProto, helper

from converters import CONFIG_FIELDS, ConversionError, convert, from_torch
from converters.sequence import SELECTED_KEY
from mdot_jax import TrainingJob, predict

torch = pytest.importorskip("torch")
F = torch.nn.functional
NUMEL = CONFIG_FIELDS.index("out_numel")


class MaskedLM(torch.nn.Module):  # the loss over the masked tokens alone, as MLM scripts do
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(100, 16), torch.nn.Linear(16, 100)

    def forward(self, ids, labels):
        logits, kept = self.head(self.embed(ids)), labels != -100
        return F.cross_entropy(logits[kept], labels[kept])


class LastEos(torch.nn.Module):  # BART's classification head reads each row's last </s>
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(100, 16), torch.nn.Linear(16, 3)

    def forward(self, ids):
        hidden = self.embed(ids)
        eos = hidden[ids.eq(2), :].view(hidden.size(0), -1, hidden.size(-1))[:, -1, :]
        picked = torch.masked_select(hidden, hidden > 0).sum()  # a mask of another size
        return self.head(eos).sum() + picked * 0


def _numel(seq, op):
    return [int(c[NUMEL]) for n, c in zip(seq.op_names, seq.config) if n == op]


def test_a_masked_loss_selects_the_examples_share_at_every_batch(tmp_path):
    """`logits[labels != -100]` (a masked LM's loss) exported a NonZero no shape sizes: the
    converter refused it ("output shape unknown")."""
    ids = torch.randint(0, 100, (4, 10))
    labels = torch.full_like(ids, -100)
    labels[:, :3] = ids[:, :3]  # 30% of the tokens
    graph = from_torch(MaskedLM(), (ids, labels))
    said = next(p.value for p in graph.metadata_props if p.key == SELECTED_KEY)
    assert json.loads(said) == pytest.approx([0.3, 0.3])
    for batch in (4, 16):
        seq = convert(graph, batch_size=batch)
        kept = round(0.3 * batch * 10)
        assert _numel(seq, "GatherND") == [kept * 100, kept]  # the logits' rows, the labels
    path = tmp_path / "mlm.onnx"
    onnx.save(graph, path)
    said = predict(TrainingJob(model=str(path), batch_size=8, device="h100-sxm")).warnings
    assert "2 selections by a mask (x[mask], torch.nonzero): each the share of its mask the " \
        "example selected (30.0%-30.0%), grown with the batch and the sequence" in said


def test_a_selection_read_back_into_the_batch_keeps_its_shape():
    ids = torch.randint(3, 100, (4, 12))
    ids[:, -1] = 2  # one </s> a row
    graph = from_torch(LastEos(), ids)
    said = json.loads(next(p.value for p in graph.metadata_props
                               if p.key == SELECTED_KEY))
    assert len(said) == 2 and said[0] == pytest.approx(1 / 12)
    seq = convert(graph, batch_size=8)
    assert _numel(seq, "GatherND")[0] == 8 * 16  # a row each: [8, 16] into the head


def test_selections_from_masks_of_one_size_share_their_mean():
    """Which selection a NonZero is cannot always be told (the exporter merges some, writes
    others as masked fills): masks of one size share the mean of their selections, so the
    elements selected add up as the example's did (a mixture's experts: balanced)."""

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, a, b):
            y = self.linear(x)
            return y[a].sum() + y[b].sum() + torch.nonzero(y > 0).sum() * 0

    a = torch.zeros(2, 8, dtype=torch.bool)
    a[:, :2] = True  # a quarter
    graph = from_torch(Two(), (torch.randn(2, 8, 4), a, ~a))  # and three quarters
    said = json.loads(next(p.value for p in graph.metadata_props
                               if p.key == SELECTED_KEY))
    assert said[:2] == [0.5, 0.5] and len(said) == 3  # [2, 8, 4] selected from apart
    assert _numel(convert(graph, batch_size=6), "GatherND")[:2] == [0.5 * 6 * 8 * 4] * 2


def test_a_selection_no_exporter_recorded_says_what_to_do():
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["at"], name="where"),
         helper.make_node("Transpose", ["at"], ["rows"], name="t"),
         helper.make_node("GatherND", ["x", "rows"], ["y"], name="pick")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ConversionError, match=r"node 'where' \(NonZero\).*size the data decides"):
        convert(model, batch_size=2)
    model.metadata_props.add(key=SELECTED_KEY, value="[0.25]")
    assert _numel(convert(model, batch_size=4), "GatherND") == [8]
    for said in ("a quarter", '{"x": 1}', '["a"]'):
        model.metadata_props[-1].value = said
        with pytest.raises(ConversionError, match="is not a list of fractions"):
            convert(model, batch_size=4)


def test_a_selection_from_what_another_selected_is_sized_after_it():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, keep):
            rows = self.linear(x)[keep]  # [kept, 4]
            return rows[rows[:, 0] > rows[:, 1]].sum()  # a mask over the kept rows

    x, keep = torch.randn(2, 8, 4), torch.zeros(2, 8, dtype=torch.bool)
    keep[:, :4] = True
    graph = from_torch(Twice(), (x, keep))
    said = json.loads(next(p.value for p in graph.metadata_props
                               if p.key == SELECTED_KEY))
    assert len(said) == 2 and said[0] == 0.5
    assert len(_numel(convert(graph, batch_size=6), "GatherND")) == 2


def test_a_selection_of_constants_alone_is_folded_and_the_datas_keep_their_shares():
    """D-FINE's denoising groups select from a mask of constants alone (folded away when
    converted) before its loss selects from the data: the export recorded both, the folded
    one could not be matched (nan), and every share after it was read against the wrong
    node ("output shape unknown")."""
    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            groups = torch.nonzero(torch.arange(x.shape[1]) % 3 == 0)  # of sizes alone
            y = self.linear(x)
            return y[y > 0].sum() + groups.sum()

    graph = from_torch(Grouped(), torch.randn(2, 8, 4))
    assert len(json.loads(next(p.value for p in graph.metadata_props
                               if p.key == SELECTED_KEY))) == 2
    assert len(_numel(convert(graph, batch_size=4), "NonZero")) == 1
