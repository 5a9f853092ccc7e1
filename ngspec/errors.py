"""User-facing errors: anything raised as `NgspecError` is shown as one clear line by the CLI."""


class NgspecError(Exception):
    """An error caused by the user's input or environment, with a message meant for them."""


def shown(value: object) -> str:
    """A value as a message shows it: as Python writes it when short, else by its type."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"
