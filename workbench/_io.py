"""Small file helpers: output validation, atomic writes (temp file + rename), directory swaps, safe JSON, digests.

Guarantees (see the README section "What the workbench guarantees, and what it refuses"):

- :func:`validate_outputs` is called by every command before any work: an output that is a directory where a file
  is meant, an unwritable parent, or the same file as an input is refused with a :class:`WorkbenchError`.
- :func:`atomic_path` writes into ``.NAME.<pid>.<random>.tmp`` beside the target and renames it into place; the temp
  file is removed on error, on SIGINT/SIGTERM and at exit, and stale temp files of killed runs (their process is
  gone) are swept on the next write into that folder.
- :func:`swap_directories` replaces a directory atomically (``renameat2(RENAME_EXCHANGE)`` on Linux, else two renames).
- :func:`write_json_atomic` writes valid JSON only: NaN and infinities become ``null``.
- :func:`read_json` refuses files above a size limit and documents nested deeper than a depth limit.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from types import FrameType

MAX_JSON_BYTES = 512 * 1024 * 1024
MAX_JSON_DEPTH = 64

# --- temporary files: registered, removed on signals / exit, stale ones swept -------------------------------

_LIVE_TEMPS: set[str] = set()
_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


def _remove_path(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def cleanup_temps() -> None:
    """Remove every temporary file or directory this process still has open (signal handlers, atexit)."""
    with _LOCK:
        paths = list(_LIVE_TEMPS)
        _LIVE_TEMPS.clear()
    for path in paths:
        _remove_path(path)


# set while the main thread creates and registers a temp file: a signal arriving then is acted on when it ends.
# Blocking the signal in the main thread (pthread_sigmask) is not enough: one delivered to another thread (ONNX
# Runtime's, tqdm's) still trips Python's handler, which the main thread then runs at its next bytecode, e.g. in
# mkstemp after the file exists
_HOLDING = 0
_PENDING: list[int] = []


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _HOLDING and threading.current_thread() is threading.main_thread():
        _PENDING.append(signum)
        return
    _act_on(signum)


def _act_on(signum: int) -> None:
    if _PENDING:  # signals still deferred from a hold are acted on now, and SIGTERM (the process ends) comes first
        signum = signal.SIGTERM if signal.SIGTERM in (*_PENDING, signum) else signum
        _PENDING.clear()
    if signum == signal.SIGINT:
        # unwinds through every atomic_path/staging_directory `finally` (which remove their temp files); what is
        # still registered at exit is removed by the atexit hook. Not removed here: a caller may catch it.
        raise KeyboardInterrupt
    cleanup_temps()
    # die of the same signal, so the parent sees the usual status
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_cleanup_handlers() -> None:
    """SIGTERM/SIGINT remove our temp files before the process ends; atexit does the same. Main thread only."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    _HANDLERS_INSTALLED = True
    atexit.register(cleanup_temps)
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            current = signal.getsignal(signum)
            if current in (signal.SIG_DFL, signal.default_int_handler, None):
                signal.signal(signum, _on_signal)
        except (ValueError, OSError):  # not the main thread of the main interpreter
            pass


def _register(path: str | Path) -> None:
    with _LOCK:
        _LIVE_TEMPS.add(str(path))


def register_temp(path: str | Path) -> None:
    """Remove ``path`` (a temporary file or folder this process made) on SIGINT/SIGTERM and at exit."""
    install_cleanup_handlers()
    _register(path)


def _unregister(path: str | Path) -> None:
    with _LOCK:
        _LIVE_TEMPS.discard(str(path))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM (main thread, POSIX) for a few statements; pending ones arrive when the block ends."""
    global _HOLDING
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    _HOLDING += 1  # first: a handler that runs from here on defers, so the mask below is always restored
    previous = None
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        yield
    finally:
        try:
            if previous is not None:  # still holding: a signal blocked until now, handled here, defers too
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        finally:
            _HOLDING -= 1
            # a handler that runs from here on acts at once, and _act_on takes what is pending with it
            if not _HOLDING and _PENDING:
                _act_on(_PENDING[0])


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")
_STALE_WITHOUT_PID_S = 3600.0


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_SWEPT: set[str] = set()


def _sweep_once(folder: Path) -> None:
    """Sweep a folder the first time this process writes into it (later writes skip the directory scan)."""
    key = os.path.abspath(folder)
    if key not in _SWEPT:
        _SWEPT.add(key)
        sweep_stale_temps(folder)


def sweep_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove ``.NAME.<pid>.<random>.tmp`` files/dirs in ``folder`` whose process is gone (left by a killed run).

    Temp names without a pid (older versions) are removed when older than an hour. Returns what was removed.
    """
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        match = _TEMP_NAME.match(entry.name)
        stale = False
        if match is not None:
            stale = not _pid_alive(int(match.group("pid")))
        else:
            with contextlib.suppress(OSError):
                stale = now - entry.stat(follow_symlinks=False).st_mtime > _STALE_WITHOUT_PID_S
        if stale:
            _remove_path(entry.path)
            removed.append(Path(entry.path))
    return removed


_STORAGE_ERRNOS = {28, 122, 27, 30}  # ENOSPC, EDQUOT, EFBIG, EROFS (Linux numbers; errno names below)


def storage_error(error: OSError, target: str | os.PathLike[str]) -> WorkbenchError | None:
    """A :class:`WorkbenchError` for a write that failed because the disk is full / over quota / read-only."""
    import errno as errno_

    codes = {
        getattr(errno_, name, code) for name, code in (("ENOSPC", 28), ("EDQUOT", 122), ("EFBIG", 27), ("EROFS", 30))
    }
    if error.errno not in codes | _STORAGE_ERRNOS:
        return None
    return WorkbenchError(
        f"{target}: writing failed ({error.strerror or error}); nothing was replaced and the partial output was removed.",
        expected="an output folder on a filesystem with enough free space that is writable",
    )


def make_folder(folder: str | os.PathLike[str], *, what: str = "the output folder") -> Path:
    """``mkdir -p folder``; a path below a file, a read-only or otherwise uncreatable place is a WorkbenchError."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        converted = storage_error(error, folder)
        if converted is not None:
            raise converted from error
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file, not a folder" if blocker is not None else (error.strerror or str(error))
        raise WorkbenchError(
            f"{what} {folder} cannot be created: {reason}.", expected="a folder path that can be created"
        ) from error
    return folder


def temp_prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; rename it onto ``target`` only if the block succeeds.

    A crash or exception leaves any existing ``target`` untouched and removes the partial file.
    """
    target = Path(target)
    if target.is_dir():
        raise WorkbenchError(f"{target}: is a directory.", expected="a file path to write")
    make_folder(target.parent, what=f"the folder of {target.name}:")
    install_cleanup_handlers()
    _sweep_once(target.parent)
    tmp_name = None
    try:
        with _signals_held():  # a signal between creating and registering the temp file would leak it
            fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
            _register(tmp_name)
            os.close(fd)
        tmp = Path(tmp_name)
        yield tmp
        # mkstemp creates 0600 files; give the result the permissions a plain open() would have
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as error:  # a full disk while writing: say so (the finally below removes the partial file)
        converted = storage_error(error, target)
        if converted is None:
            raise
        raise converted from error
    finally:
        if tmp_name is not None:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
            _unregister(tmp_name)


@contextlib.contextmanager
def staging_directory(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary directory beside ``target`` (registered for cleanup); removed when the block ends if still there."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    install_cleanup_handlers()
    _sweep_once(target.parent)
    staging = None
    try:
        with _signals_held():
            staging = Path(tempfile.mkdtemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent))
            _register(staging)
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp makes 0700 directories; a bundle is meant to be shared
        yield staging
    except OSError as error:
        converted = storage_error(error, target)
        if converted is None:
            raise
        raise converted from error
    finally:
        if staging is not None:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
            _unregister(staging)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


_RENAME_NOREPLACE = 1


def _renameat2(a: Path, b: Path, flags: int) -> int | None:
    """Linux renameat2: 0 when done, the errno when it failed, None where the call does not exist."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return 0
    import errno

    code = ctypes.get_errno()
    return None if code in (errno.ENOSYS, errno.EINVAL) else code  # EINVAL: the filesystem lacks the flag


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2 RENAME_EXCHANGE). False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE) == 0


def place_new_directory(new: str | os.PathLike[str], target: str | os.PathLike[str], *, label: str = "") -> None:
    """Rename directory ``new`` to ``target`` only if nothing is at ``target`` (no-replace semantics): a folder that
    appeared there meanwhile (another process, the user) is never swapped out or deleted; that is an error instead.

    Linux: one ``renameat2(RENAME_NOREPLACE)``; elsewhere a check then a rename, which on POSIX would replace only an
    empty folder."""
    new, target = Path(new), Path(target)
    result = _renameat2(new, target, _RENAME_NOREPLACE)
    if result is None:
        if os.path.lexists(target):
            result = 17  # EEXIST
        else:
            os.rename(new, target)
            return
    if result == 0:
        return
    import errno

    if result == errno.EEXIST:
        raise WorkbenchError(
            f"{label + ' ' if label else ''}{target}: appeared while this command ran (it did not exist when checked); "
            "it was left untouched and nothing was written there.",
            expected="an output folder that no other process creates meanwhile",
        )
    raise OSError(result, os.strerror(result), str(target))


def swap_directories(new: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Put directory ``new`` at ``target``; an existing ``target`` is replaced atomically where the OS allows.

    On Linux the two directories are exchanged in one ``renameat2(RENAME_EXCHANGE)`` call, so at every instant
    ``target`` is either the complete old or the complete new directory; the old one is then deleted. Elsewhere
    (or on filesystems without it) the old directory is renamed aside first, then the new one into place.
    """
    new, target = Path(new), Path(target)
    if not target.exists():
        os.replace(new, target)
        return
    if _renameat2_exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the old contents
        return
    aside = Path(tempfile.mkdtemp(prefix=temp_prefix(target) + "old.", suffix=".tmp", dir=target.parent))
    _register(aside)
    try:
        os.rmdir(aside)
        os.replace(target, aside)
        os.replace(new, target)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
        _unregister(aside)


# --- outputs written into a folder the user may share: never overwrite a file we did not write -----------------

OWNED_OUTPUTS_FILE = ".workbench-outputs.json"
_OWNED_FORMAT = "trt-workbench-outputs"


def _owned_records(folder: Path) -> dict[str, str] | None:
    """name -> sha256 of the files the workbench wrote into ``folder`` (None: the record is not ours)."""
    record = folder / OWNED_OUTPUTS_FILE
    if not os.path.lexists(record):
        return {}
    if record.is_symlink() or not record.is_file():
        return None
    try:
        data = read_json(record, what="the workbench's record of its outputs", max_bytes=16 * 1024 * 1024)
    except WorkbenchError:
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("format") == _OWNED_FORMAT else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    return {str(k): v for k, v in files.items()}


def refuse_foreign_outputs(folder: str | os.PathLike[str], names: Iterable[str], *, label: str) -> None:
    """Raise unless each of ``names`` in ``folder`` is absent or a file the workbench wrote there and nobody changed
    since (its sha256 is the one recorded in ``folder/.workbench-outputs.json``). Call before any work."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    records = _owned_records(folder)
    if records is None:
        raise WorkbenchError(
            f"{label} {folder}: {OWNED_OUTPUTS_FILE} there is not the workbench's record of its outputs, so it cannot "
            "tell which files it may replace; nothing was written.",
            expected="a new or empty folder, or one the workbench wrote earlier",
        )
    foreign = []
    for name in names:
        path = folder / name
        if not os.path.lexists(path):
            continue
        if path.is_symlink() or not path.is_file() or records.get(name) != sha256_file(path):
            foreign.append(name)
    if foreign:
        raise WorkbenchError(
            f"{label} {folder}: {', '.join(foreign)} already there and not written by the workbench (or changed "
            "since); they would be overwritten, so nothing was written.",
            expected="a new or empty folder, or one holding only earlier workbench outputs",
            hint="pick another folder, or move those files away",
        )


def record_outputs(folder: str | os.PathLike[str], paths: Iterable[str | os.PathLike[str]]) -> None:
    """Note in ``folder/.workbench-outputs.json`` that the workbench wrote ``paths`` (so a later run may replace them)."""
    folder = Path(folder)
    records = _owned_records(folder) or {}
    for path in paths:
        path = Path(path)
        records[path.name] = sha256_file(path)
    write_json_atomic(folder / OWNED_OUTPUTS_FILE, {"format": _OWNED_FORMAT, "files": dict(sorted(records.items()))})


# --- output validation --------------------------------------------------------------------------------------


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.abspath(a) == os.path.abspath(b) or a.resolve() == b.resolve()


def _inside(child: Path, folder: Path) -> bool:
    try:
        child.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def special_file_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a directory (following symlinks).

    Returns e.g. ``"a named pipe (FIFO)"``; ``None`` for a regular file, a directory or a missing path. Reading a
    FIFO blocks until a writer appears, and renaming a file over a device or pipe replaces it, so callers refuse these.
    """
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def refuse_special_file(path: str | os.PathLike[str], *, expected: str) -> None:
    """Raise :class:`WorkbenchError` when ``path`` exists and is a FIFO, device or socket (reading it could hang)."""
    kind = special_file_kind(path)
    if kind is not None:
        raise WorkbenchError(f"{path}: is {kind}, not a regular file.", expected=expected)


def _check_writable_parent(label: str, path: Path) -> None:
    ancestor = path.parent if str(path.parent) else Path(".")
    while not ancestor.exists():
        if ancestor.is_symlink():  # dangling link
            break
        if ancestor.parent == ancestor:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise WorkbenchError(
            f"{label} {path}: {ancestor} is not a directory, so nothing can be written there.",
            expected="an output path inside a writable folder",
        )
    # a probe file tells the truth (read-only mounts, ACLs, root on read-only filesystems)
    try:
        fd, probe = tempfile.mkstemp(prefix=".workbench-write-probe.", suffix=".tmp", dir=ancestor)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise WorkbenchError(
            f"{label} {path}: the folder {ancestor} is not writable ({error.strerror or error}).",
            expected="an output path inside a writable folder",
        ) from None


def validate_outputs(
    outputs: Mapping[str, str | os.PathLike[str] | None] | Iterable[tuple[str, str | os.PathLike[str] | None]],
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    directories: Iterable[str] = (),
    overwrite: bool = False,
    is_ours: Callable[[Path], bool] | None = None,
    ours: str = "a bundle written by `workbench export`",
) -> None:
    """Check every output path of a command before it does any work; raise :class:`WorkbenchError` otherwise.

    ``outputs`` maps an option label (``-o``, ``--html``) to a path (``None`` = not given). Labels listed in
    ``directories`` are directory outputs (an export bundle): an existing one is refused unless ``overwrite`` and
    ``is_ours(path)`` says it is recognisably ours. File outputs may not be existing directories. Every output's
    folder must be writable; no output may be the same file as an input, lie inside an input folder, or be given
    twice.
    """
    items = list(outputs.items()) if isinstance(outputs, Mapping) else list(outputs)
    dir_labels = set(directories)
    input_paths = [Path(p) for p in inputs if p not in (None, "")]
    seen: list[tuple[str, Path]] = []
    for label, value in items:
        if value is None or value == "":
            continue
        path = Path(value)
        text = str(value)
        if "\x00" in text:
            raise WorkbenchError(f"{label} {text!r}: contains a NUL byte.", expected="a file path")
        long_parts = [part for part in path.parts if len(os.fsencode(part)) > 255]
        if long_parts:  # the filesystem would refuse it (ENAMETOOLONG) at the first stat
            raise WorkbenchError(
                f"{label} {text[:80]}…: a path component is {len(os.fsencode(long_parts[0]))} bytes long.",
                expected="file and folder names of at most 255 bytes",
            )
        if label in dir_labels:
            if path.exists() or path.is_symlink():
                if not path.is_dir() or path.is_symlink():
                    raise WorkbenchError(
                        f"{label} {path}: exists and is not a folder.", expected="a new folder to create"
                    )
                if not overwrite:
                    raise WorkbenchError(
                        f"{label} {path}: already exists.",
                        expected="a new directory",
                        hint="use --overwrite to replace an earlier bundle",
                    )
                if is_ours is not None and not is_ours(path):
                    raise WorkbenchError(
                        f"{label} {path}: exists and is not {ours}; --overwrite replaces only that, never a "
                        "folder with other files.",
                        expected=f"a new directory, or {ours}",
                    )
        else:
            if path.is_dir():
                raise WorkbenchError(
                    f"{label} {path}: is a directory.", expected="a file path (e.g. add a file name to the folder)"
                )
            if text.endswith(("/", os.sep)):
                raise WorkbenchError(f"{label} {path}: ends with a path separator.", expected="a file path")
            kind = special_file_kind(path)
            if kind is not None:  # renaming our temp file over it would replace the pipe or device
                raise WorkbenchError(
                    f"{label} {path}: is {kind}, not a regular file; writing the output would replace it.",
                    expected="a path to a regular file or a new file",
                )
        _check_writable_parent(label, path)
        for source in input_paths:
            if _same_file(path, source):
                raise WorkbenchError(
                    f"{label} {path}: is the input {source}; writing it would destroy the input.",
                    expected="an output path different from every input",
                )
            if source.is_dir() and _inside(path, source):
                raise WorkbenchError(
                    f"{label} {path}: lies inside the input folder {source}.",
                    expected="an output outside the input folders",
                )
            if label in dir_labels and path.exists() and _inside(source, path):
                raise WorkbenchError(
                    f"{label} {path}: contains the input {source}; replacing it would delete the input.",
                    expected="an output directory that holds no input",
                )
        for other_label, other in seen:
            if _same_file(path, other):
                raise WorkbenchError(
                    f"{label} {path}: is also given as {other_label}.", expected="a different path for each output"
                )
        seen.append((label, path))


# --- JSON ---------------------------------------------------------------------------------------------------


def json_safe(value: object) -> object:
    """``value`` with NaN/±Infinity replaced by ``None`` and numpy scalars/arrays and paths made plain."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {(k if isinstance(k, str) else str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    if np is not None:
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return json_safe(float(value))
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.ndarray):
            return json_safe(value.tolist())
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dumps_json(obj: object, *, indent: int | None = 2) -> str:
    """Strict JSON text (no NaN/Infinity tokens: non-finite numbers become null)."""
    return json.dumps(json_safe(obj), indent=indent, sort_keys=False, allow_nan=False)


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def write_json_atomic(target: str | os.PathLike[str], obj: object) -> Path:
    return write_text_atomic(target, dumps_json(obj) + "\n")


def _json_depth_ok(value: object, limit: int) -> bool:
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in item)
    return True


def _reject_constant(token: str) -> NoReturn:
    raise ValueError(f"{token} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """An object with a key given twice is ambiguous (json keeps the last silently): refuse it."""
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def loads_json(
    text: str | bytes, *, where: str, what: str, max_depth: int = MAX_JSON_DEPTH, allow_nan: bool = False
) -> Any:
    """Parse JSON text, raising :class:`WorkbenchError` naming ``where`` for bad syntax, NaN tokens or deep nesting."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        # parse_constant=None is json's default (NaN/Infinity accepted)
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=None if allow_nan else _reject_constant)
    except UnicodeDecodeError as error:
        raise WorkbenchError(f"{where}: not UTF-8 text ({error.reason}).", expected=what) from None
    except RecursionError:
        raise WorkbenchError(
            f"{where}: JSON nested too deeply.", expected=f"{what}, nested at most {max_depth} levels"
        ) from None
    except ValueError as error:  # JSONDecodeError is a ValueError
        raise WorkbenchError(f"{where}: not valid JSON ({error}).", expected=what) from None
    if not _json_depth_ok(data, max_depth):
        raise WorkbenchError(
            f"{where}: JSON nested deeper than {max_depth} levels.", expected=f"{what}, nested at most {max_depth}"
        )
    return data


def read_json(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    allow_nan: bool = False,
) -> Any:
    """Read a JSON file with size and depth limits; every failure is a :class:`WorkbenchError` naming the file."""
    path = Path(path)
    if path.is_dir():
        raise WorkbenchError(f"{path}: is a directory.", expected=what)
    refuse_special_file(path, expected=what)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise WorkbenchError(f"{path}: no such file.", expected=what) from None
    except OSError as error:
        raise WorkbenchError(f"{path}: cannot be read ({error.strerror}).", expected=what) from None
    if size > max_bytes:
        raise WorkbenchError(f"{path}: {size} bytes is above the {max_bytes}-byte limit for JSON.", expected=what)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise WorkbenchError(f"{path}: cannot be read ({error.strerror}).", expected=what) from None
    return loads_json(raw, where=str(path), what=what, max_depth=max_depth, allow_nan=allow_nan)


# --- digests ------------------------------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(chunk)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
