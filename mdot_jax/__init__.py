"""mdot-jax: predict the training iteration time of a deep-learning model before it runs.

The public API (imported lazily, so `mdot convert` does not pay for JAX start-up):
  convert, OperatorSequence, ConversionError   (from converters)
  Predictor                                    (mdot_jax.predict)
  load_dataset                                 (mdot_jax.data)
  train, TrainConfig, ModelConfig              (mdot_jax.train, mdot_jax.model)
"""

import importlib

__version__ = "0.1.0"
_EXPORTS = {
    "convert": "converters", "OperatorSequence": "converters", "ConversionError": "converters",
    "Predictor": "mdot_jax.predict", "load_dataset": "mdot_jax.data",
    "train": "mdot_jax.train", "TrainConfig": "mdot_jax.train", "ModelConfig": "mdot_jax.model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mdot_jax' has no attribute {name!r}")
