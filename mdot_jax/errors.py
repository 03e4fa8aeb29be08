"""Errors the CLI prints as one line (kept free of JAX so `mdot convert` starts fast)."""


class CheckpointError(ValueError):
    """A missing, corrupt or incompatible checkpoint."""


class UsageError(ValueError):
    """Bad command-line input."""
