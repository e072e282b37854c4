"""The one exception type for failures a user can act on; the CLI prints it as one line."""


class TokmixError(Exception):
    """A user-facing failure: bad input, a recipe problem, a source that runs out, no disk space."""
