"""User-facing errors: anything raised as `NgspecError` is shown as one clear line by the CLI."""


class NgspecError(Exception):
    """An error caused by the user's input or environment, with a message meant for them."""


class Stopped(Exception):
    """Ctrl-C (or SIGTERM) during a long measurement that had finished part of it whole:
    ``measured`` is that part (`bench`'s prompts or rounds, `profile-bound`'s groups of cells),
    for the command to report before it exits non-zero."""

    def __init__(self, measured):
        super().__init__("interrupted")
        self.measured = measured


def shown(value: object) -> str:
    """A value as a message shows it: as Python writes it when short, else by its type."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"
