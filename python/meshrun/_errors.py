"""The one-line exit of a program that uses meshrun.ft where it cannot work."""

import sys


class UsageError(SystemExit):
    """A program using meshrun.ft where it cannot work: one line, exit code 2.

    A SystemExit, so that the line is all the worker prints (no traceback
    around a configuration mistake) and no training starts from zero. The
    interpreter prints nothing for an integer exit code, so the line is
    printed here: raise it only on the way out of the program (the pure
    parts raise their own errors, which meshrun.ft turns into this).
    """

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = f"meshrun.ft: {message}"
        print(self.message, file=sys.stderr, flush=True)

    def __str__(self) -> str:
        return self.message
