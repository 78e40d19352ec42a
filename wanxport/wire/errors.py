"""The one exception the wire layer raises; receive paths turn it into a counted drop."""


class WireError(ValueError):
    """A datagram or frame is malformed; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
