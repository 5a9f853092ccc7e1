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


def json_kind(value: object) -> str:
    """What a value read from JSON is, in JSON's words ("null", "a number", "a JSON object"), for a
    message that says what a field holds instead of what it should; Python's names ("NoneType",
    "dict") mean nothing to whoever wrote the file. Other types (a Parquet reader's) by name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    for kinds, words in (((int, float), "a number"), (str, "a string"), ((list, tuple), "a list"), (dict, "a JSON object")):
        if isinstance(value, kinds):
            return words
    return f"a {type(value).__name__}"
