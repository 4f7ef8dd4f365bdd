"""Errors a user can fix: reported as one line and exit code 2 by every CLI."""


class UserError(Exception):
    """Bad input or an impossible option. The message is one line naming what is wrong."""

    exit_code = 2


class DataError(UserError):
    """A data file that is missing, corrupt, truncated or of the wrong shape."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class CheckpointError(UserError):
    """A checkpoint that does not match the model or scheme asked for."""
