"""mdot-jax: predict the training iteration time of a deep-learning model before it runs.

The public API (imported lazily, so `mdot convert` does not pay for JAX start-up):
  convert, OperatorSequence, ConversionError   (from converters)
  TrainingJob, predict                         (mdot_jax.serving: the request and its answer)
  Plan, plan                                   (mdot_jax.serving.plan: GPUs ranked for a job)
  Predictor                                    (mdot_jax.serving.predict)
  load_dataset                                 (mdot_jax.data.dataset)
  train, TrainConfig                           (mdot_jax.training.train)
  ModelConfig                                  (mdot_jax.models)
  RECIPES                                      (mdot_jax.recipes: shipped, paper, mdot, tiny)
  MdotError, RequestError                      (mdot_jax.errors: what every failure raises)
  ModelError                                   (mdot_jax.serving.model_source: the model's)

Subpackages: `data` (datasets, features, aggregates), `measure` (profiling here: devices,
zoo models, operators, the core set), `models` (the networks, the tree model, the kernel cost
model), `training`, `serving` (checkpoints, error bands, adaptation, the Predictor),
`evaluation`; `recipes` names what `mdot train` trains.
"""

import importlib

__version__ = "0.2.0"  # the one version source (pyproject reads it)
_EXPORTS = {
    "convert": "converters", "OperatorSequence": "converters", "ConversionError": "converters",
    "TrainingJob": "mdot_jax.serving.request", "predict": "mdot_jax.serving.front",
    "Plan": "mdot_jax.serving.plan", "plan": "mdot_jax.serving.plan",
    "MdotError": "mdot_jax.errors", "RequestError": "mdot_jax.errors",
    "ModelError": "mdot_jax.serving.model_source",
    "Predictor": "mdot_jax.serving.predict", "load_dataset": "mdot_jax.data.dataset",
    "train": "mdot_jax.training.train", "TrainConfig": "mdot_jax.training.train",
    "ModelConfig": "mdot_jax.models", "RECIPES": "mdot_jax.recipes",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mdot_jax' has no attribute {name!r}")
