"""The one exception type the command line turns into a clean message and exit status 1."""


class UserError(Exception):
    """A failure the user can act on. The message says what went wrong and what to do next."""
