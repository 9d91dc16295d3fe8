"""Run the real `workbench` CLI in a child process, fast: the child is forked from a parent that has already
imported the package, then runs ``workbench.cli.main(argv)`` exactly as ``python -m workbench`` does (its own
process, cwd, environment, stdout/stderr files and exit status; an uncaught exception prints Python's traceback and
exits 1, as the interpreter would). A few cases are also run through ``python -m workbench`` to show both agree.

Also: tiny ONNX models built in the test, and a directory snapshot (sha256 of every file, hidden ones included).
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def _preimport() -> None:
    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    import workbench.cli  # noqa: F401


@dataclass
class ForkedCli:
    """A `workbench` child process started by :func:`spawn_cli_forked`."""

    argv: list[str]
    pid: int
    out: Any
    err: Any
    ready_fd: int = -1  # readable once the child has set itself up and calls main()

    def wait_started(self, timeout: float = 30.0) -> None:
        """Until the child calls ``main``: a signal during the harness's own set-up in the child (redirecting its
        output) would be the harness's, not the CLI's (a whole-suite run, 2026-12-06: SIGINT 0.05 s after the fork
        landed in io.TextIOWrapper, before main)."""
        import select

        ready, _, _ = select.select([self.ready_fd], [], [], timeout)
        if not ready:
            raise TimeoutError(f"workbench {' '.join(self.argv)} did not start within {timeout} s")

    def wait(self, timeout: float = 120.0) -> CliRun:
        try:
            return self._wait(timeout)
        finally:  # closed once the child is gone: it writes its mark whether or not anyone waits for it
            if self.ready_fd >= 0:
                os.close(self.ready_fd)
                self.ready_fd = -1

    def _wait(self, timeout: float) -> CliRun:
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise TimeoutError(f"workbench {' '.join(self.argv)} ran past {timeout} s")
            time.sleep(0.005)
        code = os.waitstatus_to_exitcode(status)
        self.out.seek(0)
        self.err.seek(0)
        return CliRun(
            self.argv, code, self.out.read().decode("utf-8", "replace"), self.err.read().decode("utf-8", "replace")
        )

    def signal(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


def spawn_cli_forked(argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str] | None = None) -> ForkedCli:
    """Start ``workbench ARGV`` in a forked child process and return at once."""
    import tempfile

    _preimport()
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: behave like `python -m workbench ARGV`
        code = 1
        os.close(ready_read)
        try:
            os.chdir(cwd)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", line_buffering=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", line_buffering=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if env:
                os.environ.update(env)
            import workbench._io

            workbench._io._HANDLERS_INSTALLED = False  # a fresh process has installed no handlers yet
            workbench._io._SWEPT.clear()
            from workbench.cli import main

            try:
                os.write(ready_write, b"1")  # the pipe holds it: never blocks
            finally:
                os.close(ready_write)
            try:
                code = int(main(argv) or 0)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # what the interpreter would print for an uncaught exception
            traceback.print_exc()
            code = 1
        finally:
            try:
                import workbench._io

                workbench._io.cleanup_temps()  # what the package's atexit handler does in a fresh interpreter
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(ready_write)
    return ForkedCli(argv, pid, out, err, ready_read)


def run_cli_forked(
    argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str] | None = None, timeout: float = 120.0
) -> CliRun:
    """``workbench ARGV`` in a forked child process; returns its exit status and output."""
    return spawn_cli_forked(argv, cwd, env).wait(timeout)


def run_cli_subprocess(
    argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str] | None = None, timeout: float = 300.0
) -> CliRun:
    """``python -m workbench ARGV`` as a plain subprocess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", *argv],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliRun(argv, proc.returncode, proc.stdout, proc.stderr)


def snapshot(folder: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of every file below ``folder`` (hidden files included; symlinks by their target text)."""
    root = Path(folder)
    result: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            result[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            result[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            result[rel + "/"] = "dir"
    return result


def tiny_onnx(path: Path, *, shape: list = None, dtype: int | None = None, name: str = "x") -> Path:  # type: ignore[assignment]
    """x[N,4] -> MatMul(W[4,3]) -> Relu -> y: a model TensorRT builds and calibration quantizes, in milliseconds."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT if dtype is None else dtype
    dims = shape if shape is not None else ["N", 4]
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0 - 0.5, "W")
    if elem == TensorProto.STRING:
        nodes = [helper.make_node("Identity", [name], ["y"])]
        out = helper.make_tensor_value_info("y", TensorProto.STRING, dims)
        inits = []
    else:
        nodes = [
            helper.make_node("MatMul", [name, "W"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 3])
        inits = [weight]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info(name, elem, dims)], [out], initializer=inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="trust-test")
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
