"""`converters.repeat`: layer 1 of a two-layer graph copied until the stack is full."""

import pytest
from onnx import TensorProto, helper

from converters import ConversionError
from converters.repeat import repeat_layer


def _graph(layer1_reads: str):
    """x -> layers.0 (Mul w0) -> layers.1 (Mul w1, reading `layer1_reads`) -> Relu -> y."""
    t = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    nodes = [helper.make_node("Mul", ["x", "m.layers.0.w"], ["/m/layers.0/Mul_output_0"],
                              name="/m/layers.0/Mul"),
             helper.make_node("Mul", [layer1_reads, "m.layers.1.w"], ["/m/layers.1/Mul_output_0"],
                              name="/m/layers.1/Mul"),
             helper.make_node("Relu", ["/m/layers.1/Mul_output_0"], ["y"], name="/m/Relu")]
    g = helper.make_graph(nodes, "g", [t("x"), t("m.layers.0.w"), t("m.layers.1.w")], [t("y")])
    return helper.make_model(g)


def test_each_copy_reads_its_own_weights_and_the_layer_before_it():
    model = _graph("/m/layers.0/Mul_output_0")
    repeat_layer(model, "m.layers", 4)
    got = [(n.name, list(n.input), list(n.output)) for n in model.graph.node]
    assert got == [
        ("/m/layers.0/Mul", ["x", "m.layers.0.w"], ["/m/layers.0/Mul_output_0"]),
        ("/m/layers.1/Mul", ["/m/layers.0/Mul_output_0", "m.layers.1.w"],
         ["/m/layers.1/Mul_output_0"]),
        ("/m/layers.2/Mul", ["/m/layers.1/Mul_output_0", "m.layers.2.w"],
         ["/m/layers.2/Mul_output_0"]),
        ("/m/layers.3/Mul", ["/m/layers.2/Mul_output_0", "m.layers.3.w"],
         ["/m/layers.3/Mul_output_0"]),
        ("/m/Relu", ["/m/layers.3/Mul_output_0"], ["y"])]
    assert [i.name for i in model.graph.input] == ["x", "m.layers.0.w", "m.layers.1.w",
                                                   "m.layers.2.w", "m.layers.3.w"]


def test_a_layer_not_reading_its_predecessor_cannot_be_repeated():
    with pytest.raises(ConversionError, match="m.layers: layer 1 hands on"):
        repeat_layer(_graph("x"), "m.layers", 4)


def test_the_stack_is_the_list_of_the_configs_layers_not_a_longer_one():
    """A mixture of experts holds a list of experts per layer, longer than the stack."""
    torch = pytest.importorskip("torch")
    from converters.repeat import layer_stack, template

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(8))

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(Layer() for _ in range(3))
    name, layers = layer_stack(model, 3)
    assert name == "layers" and template(layers, None) == (1, 1)
    assert layer_stack(model, 2) is None  # two layers: nothing to repeat
    layers[2].experts.append(torch.nn.Linear(4, 4))
    assert template(layers, None) is None


def test_a_pattern_of_two_kinds_is_copied_in_turn():
    """layers.0, .2 multiply, layers.1, .3 add: traced to layer 3, layers 2 and 3 copied in
    turn, each copy reading the copy before it and its own weights."""
    t = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    out = lambda k: f"/m/layers.{k}/Op_output_0"  # noqa: E731
    kinds = ["Mul", "Add"] * 2
    nodes = [helper.make_node(op, [out(k - 1) if k else "x", f"m.layers.{k}.w"], [out(k)],
                              name=f"/m/layers.{k}/Op") for k, op in enumerate(kinds)]
    nodes.append(helper.make_node("Relu", [out(3)], ["y"], name="/m/Relu"))
    weights = [t(f"m.layers.{k}.w") for k in range(4)]
    model = helper.make_model(helper.make_graph(nodes, "g", [t("x"), *weights], [t("y")]))
    assert repeat_layer(model, "m.layers", 6, src=3, period=2) == {4: 2, 5: 3}
    got = [(n.op_type, list(n.input)) for n in model.graph.node]
    assert got[4:] == [("Mul", [out(3), "m.layers.4.w"]), ("Add", [out(4), "m.layers.5.w"]),
                       ("Relu", [out(5)])]
    assert [i.name for i in model.graph.input][-2:] == ["m.layers.4.w", "m.layers.5.w"]
    with pytest.raises(ConversionError, match="7 layers do not end on layer 3's kind"):
        repeat_layer(model, "m.layers", 7, src=3, period=2)
