"""The one exception type of the emulation: a one-line message a user can act on."""


class EmulationError(RuntimeError):
    """The environment or the request cannot be emulated; ``str()`` is one clear line."""
