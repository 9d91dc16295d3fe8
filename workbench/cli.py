"""`workbench` command line. Each feature module contributes its subcommands through ``register(subparsers)``.

Errors the user can fix (WorkbenchError) print one readable line on stderr and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import errno
import re
import sys
from collections.abc import Sequence

from workbench import __version__, demo
from workbench.calib import cli as calib_cli
from workbench.clean import cli as clean_cli
from workbench.engine import cli as engine_cli
from workbench.errors import WorkbenchError
from workbench.explore import cli as explore_cli
from workbench.export import cli as export_cli
from workbench.model import cli as model_cli
from workbench.precision import cli as precision_cli
from workbench.timing import cli as timing_cli
from workbench.zoo import cli as zoo_cli

# Each stage package owns its subcommands (``register(subparsers)``), in journey order.
COMMAND_MODULES = (
    model_cli,
    clean_cli,
    precision_cli,
    engine_cli,
    explore_cli,
    calib_cli,
    timing_cli,
    export_cli,
    zoo_cli,
    demo,
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="TensorRT optimization workbench: clean ONNX, build engines, calibrate INT8, time pipelines, export.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log what each step does to stderr (-v: steps, -vv: details); the workbench's loggers are named per package",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def _tolerant_output() -> None:
    """Characters the terminal's encoding lacks (PYTHONIOENCODING=ascii, a Latin-1 locale) print as escapes
    (``\u2026``) instead of raising UnicodeEncodeError halfway through a command's output."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        # "strict" (PYTHONIOENCODING=ascii) and "surrogateescape" (the C locale) both raise on a character like '…'
        if reconfigure is not None and getattr(stream, "errors", "strict") in ("strict", "surrogateescape"):
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream already closed or detached: leave it
                pass


def _configure_logging(verbosity: int) -> None:
    """Warnings of the workbench's loggers always reach stderr; ``-v`` adds its steps, ``-vv`` their details.
    Other libraries' warnings go through the ``workbench.library_warnings`` logger (shown from ``-v`` on)."""
    import logging

    from workbench.log import LIBRARY_WARNINGS, ROOT

    root = logging.getLogger(ROOT)
    if not any(getattr(handler, "workbench_cli", False) for handler in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler.workbench_cli = True  # type: ignore[attr-defined]  # marks our own handler (one per process)
        root.addHandler(handler)
    root.setLevel(logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG)
    logging.getLogger(LIBRARY_WARNINGS).setLevel(logging.WARNING if verbosity > 0 else logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_output()
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command started (building the parser, parsing): no traceback
        print("workbench: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse refused an option (status 2, usage line printed) or printed --help
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    _configure_logging(int(getattr(args, "verbose", 0)))
    try:
        result = args.func(args)
    except WorkbenchError as error:
        # one line, whatever the message holds (ONNX Runtime and TensorRT errors span several lines)
        text = re.sub(r"\s*\n\s*", " ", str(error).strip())
        print(f"workbench {args.command}: error: {text}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as Unix tools do
        sys.stderr.close()
        return 0
    except OSError as error:  # a full or read-only disk met outside our atomic writers: still one line, status 2
        from workbench._io import storage_error

        converted = storage_error(error, error.filename or "an output")
        if converted is None and error.errno == errno.ENAMETOOLONG:
            converted = WorkbenchError(
                f"{str(error.filename or 'a path')[:80]}…: file name too long.",
                expected="file and folder names of at most 255 bytes",
            )
        if converted is None:
            raise
        print(f"workbench {args.command}: error: {converted}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
