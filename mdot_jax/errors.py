"""Errors the CLI prints as one line (kept free of JAX so `mdot convert` starts fast).

Every expected failure raises an `MdotError` (or, below the front door, the converters'
`ConversionError`, which `predict` and `plan` raise as `serving.model_source.ModelError`, both)
with a one-line message naming the file, line, flag or node; anything else is a bug and may
show a traceback.
"""


class MdotError(ValueError):
    """An expected failure: bad input, named in one line."""


class CheckpointError(MdotError):
    """A missing, corrupt or incompatible checkpoint."""


class UsageError(MdotError):
    """Bad command-line input."""


class DatasetError(MdotError):
    """A dataset directory that cannot be used as it is (`mdot dataset check` lists why)."""


class RequestError(MdotError):
    """A request with a field that cannot be honoured: the message starts with the field's
    name (`field`), which the CLI spells as its flag."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field
