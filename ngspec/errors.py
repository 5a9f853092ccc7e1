"""User-facing errors: anything raised as `NgspecError` is shown as one clear line by the CLI."""


class NgspecError(Exception):
    """An error caused by the user's input or environment, with a message meant for them."""
