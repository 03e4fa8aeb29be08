"""What the exporter cannot trace, exported as the same work (`converters.patches`): each
graph computes what PyTorch does, and every patch is undone after the export."""

import numpy as np
import pytest

from converters import CONFIG_FIELDS, ConversionError, convert, from_torch
from converters.dims import batch_of, converted_batch, scaled
from mdot_jax.serving.model_facts import check_converted

torch = pytest.importorskip("torch")


class Bags(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.bags = torch.nn.EmbeddingBag(50, 8, **kw)

    def forward(self, *args):
        return self.bags(*args)


def _computed(module, inputs):
    from onnx.reference import ReferenceEvaluator

    graph = from_torch(module, inputs)
    feeds = {f"input{i}": x.numpy() for i, x in enumerate(inputs)}
    feeds.update({n: p.detach().numpy() for n, p in module.named_parameters()})
    return graph, ReferenceEvaluator(graph).run(None, feeds)[0]


IDS, OFFSETS = torch.randint(0, 50, (13,)), torch.tensor([0, 3, 3, 7, 12])  # an empty bag


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("inputs,kw", [
    ((torch.randint(0, 50, (4, 6)),), {}),  # bags of one length
    ((IDS, OFFSETS), {}),  # a flat input and where each bag starts
    ((IDS, torch.cat([OFFSETS, torch.tensor([13])])), dict(include_last_offset=True)),
])
def test_an_embedding_bag_exports_as_lookups_reduced_by_bag(mode, inputs, kw):
    """`nn.EmbeddingBag` exported as a Loop that shape inference could not read ("Input 0
    expected to have type but instead is null")."""
    module = Bags(mode=mode, **kw)
    graph, got = _computed(module, inputs)
    np.testing.assert_allclose(got, module(*inputs).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert "Loop" not in {n.op_type for n in graph.graph.node}
    assert torch.nn.functional.embedding_bag.__name__ == "embedding_bag"  # restored


def test_weighted_bags_export():
    module, weights = Bags(mode="sum"), torch.rand(13)
    _, got = _computed(module, (IDS, OFFSETS, weights))
    np.testing.assert_allclose(got, module(IDS, OFFSETS, weights).detach().numpy(), rtol=1e-5,
                               atol=1e-6)  # summed in another order


def test_a_flat_input_keeps_its_length_to_the_batch_at_any_batch():
    """PyTorch's text classification tutorial: every sequence's ids in one flat input, and
    their offsets; the batch is the number of sequences."""
    class Text(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bags, self.fc = torch.nn.EmbeddingBag(1000, 16), torch.nn.Linear(16, 4)

        def forward(self, text, offsets):  # [N], [B] -> [B, 4]
            return self.fc(self.bags(text, offsets))

    graph = from_torch(Text(), (torch.randint(0, 1000, (8 * 40,)), torch.arange(8) * 40))
    dims = [i.type.tensor_type.shape.dim[0].dim_param for i in graph.graph.input[:2]]
    assert dims == ["batch*40", "batch"]
    for batch in (8, 64):
        seq = convert(graph, batch_size=batch)
        assert seq.meta["inputs"] == {"input0": [40 * batch], "input1": [batch]}
        rows = seq.config[seq.op_names.tolist().index("Gather"), CONFIG_FIELDS.index("out_numel")]
        assert rows == 40 * batch * 16  # every id's row looked up
        check_converted(seq, batch)  # the sequence's batch: the bags', not the ids'
    with pytest.raises(ConversionError, match=r"pass --batch-size N \(its dim 0 is 40 times"):
        convert(graph)


def test_weighted_bags_keep_their_ids_and_weights_to_the_batch():
    """Per-sample weights beside the ids: the ids were two inputs of three, so they were the
    batch, and at batch 64 the model was 8 bags of 64 ids in all."""
    class Weighted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bags = torch.nn.EmbeddingBag(1000, 16, mode="sum")

        def forward(self, ids, offsets, weights):  # [N], [B], [N] -> [B, 16]
            return self.bags(ids, offsets, per_sample_weights=weights)

    graph = from_torch(Weighted(), (torch.randint(0, 1000, (320,)), torch.arange(8) * 40,
                                    torch.rand(320)))
    seq = convert(graph, batch_size=64)
    assert seq.meta["inputs"] == {"input0": [2560], "input1": [64], "input2": [2560]}
    assert converted_batch(seq) == 64
    check_converted(seq, 64)


def test_a_graphs_nodes_are_its_batch_and_its_edges_keep_their_rows():
    """A graph network's nodes [N, F] beside its edges [2, E]: the tie went to the smaller dim
    0, so the edges' 2 was the batch and the model failed to convert ("Mismatch between the
    sum of 'split' (2) and the split dimension of the input (64)"). The edges keep their
    count to the nodes."""
    class Gcn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x, edges):  # [N, 16], [2, E] -> [N, 16]
            src, dst = edges
            h = self.lin(x)
            return torch.zeros_like(h).index_add(0, dst, h[src])

    graph = from_torch(Gcn(), (torch.randn(100, 16), torch.randint(0, 100, (2, 400))))
    seq = convert(graph, batch_size=64)
    assert seq.meta["inputs"] == {"input0": [64, 16], "input1": [2, 256]}
    assert converted_batch(seq) == 64
    assert batch_of({"x": [100, 16], "e": [2, 400]}, integer={"e"}) == 100  # before: 2


def test_a_recurrent_layer_given_packed_sequences_exports_padded_and_says_so():
    """NLP tutorials batch sequences of several lengths packed (`pack_padded_sequence`); a
    recurrent layer given them failed to export ("vector::_M_range_check: __n (which is 0)")."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lstm = torch.nn.Embedding(100, 16), torch.nn.LSTM(16, 32)
            self.fc = torch.nn.Linear(32, 2)

        def forward(self, ids, lengths):  # [B, T], [B] -> [B, T, 2]
            x = pack_padded_sequence(self.emb(ids), lengths, batch_first=True,
                                     enforce_sorted=False)
            return self.fc(pad_packed_sequence(self.lstm(x)[0], batch_first=True)[0])

    forward = torch.nn.LSTM.forward
    graph = from_torch(Packed(), (torch.randint(0, 100, (8, 30)), torch.tensor([30] + [9] * 7)))
    assert torch.nn.LSTM.forward is forward  # as it was
    seq = convert(graph, batch_size=32, fuse=True)
    assert seq.meta["packed"] == 1 and seq.meta["inputs"] == {"input0": [32, 30], "input1": [32]}
    c = seq.config[seq.op_names == "LSTM"][0]
    assert [int(c[CONFIG_FIELDS.index(f"in_d{k}")]) for k in (1, 2)] == [30, 32]  # steps, batch
    from mdot_jax import TrainingJob, predict

    p = predict(TrainingJob(model=seq, batch_size=32, device="h100-sxm"))
    assert any("packed sequences (1): priced at every padded step" in w for w in p.warnings)


@pytest.mark.parametrize("api", ["parametrizations", "hook"])
def test_spectral_norm_in_training_exports_its_power_iteration(api):
    """GAN discriminators' spectral norm failed to export in training mode ("Expected node type
    'onnx::Constant' for argument 'rounding_mode'", then `aten::matrix_H`, `aten::vdot`); the
    graph computes what PyTorch's training forward does, from the same vectors."""
    from onnx.reference import ReferenceEvaluator
    from torch.nn.utils import parametrizations, spectral_norm

    wrap = parametrizations.spectral_norm if api == "parametrizations" else spectral_norm
    module, x = wrap(torch.nn.Linear(32, 8)), torch.randn(4, 32)
    normalize, vdot = torch.nn.functional.normalize, torch.vdot
    graph = from_torch(module, x)
    assert torch.nn.functional.normalize is normalize and torch.vdot is vdot
    assert "H" not in vars(torch.Tensor)  # as it was
    names = {i.name for i in graph.graph.input}
    feeds = {n: t.detach().numpy().copy() for n, t in (*module.named_parameters(),
                                                        *module.named_buffers()) if n in names}
    got = ReferenceEvaluator(graph).run(None, {"input0": x.numpy(), **feeds})[0]
    np.testing.assert_allclose(got, module.train()(x).detach().numpy(), atol=1e-5)
    assert convert(graph, batch_size=8).params == 32 * 8 + 8  # its vectors are no parameters


def test_quantization_aware_training_says_to_export_the_float_model():
    class Qat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.fake = torch.nn.Linear(8, 8), torch.ao.quantization.FakeQuantize()

        def forward(self, x):
            return self.lin(self.fake(x))

    with pytest.raises(ConversionError, match="export the float model") as e:
        from_torch(Qat(), torch.randn(2, 8))
    assert "no labels given" not in str(e.value) and "\n" not in str(e.value)


def test_a_graphs_edges_keep_their_count_to_its_nodes_at_any_batch():
    """A graph network given its nodes' features [N, F] and its edges (`edge_index` [2, E]):
    the edges stayed at the example's E whatever --batch-size (the nodes) asked, so a batch of
    twice the nodes was priced with half the messages each."""
    class Gcn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 16)

        def forward(self, x, edges):  # [N, 8], [2, E] -> [N, 16]
            h = self.lin(x)
            return torch.zeros_like(h).index_add(0, edges[1], h[edges[0]])  # the messages

    graph = from_torch(Gcn(), (torch.randn(10, 8), torch.randint(0, 10, (2, 30))))
    dims = [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.graph.input[:2]]
    assert dims == [["batch", ""], ["fixed:2", "batch*3"]]
    for nodes in (10, 64):
        seq = convert(graph, batch_size=nodes)
        assert seq.meta["inputs"] == {"input0": [nodes, 8], "input1": [2, 3 * nodes]}
        gathers = [i for i, op in enumerate(seq.op_names.tolist()) if op == "Gather"]
        rows = seq.config[gathers, CONFIG_FIELDS.index("out_numel")].max()
        assert rows == 3 * nodes * 16  # every edge's message gathered
        check_converted(seq, nodes)
    with pytest.raises(ConversionError, match=r"or --batch-size N for dim 0"):
        convert(graph)
    ids = from_torch(torch.nn.Embedding(10, 4), torch.randint(0, 10, (2, 30)))  # tokens [2, T]
    assert [d.dim_param for d in ids.graph.input[0].type.tensor_type.shape.dim] == ["batch", ""]


@pytest.mark.parametrize("symbol,batch,size", [
    ("batch", 6, 6), ("batch*40", 3, 120), ("batch*0.5", 1, 1), ("batch*1.25", 8, 10),
    ("batch*x", 5, 5), ("batch*inf", 5, 5), ("N", 4, 4), ("fixed:64", 8, 64),
    ("fixed:x", 8, 8)])
def test_an_inputs_dim_0_follows_the_batch_at_its_exported_ratio(symbol, batch, size):
    assert scaled(symbol, batch) == size


def test_an_input_of_positions_keeps_its_rows_at_any_batch():
    """Flux's image and text position ids ([64, 3], [7, 3]) are no batch: exported as one
    they failed at any batch ("shape inference failed: ... Incompatible dimensions")."""
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Linear(3, 8)

        def forward(self, x, ids):  # [B, 64, 8], [64, 3] -> [B, 64, 8]
            return x + self.table(ids)

    graph = from_torch(Positions(), (torch.randn(2, 64, 8), torch.zeros(64, 3)))
    for batch in (None, 2, 16):
        inputs = convert(graph, batch_size=batch, input_shapes=None if batch else
                         {"input0": [4, 64, 8]}).meta["inputs"]
        assert inputs == {"input0": [batch or 4, 64, 8], "input1": [64, 3]}


class Tutorial(torch.nn.Module):
    """PyTorch's language-modelling tutorial: ids [sequence, batch] through nn.Transformer's
    layers at their default, batch_first=False (or batch first, its twin)."""
    def __init__(self, first=False, transposes=False):
        super().__init__()
        self.transposes = transposes  # takes [batch, sequence] and transposes for its layers
        self.emb = torch.nn.Embedding(100, 32)
        self.enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
            32, 4, 64, batch_first=first), 2, enable_nested_tensor=False)
        self.out = torch.nn.Linear(32, 100)

    def forward(self, ids):
        x = self.emb(ids.t() if self.transposes else ids)
        return self.out(self.enc(x))


def test_an_input_a_seq_first_module_reads_takes_its_batch_at_dim_1():
    """The tutorial's [35, 20] ids are 20 sequences of 35 tokens: `--batch-size 64` set the
    sequence to 64 (its dim 0) and kept 20 sequences; its graph takes them batch first."""
    seq_first = convert(from_torch(Tutorial(), torch.randint(0, 100, (35, 20))), batch_size=64)
    twin = convert(from_torch(Tutorial(True), torch.randint(0, 100, (20, 35))), batch_size=64)
    own = convert(from_torch(Tutorial(transposes=True), torch.randint(0, 100, (20, 35))),
                  batch_size=64)  # batch first already
    assert seq_first.meta["inputs"] == twin.meta["inputs"] == own.meta["inputs"] == \
        {"input0": [64, 35]}
    matmuls = [sum(f for t, f in s.flops_by_type().items() if t in ("MatMul", "Gemm"))
               for s in (seq_first, twin)]
    assert matmuls[0] == pytest.approx(matmuls[1], rel=1e-3)
    assert seq_first.params == twin.params


def test_an_lstms_steps_and_state_keep_their_axes_at_any_batch():
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, 2)

        def forward(self, x, h, c):  # [T, B, 8], [2, B, 16] x 2
            return self.lstm(x, (h, c))[0]

    example = (torch.randn(50, 4, 8), torch.zeros(2, 4, 16), torch.zeros(2, 4, 16))
    seq = convert(from_torch(Tagger(), example), batch_size=16)
    assert seq.meta["inputs"] == {"input0": [16, 50, 8], "input1": [16, 2, 16],
                                  "input2": [16, 2, 16]}
    c = seq.config[seq.op_names == "LSTM"]
    col = {n: i for i, n in enumerate(CONFIG_FIELDS)}
    assert [int(c[0, col[f"in_d{k}"]]) for k in (1, 2, 3)] == [50, 16, 8]  # [T, B, I]
    with pytest.raises(ConversionError, match=r"input 'input0' \[4, 4, 8\].*batch_first=False"):
        from_torch(Tagger(), (torch.randn(4, 4, 8), torch.zeros(2, 4, 16),
                              torch.zeros(2, 4, 16)))


def test_an_adaptive_pooling_whose_output_does_not_divide_its_input_exports():
    """GoogLeNet's auxiliary heads (14 x 14 pooled to 4 x 4): the exporter refused them."""
    class Pools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.avg = torch.nn.AdaptiveAvgPool2d((5, None))
            self.max = torch.nn.AdaptiveMaxPool2d(3)

        def forward(self, x):  # [2, 3, 16, 16] -> [2, 8, 14, 14] -> [2, 8, 5, 14] -> [2, 8, 3, 3]
            return self.max(self.avg(self.conv(x)))

    net = Pools()
    seq = convert(from_torch(net, torch.randn(2, 3, 16, 16)), batch_size=2)
    assert seq.op_type_counts() == {"Conv": 1, "Pad": 2, "AveragePool": 1, "MaxPool": 1}
    out = seq.config[-1, CONFIG_FIELDS.index("out_d0"):][:4]
    assert list(out) == list(net(torch.randn(2, 3, 16, 16)).shape)
    assert torch.nn.functional.adaptive_avg_pool2d.__module__ == "torch.nn.functional"


def test_a_one_dimensional_uneven_adaptive_pooling_exports():
    """A 1-D head pooling 38 steps to 5 was refused ("output size that are not factor of input
    size")."""
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.pool = torch.nn.Conv1d(16, 8, 3), torch.nn.AdaptiveMaxPool1d(5)

        def forward(self, x):  # [B, 16, 40] -> [B, 8, 38] -> [B, 8, 5]
            return self.pool(self.conv(x))

    seq = convert(from_torch(Head(), torch.randn(2, 16, 40)), batch_size=4)
    assert seq.op_type_counts() == {"Conv": 1, "Pad": 1, "MaxPool": 1}
    c = seq.config[-1]
    assert [c[CONFIG_FIELDS.index(f"out_d{k}")] for k in (1, 2, 3)] == [4, 8, 5]  # rank 3


def test_a_bilinear_layer_exports_as_a_gemm_and_its_products():
    """`nn.Bilinear` had no ONNX form ("Exporting the operator 'aten::bilinear'")."""
    module, x = torch.nn.Bilinear(16, 12, 8), (torch.randn(3, 5, 16), torch.randn(3, 5, 12))
    graph, got = _computed(module, x)
    np.testing.assert_allclose(got, module(*x).detach().numpy(), atol=1e-5)
    assert convert(graph, batch_size=3).params == 16 * 12 * 8 + 8


@pytest.mark.parametrize("dim", [1, -2, -1])
def test_an_unfold_over_a_dim_counted_from_the_end_exports_its_windows(dim):
    """PatchTST's `unfold(dimension=-2, ...)`: the exporter put the windows' axis in the wrong
    place ([2, 10, 11, 4] for [2, 11, 10, 4]), and shape inference then refused the model."""
    from onnx.reference import ReferenceEvaluator

    class Windows(torch.nn.Module):
        def forward(self, x):  # [B, T, C] -> windows of 4, 2 apart
            return x.unfold(dim, 4, 2)

    x = torch.randn(2, 24, 10)
    got = ReferenceEvaluator(from_torch(Windows(), x)).run(None, {"input0": x.numpy()})[0]
    np.testing.assert_array_equal(got, Windows()(x).numpy())
    assert torch.Tensor.unfold.__name__ == "unfold"  # restored


def test_a_loss_ignoring_an_index_a_size_gives_exports():
    """Hugging Face's question answering ignores `start_logits.size(1)`, which the tracer
    passed on as a value of the batch's shape: "i_(): incompatible function arguments"."""
    from onnx.reference import ReferenceEvaluator

    class Span(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x, start):  # [B, S, 8], [B] -> the loss
            logits = self.head(x).squeeze(-1)
            ignored = logits.size(1)
            return torch.nn.CrossEntropyLoss(ignore_index=ignored)(
                logits, start.clamp(0, ignored))

    module, x, start = Span(), torch.randn(2, 16, 8), torch.tensor([3, 40])  # 40: ignored
    feeds = {"input0": x.numpy(), "input1": start.numpy(),
             **{n: p.detach().numpy() for n, p in module.named_parameters()}}
    got = ReferenceEvaluator(from_torch(module, (x, start))).run(None, feeds)[0]
    np.testing.assert_allclose(got, module(x, start).detach().numpy(), rtol=1e-5)
    assert torch.nn.functional.cross_entropy.__name__ == "cross_entropy"  # restored


def test_an_operator_onnx_has_no_form_of_says_to_leave_it_out():
    """A Student-T likelihood's lgamma (Hugging Face's time-series models), CTC's loss."""
    class Likelihood(torch.nn.Module):
        def forward(self, x):
            return torch.lgamma(x.abs() + 1).sum()

    with pytest.raises(ConversionError, match=r"aten::lgamma.*; ONNX has no form of it: "
                                              r"export a forward without it"):
        from_torch(Likelihood(), torch.randn(2, 4))


def test_an_array_that_is_no_tensor_is_the_exporters_one_line_not_ours():
    with pytest.raises(ConversionError, match="unsupported type: numpy.ndarray"):
        from_torch(torch.nn.Linear(4, 2), (torch.zeros(2, 4), np.zeros(3, np.int64)))


@pytest.mark.parametrize("rank,shape,size", [
    (1, (2, 3, 9), True), (2, (2, 3, 9, 8), True), (2, (2, 3, 8, 8), False),
    (3, (2, 3, 4, 6, 8), False)])
def test_max_unpooling_exports_as_a_scatter(rank, shape, size):
    """SegNet's decoder (`nn.MaxUnpool2d`, given `output_size=x.size()` or not) failed to export
    ("cond must be a bool, but got a Tensor")."""
    from onnx.reference import ReferenceEvaluator

    pool = getattr(torch.nn, f"MaxPool{rank}d")(2, 2, return_indices=True)
    unpool = getattr(torch.nn, f"MaxUnpool{rank}d")(2, 2)

    class Unpool(torch.nn.Module):  # the indices an input: the reference MaxPool's differ
        def forward(self, y, at, x):
            return unpool(y, at, output_size=x.size() if size else None)

    x = torch.randn(*shape)
    y, at = pool(x)
    inputs = (y, at, x)
    graph = from_torch(Unpool(), inputs)
    feeds = {f"input{i}": t.numpy() for i, t in enumerate(inputs)}
    got = ReferenceEvaluator(graph).run(None, feeds)[0]
    np.testing.assert_array_equal(got, Unpool()(*inputs).numpy())

    class SegNet(torch.nn.Module):
        def forward(self, x):
            return unpool(*pool(x), output_size=x.size() if size else None)

    seq = convert(from_torch(SegNet(), x), batch_size=6)
    assert seq.op_type_counts().get("ScatterElements") == 1 and converted_batch(seq) == 6
    assert torch.nn.functional.max_unpool2d.__name__ == "max_unpool2d"  # restored


def test_a_split_at_indices_a_shape_gives_exports_as_slices():
    """transformers' state space and linear attention layers (Mamba's `mamba_scan_forward`)
    split the sequence where the cached tokens begin, `tensor_split(x, [L - cached], dim=2)`:
    the exporter tiled its split sizes from a scalar and shape inference refused the graph
    ("'Repeats' input must be 1D")."""
    from onnx.reference import ReferenceEvaluator

    class Split(torch.nn.Module):
        def forward(self, x):
            head, rest = torch.tensor_split(x, [x.shape[1] - 2], dim=1)  # a function
            a, b, c = x.tensor_split([1, 3], dim=-1)  # a method, from the end, three parts
            half = x.tensor_split(2, dim=2)[0]  # sections: PyTorch's own
            return (head.sum(1) * rest.sum(1)).sum(-1) + (a * c + b).sum((1, 2)) + half.sum((1, 2))

    x = torch.randn(4, 6, 5)
    graph = from_torch(Split(), x)
    got = ReferenceEvaluator(graph).run(None, {"input0": x.numpy()})[0]
    np.testing.assert_allclose(got, Split()(x).numpy(), rtol=1e-4, atol=1e-5)
    y = torch.randn(4, 9, 5)  # another length: the split moves with it
    np.testing.assert_allclose(ReferenceEvaluator(graph).run(None, {"input0": y.numpy()})[0],
                               Split()(y).numpy(), rtol=1e-4, atol=1e-5)
    assert convert(graph, batch_size=8).op_type_counts().get("Slice")
    assert torch.Tensor.tensor_split.__name__ == "tensor_split"  # restored


def test_an_rms_norm_given_its_weights_shape_exports():
    """`F.rms_norm(x, self.weight.shape, self.weight, eps)` (transformers' Ergo) failed to
    export ("ONNX symbolic expected a constant value of the 'normalized_shape' argument")."""

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

        def forward(self, x):
            return torch.nn.functional.rms_norm(x, self.weight.shape, self.weight, 1e-6)

    x, norm = torch.randn(2, 4, 8), Norm()
    graph, got = _computed(norm, (x,))
    np.testing.assert_allclose(got, norm(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert convert(graph, batch_size=8).op_type_counts().get("ReduceMean") == 1
    assert torch.nn.functional.rms_norm.__name__ == "rms_norm"  # restored


def test_a_scalar_set_through_a_mask_of_leading_dims_exports():
    """`x[mask] = 0` with a mask over x's leading dims ([B, T] of [B, T, D]: padding zeroed)
    exported as a Where broadcasting the mask against the wrong dims: "Incompatible
    dimensions"."""
    from onnx.reference import ReferenceEvaluator

    class Zeroed(torch.nn.Module):
        def forward(self, x, pad):
            y = x * 2
            y[pad] = 0.0  # a scalar: filled in
            y[pad.unsqueeze(-1).expand_as(y)] = torch.tensor(-1.0)  # a mask of every dim
            return y

    x, pad, setitem = torch.randn(4, 10, 16), torch.rand(4, 10) < 0.3, torch.Tensor.__setitem__
    graph = from_torch(Zeroed(), (x, pad))
    got = ReferenceEvaluator(graph).run(None, {"input0": x.numpy(), "input1": pad.numpy()})[0]
    np.testing.assert_array_equal(got, Zeroed()(x, pad).numpy())
    assert convert(graph, batch_size=8).op_type_counts().get("Where") == 2
    assert torch.Tensor.__setitem__ is setitem  # restored


def test_a_row_set_through_a_mask_of_leading_dims_exports_on_the_meta_device():
    """T5Gemma 2's embedding sets its end-of-image row where the tokens are that token
    (`embeds[ids == eoi] = row`): a selection whose size the data decides, which a model on
    the meta device cannot record ("output shape unknown"); a Where sets the same rows."""
    from onnx.reference import ReferenceEvaluator

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table, self.row = torch.nn.Embedding(10, 4), torch.nn.Parameter(torch.ones(4))

        def forward(self, ids):
            x = self.table(ids)
            x[ids == 3] = self.row
            return x

    ids, model = torch.tensor([[1, 3, 3, 0], [3, 2, 5, 3]]), Embed()
    graph = from_torch(model, (ids,), input_names=["ids"])
    got = ReferenceEvaluator(graph).run(None, {"ids": ids.numpy(), **{
        n: p.detach().numpy() for n, p in model.named_parameters()}})[0]
    np.testing.assert_array_equal(got, model(ids).detach().numpy())
    with torch.device("meta"):
        meta = Embed()
    seq = convert(from_torch(meta, (ids,), input_names=["ids"]), batch_size=4)
    assert "NonZero" not in seq.op_type_counts() and seq.params == 44


def test_one_hot_without_a_class_count_exports_the_examples():
    """`F.one_hot(labels)` (no `num_classes`) failed to convert: "'depth' must be
    non-negative"."""
    from onnx.reference import ReferenceEvaluator

    class Soft(torch.nn.Module):
        def forward(self, logits, labels):
            return -(torch.nn.functional.one_hot(labels) * logits.log_softmax(-1)).sum()

    logits, labels = torch.randn(4, 5), torch.tensor([0, 4, 2, 1])
    graph = from_torch(Soft(), (logits, labels))
    got = ReferenceEvaluator(graph).run(None, {"input0": logits.numpy(),
                                               "input1": labels.numpy()})[0]
    np.testing.assert_allclose(got, Soft()(logits, labels).numpy(), rtol=1e-5)
    assert convert(graph, batch_size=16).op_type_counts().get("OneHot") == 1
    assert torch.nn.functional.one_hot.__name__ != "counted"  # restored


def test_an_assignment_to_an_empty_run_of_slices_sets_nothing_and_exports():
    """RT-DETR's denoising groups each hide the others (`mask[a:b, :a] = -inf`): the first
    group's run is empty, a zero-size Slice that failed the export ("shape_has_zero")."""
    from onnx.reference import ReferenceEvaluator

    class Groups(torch.nn.Module):
        def forward(self, x):  # x [B, 6, 6]
            mask = torch.zeros(6, 6)
            for a in range(0, 6, 2):
                mask[a:a + 2, :a] = -torch.inf
                mask[a:a + 2, a + 2:6] = -torch.inf
            return (x + mask).softmax(-1)

    x, setitem = torch.randn(2, 6, 6), torch.Tensor.__setitem__
    graph = from_torch(Groups(), (x,))
    got = ReferenceEvaluator(graph).run(None, {"input0": x.numpy()})[0]
    np.testing.assert_allclose(got, Groups()(x).numpy(), rtol=1e-6)
    assert torch.Tensor.__setitem__ is setitem  # restored
