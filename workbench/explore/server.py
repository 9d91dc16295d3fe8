"""One Model Explorer server per Python process (a Jupyter kernel), on 127.0.0.1 and a free port.

The server is the stock ``model_explorer`` Flask app (its web assets ship inside the wheel; no network), started in a
child process the first time it is needed and reused by every later call. It loads our graphs and node data as
files, by path, through its own JSON loader, exactly as the stock ``model-explorer`` command would. It stops when
this process exits (``atexit``), and, should this process be killed, the child notices its parent is gone and exits
by itself.

``python -m workbench.explore.server --port P --parent PID`` is the child's entry point.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import socket
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

from workbench.errors import WorkbenchError

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def healthy(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/check_health", timeout=timeout) as response:
            return bool(response.read() == b"model_explorer_ok")
    except OSError:
        return False


@dataclass
class ExplorerServer:
    """A running Model Explorer server this process owns."""

    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    host: str = HOST

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None and healthy(self.port, self.host)

    def url(
        self,
        models: Sequence[str | Path],
        *,
        node_data: Sequence[str | Path] = (),
        node_data_targets: Sequence[str] = (),
        ui_state: Mapping[str, Any] | None = None,
        sync_mode: str | None = None,
    ) -> str:
        """The page URL that opens ``models`` (graphs JSON paths) with node-data files applied."""
        return page_url(
            self.base_url,
            models,
            node_data=node_data,
            node_data_targets=node_data_targets,
            ui_state=ui_state,
            sync_mode=sync_mode,
        )

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
    ui_state: Mapping[str, Any] | None = None,
    sync_mode: str | None = None,
) -> str:
    """Model Explorer's ``?data=`` URL (the format its web app decodes: models, nodeData, nodeDataTargets, uiState,
    sync) for graphs JSON files given by absolute path."""
    data: dict[str, Any] = {"models": [{"url": str(Path(m).resolve()), "converterId": "builtin_json"} for m in models]}
    if node_data:
        data["nodeData"] = [str(Path(p).resolve()) for p in node_data]
        data["nodeDataTargets"] = list(node_data_targets) or [""] * len(node_data)
    if ui_state:
        data["uiState"] = dict(ui_state)
    if sync_mode:
        data["sync"] = {"mode": sync_mode}
    return f"{base_url}/?data={quote(json.dumps(data, separators=(',', ':')))}&renderer=webgl&show_open_in_new_tab=1"


_LOCK = threading.Lock()
_SERVER: ExplorerServer | None = None


def get_server() -> ExplorerServer:
    """This process's server: started on first use (a few seconds), reused afterwards, restarted if it died."""
    global _SERVER
    with _LOCK:
        if _SERVER is not None and _SERVER.alive():
            return _SERVER
        if _SERVER is not None:
            _SERVER.stop()
        _SERVER = _start()
        return _SERVER


def stop_server() -> None:
    global _SERVER
    with _LOCK:
        if _SERVER is not None:
            _SERVER.stop()
            _SERVER = None


atexit.register(stop_server)


def _start() -> ExplorerServer:
    try:
        import model_explorer  # noqa: F401
    except ImportError as error:
        raise WorkbenchError(
            "Model Explorer is not installed.", expected="the ai-edge-model-explorer package (a runtime dependency)"
        ) from error
    workdir = Path(tempfile.mkdtemp(prefix="workbench-explore-"))
    port = free_port()
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench.explore.server", "--port", str(port), "--parent", str(os.getpid())],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if healthy(port):
            return ExplorerServer(port, process, workdir)
        time.sleep(0.1)
    process.kill()
    text = (workdir / "server.log").read_text(errors="replace")[-800:]
    raise WorkbenchError(
        f"the Model Explorer server did not start on {HOST}:{port} within {START_TIMEOUT_S:.0f} s.",
        expected="`python -m workbench.explore.server` to answer /check_health",
        hint=f"its log ends: {text}",
    )


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent, 0)
        except OSError:  # the owning process is gone: stop serving
            os._exit(0)


def _serve_with_embed_script(server: Any) -> None:
    """index.html with the explorer's embed script (info panels collapsed inside an IFrame) before ``</head>``."""
    import flask

    from workbench.explore.embed import EMBED_SCRIPT

    stock = server._serve_static_asset

    def serve(rel_path: str) -> Any:
        if rel_path != "index.html":
            return stock(rel_path)
        page = (Path(server.OSS_WEB_APP_DIR) / "index.html").read_text(encoding="utf-8")
        return flask.Response(page.replace("</head>", EMBED_SCRIPT + "</head>", 1), mimetype="text/html")

    server._serve_static_asset = serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Model Explorer server owned by a workbench process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args(argv)
    if args.parent:
        threading.Thread(target=_watch_parent, args=(args.parent,), daemon=True).start()
    from model_explorer import server

    # the stock server checks PyPI for a newer version in a thread; offline that only fails, so skip it
    def no_version_check(print_msg: bool = True) -> dict[str, str]:
        from importlib.metadata import version

        running = version("ai-edge-model-explorer")
        return {"version": "", "runningVersion": running, "releaseUrl": "", "desktopAppUrl": ""}

    server._check_new_version = no_version_check  # type: ignore[attr-defined]
    _serve_with_embed_script(server)
    server.start(host=HOST, port=args.port, no_open_in_browser=True, extensions=[])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
