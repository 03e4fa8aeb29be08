"""ONNX -> OperatorSequence: dropping shape work, aliases, unknown ops, concrete dims, npz."""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_builders import conv_bn_relu, model, value

from converters import VOCAB, ConversionError, OperatorSequence, convert, load_model
from converters.errors import PastPositions
from converters.vocab import UNK_ID


def reshape_through_shape_arithmetic():
    """x[N,4,6] -> Shape -> Gather(0) -> Unsqueeze -> Concat(-1) -> Reshape -> Identity -> Relu."""
    I64 = TensorProto.INT64
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Constant", [], ["zero"], name="c0",
                         value=helper.make_tensor("z", I64, [], [0])),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather"),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
        helper.make_node("Identity", ["r"], ["r2"], name="alias"),
        helper.make_node("Relu", ["r2"], ["y"], name="relu"),
        helper.make_node("Mul", ["y", "y"], ["z"], name="square"),
    ]
    inits = [helper.make_tensor("axes", I64, [1], [0]),
             helper.make_tensor("minus1", I64, [1], [-1])]
    return model(nodes, [value("x", ["N", 4, 6])], [value("z", None)], inits)


def test_shape_arithmetic_and_identity_are_dropped_and_rewired():
    seq = convert(reshape_through_shape_arithmetic(), batch_size=3)
    assert [VOCAB[i] for i in seq.op_type] == ["Reshape", "Relu", "Mul"]
    assert seq.node_names.tolist() == ["reshape", "relu", "square"]
    assert seq.meta["dropped_nodes"] == 5  # Shape, Constant, Gather, Unsqueeze, Concat
    assert seq.edges.tolist() == [[0, 1], [1, 2]]  # Identity rewired, Mul(y, y) one edge
    assert seq.load[2, 0] == 3 * 24  # data propagation resolved Reshape -> [3, 24]


def test_shape_folding_leaves_large_constant_tensors_as_operators():
    """Shape(x) -> ConstantOfShape -> Add(x, .): folded while small, an operator once the
    tensor is large (convit's batch-sized position tensors passed protobuf's 2 GB)."""
    from onnx import shape_inference

    from converters.loader import FOLD_MAX_ELEMENTS, _fold_shape_computations

    def folded(rows):
        nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                 helper.make_node("ConstantOfShape", ["s"], ["ones"], name="ones",
                                  value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
                 helper.make_node("Add", ["x", "ones"], ["y"], name="add")]
        m = shape_inference.infer_shapes(model(nodes, [value("x", [rows, 1024])],
                                               [value("y", None)]))
        _fold_shape_computations(m)
        return m

    small = folded(4)
    assert [n.op_type for n in small.graph.node] == ["Add"]
    large = folded(2 * FOLD_MAX_ELEMENTS // 1024)
    assert [n.op_type for n in large.graph.node] == ["ConstantOfShape", "Add"]
    assert all(np.prod(i.dims) <= 2 for i in large.graph.initializer)  # only the shape


def test_the_same_arithmetic_in_every_layer_folds_into_one_constant():
    """Each of three layers makes the same index tensor from the shapes (DeepSeek-V3's 61
    layers made 122 of 4 MB: 0.5 GB of initializers, 2.9 GB of host memory): folded once, every
    layer reads the one copy."""
    from onnx import shape_inference

    from converters.loader import _fold_shape_computations

    I64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape")]
    for k in range(3):
        nodes += [helper.make_node("ConstantOfShape", ["s"], [f"i{k}"], name=f"index{k}",
                                   value=helper.make_tensor("v", I64, [1], [1])),
                  helper.make_node("Add", [f"i{k}", "step"], [f"j{k}"], name=f"next{k}"),
                  helper.make_node("GatherElements", ["x", f"j{k}"], [f"y{k}"], name=f"g{k}")]
    nodes.append(helper.make_node("Sum", ["y0", "y1", "y2"], ["y"], name="sum"))
    m = shape_inference.infer_shapes(model(nodes, [value("x", [4, 64])], [value("y", None)],
                                           [helper.make_tensor("step", I64, [], [1])]))
    _fold_shape_computations(m)
    assert [n.op_type for n in m.graph.node] == ["GatherElements"] * 3 + ["Sum"]
    indices = {n.input[1] for n in m.graph.node[:3]}
    assert len(indices) == 1
    assert [i.name for i in m.graph.initializer if i.name.startswith("j")] == list(indices)


def test_one_export_serves_every_batch_size():
    flops = [convert(conv_bn_relu(), batch_size=b).flops for b in (1, 2, 8)]
    assert flops[1] == 2 * flops[0] and flops[2] == 8 * flops[0]
    seq = convert(conv_bn_relu(), input_shapes={"x": [4, 3, 16, 16]})
    assert seq.meta["inputs"] == {"x": [4, 3, 16, 16]}
    assert convert(conv_bn_relu(), batch_size=1, image_size=16).flops == flops[2] / 2


def test_a_sequence_length_baked_into_the_graph_is_named():
    """torch.onnx.export fixes every dim it is not told is dynamic; a constant the length
    fixed (a position table) then refuses another length: the error names dim and flag."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Add", ["e", "positions"], ["y"], name="add_positions")]
    positions = helper.make_tensor("positions", TensorProto.FLOAT, [1, 8, 4], [0.5] * 32)
    m = model(nodes, [value("ids", [2, 8], TensorProto.INT64), value("table", [10, 4])],
              [value("y", None)], [positions])
    m.metadata_props.add(key="mdot.data_inputs", value="ids")
    assert convert(m, batch_size=4).meta["inputs"] == {"ids": [4, 8]}  # the batch broadcasts
    with pytest.raises(ConversionError, match=r"exported at \(input 'ids' dim 1 = 8\); "
                       r"predict at --seq-len 8, or export again with that dim dynamic"):
        convert(m, batch_size=4, seq_len=16)


def test_unknown_op_is_kept_as_unk_and_counted():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"),
             helper.make_node("Det", ["a"], ["b"], name="det"),
             helper.make_node("Relu", ["b"], ["y"], name="r2")]
    seq = convert(model(nodes, [value("x", [3, 3])], [value("y", None)]))
    assert seq.num_ops == 3 and seq.op_type[1] == UNK_ID
    assert seq.unknown_ops == {"Det": 1}
    assert seq.op_type_counts() == {"Relu": 2, "Det": 1}
    assert seq.op_names.tolist() == ["Relu", "<unk>", "Relu"]
    newer = dataclasses.replace(seq, op_type=seq.op_type + 10_000)  # ids of a newer vocabulary
    assert set(newer.op_names) == {"<unk>"}


def test_initializers_become_shaped_params_without_values():
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 32], np.ones(64 * 32).tolist())
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
              [value("x", ["B", 64])], [value("y", None)], [w])
    loaded = load_model(m, batch_size=5)
    assert [i.name for i in loaded.graph.initializer] == []
    assert {i.name for i in loaded.graph.input} == {"x", "w"}
    seq = convert(m, batch_size=5)
    assert seq.params == 64 * 32 and seq.flops == 2 * 5 * 64 * 32
    assert seq.meta["inputs"] == {"x": [5, 64]}


def test_npz_round_trip(tmp_path):
    seq = convert(reshape_through_shape_arithmetic(), batch_size=2, name="toy")
    seq.save(tmp_path / "toy.npz")
    back = OperatorSequence.load_npz(tmp_path / "toy.npz")
    assert back.name == "toy" and back.meta == seq.meta
    for f in ("op_type", "config", "load", "edges", "node_names"):
        np.testing.assert_array_equal(getattr(back, f), getattr(seq, f))
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(ConversionError, match="bad.npz"):
        OperatorSequence.load_npz(tmp_path / "bad.npz")
    # arrays that are not the ones it writes: named, where they raised from deep in pricing
    arrays = dict(np.load(tmp_path / "toy.npz"))
    n = len(seq.op_type)
    for key, bad, needle in (
            ("config", arrays["config"][:-1], rf"config float32\[{n - 1}, 33\]: expected \[{n},"),
            ("load", np.where(arrays["load"] > 0, np.nan, arrays["load"]), "load .*finite"),
            ("node_names", arrays["node_names"][None], rf"node_names <U\d+\[1, {n}\]"),
            ("edges", arrays["edges"][:, ::-1], r"edges int\d+\[\d+, 2\]: expected \[E, 2\]"),
            ("op_type", arrays["op_type"].astype(np.float32), "op_type float32"),
            ("meta_json", np.asarray("[]"), "its metadata is a list, not an object"),
            ("meta_json", np.asarray(str(arrays["meta_json"]).replace(
                '"unknown_ops": {}', '"unknown_ops": null')),
             "its metadata's unknown_ops is null: expected an object")):
        np.savez(tmp_path / "tampered.npz", **dict(arrays, **{key: bad}))
        with pytest.raises(ConversionError, match=f"tampered.npz: not a readable operator "
                                                  f"sequence \\({needle}"):
            OperatorSequence.load_npz(tmp_path / "tampered.npz")


def test_positional_encodings_have_sequence_shape():
    seq = convert(conv_bn_relu(), batch_size=1)
    assert seq.positional_encoding("laplacian", 4).shape == (3, 4)
    assert seq.positional_encoding("random_walk", 5).shape == (3, 5)
    assert [d.tolist() for d in seq.depths()] == [[0, 1, 2], [2, 1, 0]]
    with pytest.raises(ValueError, match="unknown positional encoding"):
        seq.positional_encoding("nope", 2)


def _gpt2(positions=64):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from converters import from_torch

    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500,
                                  n_positions=positions)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
    return from_torch(model, torch.zeros(1, 16, dtype=torch.long))


def test_a_sequence_longer_than_the_models_positions_is_refused():
    convert(_gpt2(positions=64), batch_size=2, seq_len=64)
    with pytest.raises(ConversionError, match=r"reads row 127 of 'transformer\.wpe\.weight', "
                                              r"which has 64 .* longer than the 64 positions"):
        convert(_gpt2(positions=64), batch_size=2, seq_len=128)


def test_positions_computed_from_a_files_input_past_its_table_are_refused():
    """RoBERTa's positions are a running sum of its input's padding mask from row 2 on: an
    ONNX file of it at 600 tokens was priced (PyTorch's index error when run). The rows read
    are bounded through the mask's truths, its running sum and the shift."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from converters import from_torch

    cfg = transformers.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=34)  # 32 positions, from row 2
    with torch.device("meta"):
        model = transformers.RobertaForMaskedLM(cfg)
    graph = from_torch(model, torch.zeros(1, 16, dtype=torch.long))
    convert(graph, batch_size=2, seq_len=32)
    with pytest.raises(PastPositions, match=r"reads row 34 of "
                       r"'roberta\.embeddings\.position_embeddings\.weight', which has 34") as e:
        convert(graph, batch_size=2, seq_len=33)
    assert (e.value.rows, e.value.top) == (34, 34)


def test_position_ids_held_as_a_constant_are_said_to_run_out_not_the_exported_size(tmp_path):
    """BERT slices its buffer of max_position_embeddings ids to the input's length: past it the
    slice stops and the shapes disagree, which was said as a shape "depends on the size it was
    exported at (input dim 1 = 16); predict at --seq-len 16"."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from converters import from_torch
    from mdot_jax import RequestError, TrainingJob, predict

    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.BertForMaskedLM(cfg)
    onnx_path = tmp_path / "bert.onnx"
    onnx.save(from_torch(model, torch.zeros(1, 16, dtype=torch.long)), onnx_path)
    convert(str(onnx_path), batch_size=2, seq_len=64)
    with pytest.raises(PastPositions, match=r"slices the 64 position ids the model holds"):
        convert(str(onnx_path), batch_size=2, seq_len=65)
    with pytest.raises(RequestError, match=r"^seq_len 200: past the 64 positions model 'bert' "):
        predict(TrainingJob(model=str(onnx_path), batch_size=2, seq_len=200, device="l4"))


def test_index_bounds_follow_truths_sums_and_selections():
    """Intervals through the ops positions are computed with; None where an input decides.
    A running sum counts at most a data input's positions (a padded tiny Longformer was
    refused at 64 tokens: its mask's sum bounded by the 512 its window pads to)."""
    from converters.checks import _index_bounds
    from converters.tensors import _tensor

    c = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(  # noqa: E731
        name, TensorProto.INT64, [len(v)], v))
    nodes = [c("k", [1]), c("ax", [1]), c("lo", [3]), c("ten", [10]),
             helper.make_node("Equal", ["ids", "k"], ["eq"]),
             helper.make_node("Not", ["eq"], ["mask"]),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["m", "ax"], ["run"]),
             helper.make_node("Mul", ["run", "m"], ["kept"]),
             helper.make_node("Sub", ["kept", "k"], ["less"]),
             helper.make_node("Where", ["eq", "lo", "less"], ["picked"]),
             helper.make_node("Range", ["lo", "ten", "k"], ["r"]),
             helper.make_node("Concat", ["r", "ten"], ["both"], axis=0),
             helper.make_node("Add", ["ids", "k"], ["free"]),
             c("pads", [0, 0, 0, 14]), helper.make_node("Pad", ["ids", "pads", "k"], ["padded"]),
             helper.make_node("Equal", ["padded", "k"], ["pad"]),
             helper.make_node("CumSum", ["pad", "ax"], ["counted"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "ids", TensorProto.INT64, [2, 50])], [])
    shapes = {"m": _tensor((2, 50), TensorProto.INT64), "ids": _tensor((2, 50), TensorProto.INT64),
              "pad": _tensor((2, 64), TensorProto.INT64)}
    bounds = _index_bounds(graph, shapes, set())
    assert bounds("m") == (0, 1) and bounds("run") == (0, 50) and bounds("kept") == (0, 50)
    assert bounds("less") == (-1, 49) and bounds("picked") == (-1, 49)
    assert bounds("r") == (3, 9) and bounds("both") == (3, 10)
    assert bounds("free") is None and bounds("ids") is None
    assert bounds("counted") == (0, 50)  # padded to 64 (Longformer's window): no pad counted


def test_positions_too_many_to_fold_are_still_refused(monkeypatch):
    """Past `FOLD_MAX_ELEMENTS` (2M tokens) the positions' Range stays in the graph: its
    bounds still say the rows read (a 1,024-position GPT-2 was priced at 2M tokens)."""
    import converters.loader

    monkeypatch.setattr(converters.loader, "FOLD_MAX_ELEMENTS", 100)
    convert(_gpt2(positions=64), batch_size=2, seq_len=64)
    with pytest.raises(ConversionError, match=r"reads row 127 of 'transformer\.wpe\.weight'"):
        convert(_gpt2(positions=64), batch_size=2, seq_len=128)


def test_an_input_longer_than_the_conversion_holds_is_refused_naming_it(monkeypatch):
    """A file's own dim (2**40 tokens) ran shape inference out of memory (killed, no word)."""
    import converters.dims

    monkeypatch.setattr(converters.dims, "MAX_LENGTH", 100)
    with pytest.raises(ConversionError, match=r"input 'input0' dim 1 is 128: at most 100 "
                                              r"\(the conversion holds each position\)"):
        convert(_gpt2(positions=256), batch_size=2, seq_len=128)
    convert(_gpt2(positions=256), batch_size=200, seq_len=16)  # the batch is not a position
    monkeypatch.setattr(converters.dims, "MAX_BATCH_TOKENS", 3000)  # but its tokens are held
    with pytest.raises(ConversionError, match=r"input 'input0' shape \[200, 16\]: 3,200 tokens "
                                              r"a micro-batch, more than 3,000"):
        convert(_gpt2(positions=256), batch_size=200, seq_len=16)


def test_folding_a_long_sequences_shapes_never_builds_its_masks(monkeypatch):
    """At 4,096 tokens a causal mask has 16.8M elements: folding evaluated it on the host
    (GPT-2 125M at 32,768 tokens needed 8.6 GB) only to leave it in the graph."""
    import onnx.reference

    from converters.loader import FOLD_MAX_ELEMENTS

    largest = []
    real = onnx.reference.ReferenceEvaluator

    class Recording(real):
        def run(self, *args, **kwargs):
            out = super().run(*args, **kwargs)
            largest.append(max((np.size(v) for v in out), default=0))
            return out

    monkeypatch.setattr(onnx.reference, "ReferenceEvaluator", Recording)
    seq = convert(_gpt2(positions=4096), batch_size=1, seq_len=4096, fuse=True)
    assert largest and max(largest) <= FOLD_MAX_ELEMENTS
    assert seq.meta["inputs"]["input0"] == [1, 4096]


def test_control_flow_says_what_to_do():
    def info(name, elem, shape=None):
        return helper.make_value_info(name, helper.make_tensor_type_proto(elem, shape))

    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Add", ["x_in", "x_in"], ["x_out"])], "body",
        [info("i", TensorProto.INT64, []), info("c_in", TensorProto.BOOL, []),
         info("x_in", TensorProto.FLOAT)],
        [info("c_out", TensorProto.BOOL, []), info("x_out", TensorProto.FLOAT)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c", "x"], ["y"], body=body),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [info("x", TensorProto.FLOAT, ["N", 8]), info("n", TensorProto.INT64, []),
         info("c", TensorProto.BOOL, [])], [info("z", TensorProto.FLOAT)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ConversionError, match=r"\(Loop\): output shape unknown: control flow"):
        convert(model, batch_size=2)


@pytest.mark.parametrize("size,kept", [(1, [4, 8]), (3, [4, 3, 8])])
def test_a_branch_the_shapes_decide_is_the_branch_taken(size, kept):
    """The exporter's `squeeze(dim)` of a dim whose size it could not tell (Zamba's Mamba): an
    If on the dim's size, which shape inference cannot see past ("cannot compute its cost from
    input shapes [None, ...]"). At concrete shapes the condition folds, and the branch it takes
    is the graph."""
    I64, F = TensorProto.INT64, TensorProto.FLOAT

    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [helper.make_value_info(out, helper
                                                  .make_tensor_type_proto(F, None))])

    squeeze = branch("then", [helper.make_node("Squeeze", ["x", "axes"], ["sq"])], "sq")
    same = branch("else", [helper.make_node("Identity", ["x"], ["x2"])], "x2")
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "one"], ["d"], name="dim"),
             helper.make_node("Equal", ["d", "one"], ["c"], name="is_one"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=squeeze,
                              else_branch=same),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    inits = [helper.make_tensor("one", I64, [], [1]), helper.make_tensor("axes", I64, [1], [1])]
    seq = convert(model(nodes, [value("x", ["N", size, 8])], [value("z", None)], inits),
                  batch_size=4)
    assert "If" not in seq.op_type_counts()
    relu = seq.node_names.tolist().index("relu")
    assert seq.load[relu, 0] == np.prod(kept)


def test_graph_totals_are_read_by_name():
    from converters import LOAD_FIELDS

    seq = convert(conv_bn_relu(training=True), batch_size=2)
    for i, name in enumerate(LOAD_FIELDS):
        assert seq.total(name) == float(seq.load[:, i].astype(np.float64).sum())
    assert seq.total("bytes") == seq.total("bytes_read") + seq.total("bytes_written") > 0
    assert seq.flops == seq.total("fwd_flops") > 0
    with pytest.raises(KeyError):
        seq.total("flops")  # no such column: never a silent zero


def test_what_is_kept_of_a_sequence_is_kept_while_its_objects_are_the_same():
    from converters.kept import Kept

    kept, calls = Kept(size=2), []
    a = np.arange(3)

    def compute():
        calls.append(1)
        return len(calls)
    assert kept.get(("f", a), compute) == 1 and kept.get(("f", a), compute) == 1  # kept
    assert kept.get(("f", a.copy()), compute) == 2  # equal values, another array: computed
    kept.get(("g", a), compute)  # a third key: the oldest goes
    assert kept.get(("f", a), compute) == 4

    from concurrent.futures import ThreadPoolExecutor  # a service's threads: nothing raises
    arrays = [np.arange(i) for i in range(50)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda x: kept.get(("n", x), lambda: len(x)), arrays * 20))
    assert got == [len(x) for x in arrays] * 20


def test_a_sequences_neighbours_and_blocks_are_shared_by_a_copy_of_its_edges_only():
    from converters.attention import attention_blocks

    seq = convert(conv_bn_relu(training=True), batch_size=2)
    shard = dataclasses.replace(seq, config=seq.config * 2)  # another config, the same edges
    assert seq.neighbours() is shard.neighbours()
    other = dataclasses.replace(seq, edges=seq.edges.copy())
    assert other.neighbours() is not seq.neighbours() and other.neighbours() == seq.neighbours()
    blocks = attention_blocks(seq)
    blocks.append("changed by a caller")
    assert "changed by a caller" not in attention_blocks(seq)  # each caller its own list


def test_a_scope_in_a_sequential_or_a_dict_is_named_as_torchscript_names_it():
    """The TorchScript exporter names a module by its attribute and the indices after it:
    a Sequential's child `blocks.0` (not `0`: a stack's layers are read from `blocks.0`), one
    nested in it `seq.1.0`, a ModuleDict's `a`; these are the names it wrote for these paths
    (torch 2.14, `from_torch`)."""
    from converters.scopes import scoped_names

    # the module paths dynamo records (a ModuleList or ModuleDict is never called: no scope)
    paths = {("blocks", "blocks.0", "blocks.0.fc"): "/blocks/blocks.0/fc/Gemm",
             ("blocks", "blocks.0", "blocks.0.seq", "blocks.0.seq.1", "blocks.0.seq.1.0"):
             "/blocks/blocks.0/seq/seq.1/seq.1.0/Gemm",
             ("layers.0", "layers.0.seq", "layers.0.seq.0"): "/layers.0/seq/seq.0/Gemm",
             ("d.a",): "/a/Gemm"}
    nodes = []
    for i, scopes in enumerate(paths):
        n = helper.make_node("Gemm", ["x", "w"], [f"y{i}"], name=f"node_linear_{i}")
        n.metadata_props.add(key="pkg.torch.onnx.name_scopes",
                             value=repr(["", *scopes, "linear"]))
        nodes.append(n)
    assert list(scoped_names(nodes).values()) == list(paths.values())


def test_a_dynamo_exports_nodes_are_named_by_their_module_scopes():
    """torch.onnx.export (dynamo) names nodes by its counters and keeps each one's module path
    in its metadata: the sequence names them as the TorchScript exporter does (path, type,
    numbered within the path), so that a stack's layers read alike; other names are kept."""
    from mdot_jax.serving.prediction import by_layer

    def scoped(node, *paths):
        node.metadata_props.add(key="pkg.torch.onnx.name_scopes",
                                value=repr(["", *paths, "traced_call"]))
        return node

    nodes, x = [], "x"
    for layer in range(2):
        at = f"model.layers.{layer}"
        nodes += [scoped(helper.make_node("MatMul", [x, "w"], [f"up{layer}"],
                                          name=f"node_matmul_{2 * layer}"), "model", at,
                         f"{at}.mlp"),
                  scoped(helper.make_node("MatMul", [f"up{layer}", "w"], [f"down{layer}"],
                                          name=f"node_matmul_{2 * layer + 1}"), "model", at,
                         f"{at}.mlp"),
                  scoped(helper.make_node("Add", [x, f"down{layer}"], [f"h{layer}"],
                                          name=f"node_add_{layer}"), "model", at)]
        x = f"h{layer}"
    nodes += [scoped(helper.make_node("Relu", [x], ["r"], name="node_relu"), "lm_head"),
              helper.make_node("Neg", ["r"], ["n"], name="node_neg"),  # no metadata
              helper.make_node("Abs", ["n"], ["a"], name="/head/Abs"),  # a path already
              helper.make_node("Sigmoid", ["a"], ["y"], name="node_sigmoid")]
    nodes[-1].metadata_props.add(key="pkg.torch.onnx.name_scopes", value="not a list")
    m = model(nodes, [value("x", ["N", 8]), value("w", [8, 8])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    names = list(convert(m, batch_size=2).node_names)
    assert names == ["/model/layers.0/mlp/MatMul", "/model/layers.0/mlp/MatMul_1",
                     "/model/layers.0/Add", "/model/layers.1/mlp/MatMul",
                     "/model/layers.1/mlp/MatMul_1", "/model/layers.1/Add", "/lm_head/Relu",
                     "node_neg", "/head/Abs", "node_sigmoid"]
    stacked = by_layer([dict(type="MatMul", name=n, ms=1.0) for n in names[:2] + names[3:5]])
    assert [(g["name"], g["count"]) for g in stacked] == [("/model/layers.*/mlp/MatMul", 2),
                                                          ("/model/layers.*/mlp/MatMul_1", 2)]


def test_a_branch_reading_a_folded_size_reads_it_where_folding_kept_it():
    """Folding keeps one copy of a value computed twice (each layer's same shape arithmetic)
    and renamed the graph's readers of the other, but not a branch's (RT-DETR's): shape
    inference then failed inside the If ("expected to have type but instead is null")."""
    I64, F = TensorProto.INT64, TensorProto.FLOAT

    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [helper.make_value_info(out, helper
                                                  .make_tensor_type_proto(F, None))])

    tiled = branch("then", [helper.make_node("Unsqueeze", ["d2", "axes"], ["r"]),
                            helper.make_node("Concat", ["ones", "r", "ones"], ["reps"], axis=0),
                            helper.make_node("Tile", ["x", "reps"], ["xs"])], "xs")
    same = branch("else", [helper.make_node("Identity", ["x"], ["x2"])], "x2")
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "one"], ["d"], name="dim"),
             helper.make_node("Gather", ["s", "one"], ["d2"], name="dim_again"),
             helper.make_node("Greater", ["d", "one"], ["c"], name="wide"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=tiled,
                              else_branch=same),  # shapes the branches differ on: unknown
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    inits = [helper.make_tensor("one", I64, [], [1]), helper.make_tensor("ones", I64, [1], [1]),
             helper.make_tensor("axes", I64, [1], [0])]
    seq = convert(model(nodes, [value("x", ["N", 3, 8])], [value("z", None)], inits),
                  batch_size=4)
    relu = seq.node_names.tolist().index("relu")
    assert "If" not in seq.op_type_counts() and seq.load[relu, 0] == 4 * 9 * 8
