"""The one exception type of the converters: a one-line message naming the problem."""


class ConversionError(ValueError):
    """Bad input to the converters (file, node, op, shape named in the message).

    The message is always a single line so that the CLI can print it as is.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
