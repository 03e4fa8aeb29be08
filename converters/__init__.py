"""Framework -> ONNX -> operator sequence. Knows nothing of `mdot_jax` (one-way imports)."""

import converters.ctc  # noqa: F401 (registers its operator's handler)
import converters.detection_ops  # noqa: F401 (registers its operators' handlers)
from converters.errors import ConversionError
from converters.export import from_flax, from_keras, from_torch, inference_export
from converters.fusion import converts_the_same
from converters.hf_config import from_hf_config
from converters.loader import convert, load_model, read_model
from converters.sequence import (
    CONFIG_FIELDS,
    LOAD_FIELDS,
    OperatorSequence,
    to_sequence,
)
from converters.vocab import VOCAB, VOCAB_VERSION

__all__ = [
    "CONFIG_FIELDS", "LOAD_FIELDS", "VOCAB", "VOCAB_VERSION", "ConversionError",
    "OperatorSequence", "convert", "converts_the_same", "from_flax", "from_hf_config", "from_keras",
    "from_torch",
    "inference_export", "load_model", "read_model", "to_sequence",
]
