"""The LightGBM companion (`mdot_jax.models.trees`, `mdot_jax.data.aggregates`): features
and boosters."""


import numpy as np


def test_companion_features_keep_their_width_when_the_vocabulary_grows(tiny_real_dataset):
    """A companion fitted on an older, shorter vocabulary reads newer op types as <unk>
    (a longer feature vector made LightGBM refuse to predict)."""
    import dataclasses

    from converters.vocab import UNK_ID, VOCAB
    from mdot_jax.data.aggregates import aggregates
    from mdot_jax.data.dataset import Sample

    s = tiny_real_dataset.samples[0]

    def with_first_op(t):
        op_type = np.array(s.seq.op_type)
        op_type[0] = t
        return Sample.in_memory(dataclasses.replace(s.seq, op_type=op_type), s.workload)

    old = len(VOCAB) - 1
    newer, unk = (aggregates(with_first_op(t), ["rtx3090"], old) for t in (old, UNK_ID))
    np.testing.assert_array_equal(newer, unk)
    assert len(aggregates(s, ["rtx3090"])) == len(newer) + 1


def test_companion_conv_breakdown_puts_each_convolution_in_its_classes():
    """A dense 3x3 convolution, then a depthwise 7x7 one with stride 2: the 3x3 class holds
    the first, the larger / strided / depthwise classes the second, the 1x1 class nothing.
    Version 1 of the aggregates is version 2 without the breakdown."""
    from onnx import helper
    from onnx_builders import model, value

    from converters import convert
    from mdot_jax.data.aggregates import aggregates, conv_breakdown
    from mdot_jax.data.dataset import Sample, Workload

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["c", "w2"], ["y"], kernel_shape=[7, 7], pads=[3] * 4,
                              strides=[2, 2], group=4)]
    m = model(nodes, [value("x", [2, 4, 8, 8]), value("w1", [4, 4, 3, 3]),
                      value("w2", [4, 1, 7, 7])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, batch_size=2)
    load = seq.load.astype(np.float64)
    dense, depthwise = (np.log1p([load[i, 0:2].sum(), load[i, 2:4].sum(), 1]) for i in (0, 1))
    want = np.concatenate([np.zeros(3), dense, depthwise, depthwise, depthwise])
    np.testing.assert_allclose(conv_breakdown(seq), want, rtol=1e-6)
    s = Sample.in_memory(seq, Workload(batch_size=2, input_size=8, device="rtx3090"))
    v1, v2 = (aggregates(s, ["rtx3090"], version=v) for v in (1, 2))
    np.testing.assert_allclose(v2, np.concatenate([v1, conv_breakdown(seq)]), rtol=1e-6)


def test_companion_group_breakdown_buckets_grouped_depthwise_and_unaligned_convolutions():
    """A grouped 1x1 convolution (64 channels in 4 groups: 16 per group), a depthwise 5x5
    one over 256 channels and a dense 3x3 one to 12 channels each land in their own bucket
    and nowhere else. Version 2 of the aggregates is version 3 without the breakdown."""
    from onnx import helper
    from onnx_builders import model, value

    from converters import convert
    from mdot_jax.data.aggregates import aggregates, group_breakdown
    from mdot_jax.data.dataset import Sample, Workload

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1], group=4),
             helper.make_node("Conv", ["a", "w2"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["b", "w3"], ["c"], kernel_shape=[5, 5], pads=[2] * 4,
                              group=256),
             helper.make_node("Conv", ["c", "w4"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    m = model(nodes, [value("x", [2, 64, 8, 8]), value("w1", [64, 16, 1, 1]),
                      value("w2", [256, 64, 1, 1]), value("w3", [256, 1, 5, 5]),
                      value("w4", [12, 256, 3, 3])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, batch_size=2)
    flops = seq.load[:, 0:2].astype(np.float64).sum(axis=1)
    want = np.zeros(14)
    want[2:4] = flops[0], 1  # grouped, 8-31 channels per group
    want[11] = flops[2]  # depthwise, >= 256 channels, kernel larger than 3
    want[12:14] = flops[3], 1  # 12 output channels: not a multiple of 8
    np.testing.assert_allclose(group_breakdown(seq), np.log1p(want), rtol=1e-6)
    s = Sample.in_memory(seq, Workload(batch_size=2, input_size=8, device="rtx3090"))
    v2, v3 = aggregates(s, ["rtx3090"], version=2), aggregates(s, ["rtx3090"])
    np.testing.assert_allclose(v3, np.concatenate([v2, group_breakdown(seq)]), rtol=1e-6)


def test_fit_boosters_ignores_rows_of_zero_weight():
    """Half the rows carry a target 3 too high; weighted 0 they leave the fit alone, weighted
    equally they pull it up."""
    from mdot_jax.models.trees import fit_boosters

    rng = np.random.default_rng(0)
    x = rng.uniform(size=(400, 1))
    y = x[:, 0] + np.where(np.arange(400) % 2, 3.0, 0.0)
    kw = dict(grid=((4, 0.1),), seeds=1)
    (weighted,) = fit_boosters(x, y, x[::2], y[::2], weight=1.0 - np.arange(400) % 2, **kw)
    (plain,) = fit_boosters(x, y, x[::2], y[::2], **kw)
    assert np.abs(weighted.predict(x[::2]) - y[::2]).mean() < 0.1
    assert plain.predict(x[::2]).mean() - y[::2].mean() > 1.0
