"""Feature normalisation statistics."""

import numpy as np

from mdot_jax.data.features import MIN_STD, fit_stats


def test_near_constant_features_are_not_divided_by_float_noise(tiny_real_dataset):
    stats = fit_stats(tiny_real_dataset.samples)
    for name in ("config_std", "load_std", "workload_std"):
        std = np.asarray(getattr(stats, name))
        assert np.all((std > MIN_STD) | (std == 1.0)), name
    assert np.isfinite(stats.target_std) and stats.target_std > 0


def test_conv_kinds_and_their_flops():
    """Dense (groups 1), grouped (1 < groups < C_in) and depthwise (groups = C_in) Conv are
    told apart per operator, and their forward FLOPs are summed per kind in the totals."""
    from onnx import helper
    from onnx_builders import model, value

    from converters import convert
    from mdot_jax.data.features import CONFIG_DIM, GRAPH_TOTALS, conv_kinds, graph_totals, op_config

    def conv(i, o, w, group):
        return helper.make_node("Conv", [i, w], [o], name=o, kernel_shape=[3, 3],
                                pads=[1, 1, 1, 1], group=group)

    nodes = [conv("x", "dense", "w1", 1), conv("dense", "grouped", "w2", 2),
             conv("grouped", "dw", "w3", 8), helper.make_node("Relu", ["dw"], ["y"], name="r")]
    inputs = [value("x", [1, 8, 4, 4]), value("w1", [8, 8, 3, 3]), value("w2", [8, 4, 3, 3]),
              value("w3", [8, 1, 3, 3])]
    m = model(nodes, inputs, [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, batch_size=1)
    np.testing.assert_array_equal(conv_kinds(seq), [[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]])
    assert op_config(seq).shape == (4, CONFIG_DIM)
    totals = dict(zip(GRAPH_TOTALS, graph_totals(seq)))
    macs = 8 * 16 * 9  # per input channel per group, for each output channel and pixel
    assert totals["dense_conv_flops"] == 2 * macs * 8
    assert totals["grouped_conv_flops"] == 2 * macs * 4
    assert totals["depthwise_conv_flops"] == 2 * macs * 1
