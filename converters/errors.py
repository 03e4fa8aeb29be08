"""The one exception type of the converters: a one-line message naming the problem."""


class ConversionError(ValueError):
    """Bad input to the converters (file, node, op, shape named in the message).

    The message is always a single line so that the CLI can print it as is.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class PastPositions(ConversionError):
    """An input longer than model `label`'s learned position table has rows (`rows`, read by
    `node`, the largest row it would read `top`): GPT-2's 1,024 asked for 4,096 tokens. The
    caller knows which of its settings made the input that long."""

    def __init__(self, message: str, label: str, rows: int, node: str, top: int):
        super().__init__(message)
        self.label, self.rows, self.node, self.top = label, rows, node, top
