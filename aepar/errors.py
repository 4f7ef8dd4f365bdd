"""Errors a run ends with, and the exit codes they give.

| exit | meaning |
| --- | --- |
| 0 | done |
| 1 | internal error (a traceback names the rank) |
| 2 | bad input or an impossible option: one line naming it (:class:`UserError`) |
| 3 | diverged: NaN or Inf in a loss or the parameters (:class:`Diverged`) |
| 74 | a file of the run could not be written (disk full, quota, read-only, I/O error): one line naming it and what was kept (:class:`WriteFailed`) |
| 75 | interrupted by a signal; a checkpoint was saved: ``--resume DIR`` (:class:`Interrupted`) |
| 124 | a rank stopped making progress for ``--timeout`` seconds (the watchdog) |
"""

EXIT_INTERNAL, EXIT_USAGE, EXIT_DIVERGED, EXIT_WRITE, EXIT_INTERRUPTED, EXIT_STALLED = 1, 2, 3, 74, 75, 124


class UserError(Exception):
    """Bad input or an impossible option. The message is one line naming what is wrong."""

    exit_code = EXIT_USAGE
    run_state = "failed"


class DataError(UserError):
    """A data file that is missing, corrupt, truncated or of the wrong shape."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class CheckpointError(UserError):
    """A checkpoint that does not match the model or scheme asked for."""


class Diverged(UserError):
    """NaN or Inf in a loss or in the parameters: the run stops, its last good checkpoint
    stays. The message names the scheme, the layer and the epoch (or iteration)."""

    exit_code = EXIT_DIVERGED
    run_state = "diverged"


class Interrupted(UserError):
    """A signal asked the run to stop; a checkpoint was saved (``--resume`` continues)."""

    exit_code = EXIT_INTERRUPTED
    run_state = "interrupted"


class WriteFailed(UserError):
    """A file of the run could not be written (ENOSPC, EDQUOT, EROFS, EIO, ...). The message
    names the file, the reason and what was kept (74 is sysexits' EX_IOERR)."""

    exit_code = EXIT_WRITE


def describe(exc) -> tuple:
    """(class name, first line of the message): an error as one rank tells the others."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return type(exc).__name__, text


def one_line(exc) -> str:
    """``Name: first line of the message`` (the name alone when there is none): how an
    error aepar did not raise itself is quoted inside one of its own one-line messages."""
    name, text = describe(exc)
    return f"{name}: {text}" if text else name


def rebuild(described) -> UserError | None:
    """An error another rank described (:func:`describe`) as the same user-facing kind
    (collective: every rank raises it), or None when it was not a :class:`UserError`."""
    name, text = described
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, UserError)):
        return None
    exc = cls.__new__(cls)
    Exception.__init__(exc, text)
    exc.collective = True
    return exc
