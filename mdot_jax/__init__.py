"""mdot-jax: predict the training iteration time of a deep-learning model before it runs."""

from converters import ConversionError, OperatorSequence, convert

__all__ = ["ConversionError", "OperatorSequence", "convert"]
__version__ = "0.1.0"
