"""The project's one logging set-up: a logger per package, and other libraries' warnings routed into logging.

Every module logs through ``get_logger(__name__)`` (``workbench.calib.stats`` and so on), so a user raises or
silences one package with the standard :mod:`logging` API. Warnings raised by *other* libraries (torch's
deprecations, onnx's converter notes) are diagnostics for the log, not findings about the user's model: panels show
only the workbench's own warnings (:func:`is_own_warning`) and send the rest here (:func:`log_library_warning`).
Nothing is configured at import: the package adds a :class:`logging.NullHandler` and leaves handlers to the
application (the CLI and notebooks), as the logging HOWTO asks of libraries.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeVar

ROOT = "workbench"
_PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_WARNINGS = f"{ROOT}.library_warnings"

logging.getLogger(ROOT).addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """The logger of a workbench module or package (``__name__``); other names are placed under ``workbench.``."""
    return logging.getLogger(name if name == ROOT or name.startswith(ROOT + ".") else f"{ROOT}.{name}")


def is_own_warning(message: warnings.WarningMessage) -> bool:
    """Whether a caught warning was raised from the workbench's own code (its ``filename`` is inside the package)."""
    try:
        return Path(message.filename).resolve().is_relative_to(_PACKAGE_DIR)
    except (OSError, ValueError):
        return False


def log_library_warning(message: warnings.WarningMessage) -> None:
    """Send another library's warning to the ``workbench.library_warnings`` logger at WARNING level."""
    get_logger(LIBRARY_WARNINGS).warning(
        "%s: %s (%s:%s)", message.category.__name__, message.message, message.filename, message.lineno
    )


def split_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The workbench's own warnings as unique ``Category: text`` lines; every other library's goes to the log."""
    own: list[str] = []
    for message in caught:
        if is_own_warning(message):
            own.append(f"{message.category.__name__}: {message.message}")
        else:
            log_library_warning(message)
    return list(dict.fromkeys(own))


SHOWN_WARNINGS: set[str] = set()  # the texts a command showed as `warning:` lines (its notes skip them)
Command = TypeVar("Command", bound=Callable[..., int])


def warnings_as_lines(command: Command) -> Command:
    """Stage functions warn (for notebook users); a CLI command shows each warning once, as it happens, as a
    ``warning: TEXT`` line on standard output, not Python's ``file:line: UserWarning:`` with a line of our source."""

    @functools.wraps(command)
    def run(*args: object, **kwargs: object) -> int:
        SHOWN_WARNINGS.clear()
        original = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            text = str(message)
            if text not in SHOWN_WARNINGS:
                SHOWN_WARNINGS.add(text)
                print(f"warning: {text}", file=sys.stdout, flush=True)

        warnings.showwarning = show
        try:
            return command(*args, **kwargs)
        finally:
            warnings.showwarning = original

    return run  # type: ignore[return-value]
