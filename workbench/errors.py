"""The one exception type users see, and a helper that makes its messages say what was expected."""

from __future__ import annotations


class WorkbenchError(Exception):
    """A problem with the user's input or environment, explained in words.

    The CLI prints ``str(error)`` and exits non-zero without a traceback; notebook panels show it as a
    message. Messages name the thing that was wrong (a path, a tensor, an option) and what was expected.
    """

    def __init__(self, problem: str, *, expected: str | None = None, hint: str | None = None) -> None:
        self.problem = problem
        self.expected = expected
        self.hint = hint
        text = problem
        if expected:
            text += f" Expected: {expected}."
        if hint:
            text += f" Hint: {hint}"
        super().__init__(text)


class BackendUnavailable(WorkbenchError):
    """No usable TensorRT backend (neither `tensorrt` nor `tensorrt_rtx`) could be imported."""


class EngineCannotRun(WorkbenchError):
    """An engine was built but this machine cannot execute it (no GPU, unsupported compute capability)."""
