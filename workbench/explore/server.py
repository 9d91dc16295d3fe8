"""One Model Explorer server per Python process (a Jupyter kernel), on 127.0.0.1, behind our own gate.

The server is the stock ``model_explorer`` Flask app (its web assets ship inside the wheel; no network), started in a
child process the first time it is needed and reused by every later call. Inside the child, the app is wrapped in
:class:`workbench.explore.gate.ExplorerGate` (a WSGI middleware): a per-session random token on the page and every
API call, the Host header checked against our own address (DNS rebinding), only the endpoints the viewer needs, file
reads only under this session's folder, no uploads, no request bodies.

The child binds a free port itself and reports it through a file in the session folder (no window in which another
process can take the port), and the parent checks it with a health challenge only the token's holder can answer.
Graphs and node data live in one session folder per process (``workbench-explore-<pid>-*`` in the temp folder),
removed when this process exits (atexit, SIGTERM, SIGINT); should this process be killed outright, the child notices
its parent is gone, removes the folder and exits, and the next session sweeps folders whose process is gone.

``python -m workbench.explore.server --session DIR --parent PID`` is the child's entry point (the token comes in the
environment, never on the command line, where any local user could read it).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hmac
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from workbench._io import _pid_alive
from workbench.errors import WorkbenchError
from workbench.explore.gate import HEALTH_PATH, TOKEN_PARAM, health_answer

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
TOKEN_ENV = "WORKBENCH_EXPLORE_TOKEN"
SESSION_PREFIX = "workbench-explore-"
SESSION_MARKER = ".workbench-explore-session"
PAGES = "pages"  # the only folder the server reads files from
PORT_FILE = "server.port"
MAX_REQUEST_BYTES = 1024 * 1024  # Flask's own cap, behind the gate's "no body at all"


# --- the session folder ---------------------------------------------------------------------------------------

_SESSION_LOCK = threading.Lock()
_SESSION: Path | None = None
_SESSION_NAME = re.compile(rf"^{re.escape(SESSION_PREFIX)}(?P<pid>\d+)-[A-Za-z0-9_]+$")


def sweep_stale_sessions(folder: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove session folders left by killed processes: ours by name and marker, owned by this user, pid gone."""
    removed = []
    base = Path(folder or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            match = _SESSION_NAME.match(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                owner = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            marker = Path(entry.path) / SESSION_MARKER
            if owner != os.getuid() or not marker.is_file() or marker.is_symlink():
                continue
            if not _pid_alive(int(match.group("pid"))):  # (this process's own pid counts as alive)
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
    return removed


def session_folder() -> Path:
    """This process's explorer folder (created on first use, removed at exit); pages are written under ``pages/``."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is not None and (_SESSION / PAGES).is_dir():
            return _SESSION
        from workbench._io import install_cleanup_handlers, register_temp

        sweep_stale_sessions()
        install_cleanup_handlers()  # SIGTERM/SIGINT and atexit remove registered temp folders
        _SESSION = Path(tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-"))
        register_temp(_SESSION)
        (_SESSION / SESSION_MARKER).write_text(f"pid {os.getpid()}\n", encoding="utf-8")
        (_SESSION / PAGES).mkdir()
        return _SESSION


def pages_folder() -> Path:
    return session_folder() / PAGES


def remove_session_folder() -> None:
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is not None:
            shutil.rmtree(_SESSION, ignore_errors=True)
            _SESSION = None


# --- health --------------------------------------------------------------------------------------------------


def healthy(port: int, token: str, host: str = HOST, timeout: float = 1.0) -> bool:
    """True when the server on ``port`` proves it holds ``token`` (answers the HMAC of a fresh nonce); the token
    itself is never sent, so a process squatting on the port learns nothing."""
    nonce = secrets.token_hex(16)
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{HEALTH_PATH}?nonce={nonce}", timeout=timeout) as response:
            answer = response.read(200).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        return False
    return hmac.compare_digest(answer.encode("ascii", "replace"), health_answer(token, nonce).encode("ascii"))


@dataclass
class ExplorerServer:
    """A running Model Explorer server this process owns."""

    port: int
    process: subprocess.Popen[bytes]
    session: Path
    token: str
    host: str = HOST

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def root(self) -> Path:
        """The only folder the server reads files from."""
        return self.session / PAGES

    def alive(self) -> bool:
        return self.process.poll() is None and healthy(self.port, self.token, self.host)

    def url(
        self,
        models: Sequence[str | Path],
        *,
        node_data: Sequence[str | Path] = (),
        node_data_targets: Sequence[str] = (),
        ui_state: Mapping[str, object] | None = None,
        sync_mode: str | None = None,
    ) -> str:
        """The page URL (with this session's token) that opens ``models`` (graphs JSON) with node-data files applied.
        Files outside the session folder are copied into it first: the server reads nothing else."""
        return page_url(
            self.base_url,
            [self.served_copy(m) for m in models],
            node_data=[self.served_copy(p) for p in node_data],
            node_data_targets=node_data_targets,
            ui_state=ui_state,
            sync_mode=sync_mode,
            token=self.token,
        )

    def served_copy(self, path: str | Path) -> Path:
        import hashlib

        from workbench._io import write_bytes_atomic

        source = Path(path).resolve()
        root = self.root.resolve()
        if root in source.parents:
            return source
        folder = root / "imported" / hashlib.sha256(str(source.parent).encode()).hexdigest()[:16]
        folder.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(folder / source.name, source.read_bytes())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def page_url(
    base_url: str,
    models: Sequence[str | Path],
    *,
    node_data: Sequence[str | Path] = (),
    node_data_targets: Sequence[str] = (),
    ui_state: Mapping[str, object] | None = None,
    sync_mode: str | None = None,
    token: str = "",
) -> str:
    """Model Explorer's ``?data=`` URL (the format its web app decodes: models, nodeData, nodeDataTargets, uiState,
    sync) for graphs JSON files given by absolute path, with the session token our gate wants."""
    data: dict[str, object] = {
        "models": [{"url": str(Path(m).resolve()), "converterId": "builtin_json"} for m in models]
    }
    if node_data:
        data["nodeData"] = [str(Path(p).resolve()) for p in node_data]
        data["nodeDataTargets"] = list(node_data_targets) or [""] * len(node_data)
    if ui_state:
        data["uiState"] = dict(ui_state)
    if sync_mode:
        data["sync"] = {"mode": sync_mode}
    query = f"data={quote(json.dumps(data, separators=(',', ':')))}&renderer=webgl&show_open_in_new_tab=1"
    return f"{base_url}/?{TOKEN_PARAM}={token}&{query}" if token else f"{base_url}/?{query}"


_LOCK = threading.Lock()
_SERVER: ExplorerServer | None = None
_STARTING: threading.Thread | None = None  # a start begun by start_server_in_background, until it has run


def get_server() -> ExplorerServer:
    """This process's server: started on first use (a few seconds), reused afterwards, restarted if it died."""
    global _SERVER
    with _LOCK:
        # alive, and serving this process's session folder (one removed under it is made anew: restart there)
        if _SERVER is not None and _SERVER.alive() and _SERVER.session == session_folder():
            return _SERVER
        if _SERVER is not None:
            _SERVER.stop()
        _SERVER = _start()
        return _SERVER


def start_server_in_background() -> None:
    """Start this process's server on a thread, so that it comes up while the graphs are being written (the page's
    URL, asked for afterwards, waits for it); errors surface when the URL is asked for."""

    global _STARTING

    def start() -> None:
        with contextlib.suppress(Exception):
            get_server()

    if _SERVER is None or _SERVER.process.poll() is not None:
        _STARTING = threading.Thread(target=start, name="workbench-explore-server-start", daemon=True)
        _STARTING.start()


def stop_server() -> None:
    """Stop this process's server, a start still under way included (it would otherwise come up after the stop,
    in a session folder of its own, and serve the next page from there)."""
    global _SERVER
    starting = _STARTING
    if starting is not None and starting is not threading.current_thread():
        starting.join(START_TIMEOUT_S + 5)
    with _LOCK:
        if _SERVER is not None:
            _SERVER.stop()
            _SERVER = None


def _at_exit() -> None:
    stop_server()
    remove_session_folder()


atexit.register(_at_exit)


def _start() -> ExplorerServer:
    import importlib.util

    # find_spec, not import: importing model_explorer here would import torch into this process for nothing
    if importlib.util.find_spec("model_explorer") is None:
        raise WorkbenchError(
            "Model Explorer is not installed.", expected="the ai-edge-model-explorer package (a runtime dependency)"
        )
    session = session_folder()
    state = Path(tempfile.mkdtemp(prefix="server-", dir=session))  # log and port file, outside pages/
    token = secrets.token_hex(32)
    log = (state / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench.explore.server", "--session", str(session), "--state", str(state)]
        + ["--parent", str(os.getpid())],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", TOKEN_ENV: token},
    )
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    port = None
    while time.monotonic() < deadline and process.poll() is None:
        if port is None:
            with contextlib.suppress(OSError, ValueError):
                port = int((state / PORT_FILE).read_text(encoding="ascii").strip())
        if port is not None and healthy(port, token):
            return ExplorerServer(port, process, session, token)
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=5)
    text = (state / "server.log").read_text(errors="replace")[-800:]
    raise WorkbenchError(
        f"the Model Explorer server did not start on {HOST}:{port or '(no port yet)'} within {START_TIMEOUT_S:.0f} s.",
        expected="`python -m workbench.explore.server` to answer our health challenge",
        hint=f"its log ends: {text}",
    )


# --- the child ---------------------------------------------------------------------------------------------------


def _watch_parent(parent: int, session: Path) -> None:
    while True:
        time.sleep(1.0)
        if not _pid_alive(parent):  # the owning process is gone (killed): its atexit never ran
            shutil.rmtree(session, ignore_errors=True)
            os._exit(0)


def _gated_flask_module(token: str, root: Path, state: Path) -> object:
    """A stand-in for the ``flask`` module inside ``model_explorer.server`` whose ``Flask`` app, when run, serves
    through our gate on a port it binds itself and reports in ``state/server.port``."""
    import flask
    from werkzeug.serving import make_server

    from workbench._io import write_text_atomic
    from workbench.explore.gate import ExplorerGate

    class GatedFlask(flask.Flask):
        def run(self, host: str | None = None, port: int | None = None, **options: object) -> None:  # type: ignore[override]
            import model_explorer.server as stock

            self.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
            self.config["MAX_FORM_MEMORY_SIZE"] = MAX_REQUEST_BYTES
            gate = ExplorerGate(self, token=token, root=root, web_app_dir=Path(stock.OSS_WEB_APP_DIR))
            httpd = make_server(HOST, 0, gate, threaded=True)
            gate.port = int(httpd.server_port)
            write_text_atomic(state / PORT_FILE, f"{gate.port}\n")
            httpd.serve_forever()

    class FlaskModule:
        Flask = GatedFlask

        def __getattr__(self, name: str) -> Any:
            return getattr(flask, name)

    return FlaskModule()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Model Explorer server owned by a workbench process, behind a gate")
    parser.add_argument("--session", type=Path, required=True, help="the owner's session folder (pages/ is served)")
    parser.add_argument("--state", type=Path, required=True, help="where the bound port is reported")
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    if len(token) < 32:
        parser.error(f"{TOKEN_ENV} must hold the session token")
    if args.parent:
        threading.Thread(target=_watch_parent, args=(args.parent, args.session), daemon=True).start()
    # model_explorer imports torch when it can (for its PyTorch adapter, which this server never uses): that import
    # was most of the server's start (7 of 8.6 s on a loaded 2-core machine); None in sys.modules makes its
    # `try: import torch` take the no-torch branch
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    from model_explorer import server

    # the stock server checks PyPI for a newer version in a thread; offline that only fails, so skip it
    def no_version_check(print_msg: bool = True) -> dict[str, str]:
        from importlib.metadata import version

        running = version("ai-edge-model-explorer")
        return {"version": "", "runningVersion": running, "releaseUrl": "", "desktopAppUrl": ""}

    server._check_new_version = no_version_check  # type: ignore[attr-defined]
    server.flask = _gated_flask_module(token, args.session / PAGES, args.state)  # type: ignore[attr-defined]
    # port 0: our GatedFlask.run binds a free port itself; the stock start-up probe would be refused by the gate
    server.start(host=HOST, port=0, no_open_in_browser=True, extensions=[], skip_health_check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
