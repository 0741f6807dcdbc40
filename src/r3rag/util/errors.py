"""User-facing errors.

Raise `UserError("what is wrong, and where")` for anything a user can fix (bad path,
malformed line, unknown config key). The CLI prints it as one line and exits non-zero;
a traceback is shown only with `--debug`.
"""


class UserError(Exception):
    """An error caused by input the user can fix; printed as one line."""
