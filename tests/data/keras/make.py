"""Makes the Keras exports of `tests/test_export_corpus.py`: two Keras models converted by
tf2onnx as users convert them (an inference graph at a dynamic batch), their weights turned
into graph inputs so that the files stay small (as `export_params=False` does), and Keras'
own counts of them. Needs TensorFlow and tf2onnx, which the package does not (run it in
their own environment):

    python -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu tf2onnx
    /tmp/tf/bin/python tests/data/keras/make.py
"""

import json
from pathlib import Path

import numpy as np
import onnx
import tensorflow as tf
import tf2onnx

HERE = Path(__file__).parent
SIZE, OPSET = 32, 17


def small_cnn():
    x = tf.keras.Input((SIZE, SIZE, 3))
    h = tf.keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    h = tf.keras.layers.BatchNormalization()(h)
    h = tf.keras.layers.ReLU()(h)
    h = tf.keras.layers.DepthwiseConv2D(3, strides=2, padding="same")(h)
    h = tf.keras.layers.Conv2D(32, 1)(h)
    h = tf.keras.layers.GlobalAveragePooling2D()(h)
    h = tf.keras.layers.Dropout(0.2)(h)
    return tf.keras.Model(x, tf.keras.layers.Dense(10)(h))


MODELS = {
    "keras-cnn": small_cnn,
    "keras-mobilenetv2": lambda: tf.keras.applications.MobileNetV2(
        input_shape=(SIZE, SIZE, 3), alpha=0.35, weights=None, classes=10),
}


def contraction_flops(model, batch: int) -> int:
    """Forward FLOPs of the Conv2D, DepthwiseConv2D and Dense layers from Keras' own layer
    shapes: 2 per multiply-add, and 1 per bias that a convolution adds (ONNX's Conv carries
    its bias; a Dense layer's is an Add of its own)."""
    total = 0
    for layer in model.layers:
        out = layer.output.shape
        if isinstance(layer, (tf.keras.layers.Conv2D, tf.keras.layers.DepthwiseConv2D)):
            kh, kw = layer.kernel_size
            per_output = 1 if isinstance(layer, tf.keras.layers.DepthwiseConv2D) \
                else layer.input.shape[-1]
            total += np.prod(out[1:]) * (2 * kh * kw * per_output + layer.use_bias)
        elif isinstance(layer, tf.keras.layers.Dense):
            total += 2 * layer.input.shape[-1] * layer.units
    return int(total * batch)


def weight_free(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Float initializers of rank >= 1 become graph inputs of their shape (no values)."""
    keep = []
    for init in proto.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) >= 1:
            proto.graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, onnx.TensorProto.FLOAT, list(init.dims)))
        else:
            keep.append(init)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    return proto


def main() -> None:
    counts = {}
    for name, build in MODELS.items():
        tf.keras.utils.set_random_seed(0)
        model = build()
        rng = np.random.default_rng(0)
        for w in model.weights:  # distinct values, as trained weights have: a converter
            shape = tuple(w.shape)  # drops an Add of zeros (a bias at initialisation)
            w.assign(np.abs(rng.normal(1, 0.1, shape)) if "variance" in w.path
                     else rng.normal(0, 0.02, shape))
        fn = tf.function(lambda x, m=model: m(x, training=False))
        spec = [tf.TensorSpec((None, SIZE, SIZE, 3), tf.float32, name="image")]
        proto, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=OPSET)
        onnx.save(weight_free(proto), HERE / f"{name}.onnx")
        counts[name] = dict(
            params=int(sum(np.prod(w.shape) for w in model.trainable_weights)),
            flops_per_sample=contraction_flops(model, 1), image_size=SIZE,
            tensorflow=tf.__version__, tf2onnx=tf2onnx.__version__, opset=OPSET)
    (HERE / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")


if __name__ == "__main__":
    main()
