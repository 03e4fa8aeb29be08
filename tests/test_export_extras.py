"""The optional exporters: each test runs when its exporter is installed and is skipped otherwise
(`pip install jax2onnx`; `pip install tensorflow-cpu tf2onnx`). Neither is an extra of
this package: jax2onnx pins an older orbax-checkpoint, TensorFlow other numpy and protobuf."""

import pytest

from converters import ConversionError, convert, from_flax, from_keras

# Conv 3 -> 8 channels, 3x3, same padding, on 8x8 images at batch 4: 2 * MACs
CONV_FLOPS = 2 * 4 * 8 * 8 * 8 * 3 * 3 * 3


def _check(proto):
    seq = convert(proto, batch_size=4)
    counts = seq.op_type_counts()
    assert seq.unknown_ops == {}, seq.unknown_ops
    assert counts.get("Conv") == 1, counts
    assert seq.flops >= CONV_FLOPS
    assert next(iter(seq.meta["inputs"].values()))[0] == 4  # the batch dim was concretised
    return seq


def test_from_flax_exports_an_nnx_model():
    pytest.importorskip("jax2onnx")
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 8, (3, 3), padding="SAME", rngs=rngs)
            self.head = nnx.Linear(8, 10, rngs=rngs)

        def __call__(self, x):  # [B, 8, 8, 3] -> [B, 10]
            return self.head(nnx.relu(self.conv(x)).mean(axis=(1, 2)))

    _check(from_flax(Net(nnx.Rngs(0)), [("B", 8, 8, 3)]))


def test_from_flax_refuses_parameters_given_as_an_input_and_says_where_they_go():
    """A linen user's `from_flax(lambda p, x: model.apply(p, x), [params, shape])` met
    jax2onnx's own TypeError; it is refused before jax2onnx is needed."""
    with pytest.raises(ConversionError, match=r"^example_inputs\[0\]: a dict, not an array or "
                       r"a shape; parameters go in the function"):
        from_flax(lambda p, x: x, [{"params": {}}, ("B", 8)])


def test_from_keras_exports_a_keras_model():
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tf2onnx")
    model = tf.keras.Sequential([  # Dropout: a random op tf2onnx cannot convert by itself
        tf.keras.Input((8, 8, 3)), tf.keras.layers.Conv2D(8, 3, padding="same"),
        tf.keras.layers.BatchNormalization(), tf.keras.layers.ReLU(),
        tf.keras.layers.Dropout(0.1), tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10)])
    seq = _check(from_keras(model, [tf.TensorSpec((None, 8, 8, 3), tf.float32)]))
    counts = seq.op_type_counts()
    assert counts.get("ReduceMean", 0) >= 2  # training-mode batch statistics are computed
    assert counts.get("GreaterOrEqual") == 1  # the dropout mask
    assert seq.params == 8 * 3 * 3 * 3 + 8 * 10  # the kernels (folded biases not counted)
