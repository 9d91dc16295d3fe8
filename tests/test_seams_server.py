"""Issue 23, the explorer server: a real Model Explorer server behind our gate, probed with real HTTP requests, and
the viewer still drawing in Chromium. Each refusal here was answered by the stock server before the gate."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from test_browser import POLL_MS

from workbench.engine import engine_for_model

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--enable-unsafe-swiftshader", "--no-sandbox", "--use-angle=swiftshader"]
REPO = Path(__file__).resolve().parents[1]


def _request(port: int, path: str, *, host: str | None = None, headers=None, data=None, method=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {}, method=method)
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _session_of(url: str) -> tuple[int, str, Path]:
    """Port, token and session folder named by a page URL (the graphs JSON lies in the session's pages/)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    data = json.loads(query["data"][0])
    graph = Path(data["models"][0]["url"])
    session = next(p for p in graph.parents if p.name.startswith("workbench-explore-"))
    return int(parts.port), query["workbench_token"][0], session


def _multipart(name: str, payload: bytes) -> tuple[bytes, dict[str, str]]:
    boundary = "workbenchboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def _probe_refusals(port: int, token: str, page_path: str, own_file: Path, outside: Path) -> None:
    """Everything the stock server answered is refused; what the viewer needs still works with the token."""
    auth = {"X-Workbench-Token": token}
    # the file read of a file outside the session folder (stock: returned /etc/passwd or any file)
    status, body = _request(port, f"/api/v1/read_text_file?path={outside}", headers=auth)
    assert status == 403 and b"outside" in body and outside.read_bytes()[:20] not in body
    # ... also through a symbolic link inside the session folder that points out of it
    link = own_file.parent / "link-out.json"
    link.symlink_to(outside)
    status, body = _request(port, f"/api/v1/read_text_file?path={link}", headers=auth)
    assert status == 403 and b"outside" in body
    # a foreign Host header (DNS rebinding: a page on attacker.example resolving to 127.0.0.1)
    status, body = _request(port, page_path, host=f"attacker.example:{port}")
    assert status == 403 and b"Host" in body
    # the upload (stock: wrote an unbounded file into a temp folder nobody removed)
    data, headers = _multipart("evil.bin", b"x" * 4096)
    status, _ = _request(port, "/apipost/v1/upload", headers={**headers, **auth}, data=data)
    assert status == 405
    # a request without the token: the page, a file read of our own file, an API call
    for path in ("/", f"/api/v1/read_text_file?path={own_file}", "/api/v1/get_extensions", "/check_health"):
        status, body = _request(port, path)
        assert status == 403 and b"token" in body, (path, status, body[:200])
    # a wrong token
    status, _ = _request(port, f"/api/v1/read_text_file?path={own_file}", headers={"X-Workbench-Token": "0" * 64})
    assert status == 403
    # endpoints the viewer does not need are gone even with the token
    for path in ("/api/v1/send_command?json={}", "/api/v1/load_graphs_json?graph_index=0", "/apipost/v1/update_config"):
        assert _request(port, path, headers=auth)[0] == 404, path
    assert _request(port, "/apistream/server_director", headers=auth) == (204, b"")  # the push channel: closed
    # a body on a GET (request size capped: no body at all)
    assert _request(port, "/api/v1/get_extensions", headers=auth, data=b"x" * 10, method="GET")[0] == 413
    # a query far above any page URL (ours are a few KB): refused before any handler parses it
    assert _request(port, "/api/v1/get_extensions?x=" + "a" * 300_000, headers=auth)[0] == 414
    # what the viewer needs works with the token
    status, body = _request(port, page_path)
    assert status == 200 and b"X-Workbench-Token" in body
    status, body = _request(port, f"/api/v1/read_text_file?path={own_file}", headers=auth)
    assert status == 200 and json.loads(body)["content"] == own_file.read_text(encoding="utf-8")
    assert _request(port, "/static_files/favicon.svg")[0] == 200  # the wheel's public assets need no token


def test_the_gate_refuses_foreign_reads_hosts_uploads_and_tokenless_requests(tmp_path: Path) -> None:
    import workbench
    from workbench.explore.server import get_server, healthy, remove_session_folder, stop_server

    stop_server()  # this worker's server and session as a new process has them (earlier tests ran explorers here)
    remove_session_folder()
    fp32 = engine_for_model("digits-cnn", "fp32", tmp_path)
    explorer = workbench.explore(fp32)
    server = get_server()
    port, token, session = _session_of(explorer.url)
    assert (port, token) == (server.port, server.token) and len(token) >= 64
    assert healthy(server.port, token) and not healthy(server.port, "f" * 64)
    assert explorer.graph_files[0].resolve().is_relative_to(session / "pages")
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the browser\n", encoding="utf-8")
    page_path = explorer.url.split(f":{port}", 1)[1]
    _probe_refusals(port, token, page_path, explorer.graph_files[0], outside)
    # an explorer written to a folder of the user's choice is served from a copy inside the session folder
    from workbench.explore.explorer import build_explorer

    other = build_explorer(fp32, directory=tmp_path / "mine")
    served = Path(json.loads(parse_qs(urlsplit(other.url).query)["data"][0])["models"][0]["url"])
    assert served.is_relative_to(session / "pages") and served.read_bytes() == other.graph_files[0].read_bytes()
    # the token travels only in the environment, never on the child's command line (readable by any local user)
    cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    assert token.encode() not in cmdline


def test_cli_print_url_serves_until_ctrl_c_and_removes_its_session_folder(tmp_path: Path) -> None:
    engine = engine_for_model("digits-cnn", "fp32", tmp_path).engine_path
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench", "explore", str(engine), "--print-url"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        # a test run started in the background (`make test &`) hands its children SIGINT ignored, which the server
        # keeps (as any program does); the Ctrl-C a user presses in a terminal reaches a child with it at default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        url = process.stdout.readline().strip()
        assert re.match(r"^http://127\.0\.0\.1:\d+/\?workbench_token=[0-9a-f]{64}&data=", url), url
        port, token, session = _session_of(url)
        time.sleep(1.5)  # the stock --print-url stopped the server right after printing; ours keeps serving
        assert _request(port, url.split(f":{port}", 1)[1])[0] == 200
        assert session.is_dir()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err[-2000:]
    assert "digits-cnn.fp32" in err  # the summary goes to stderr with --print-url: stdout is the URL alone
    assert not session.exists(), "the session folder outlived the command"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/static_files/favicon.svg", timeout=3)


def test_the_viewer_still_renders_behind_the_gate_in_chromium(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="python package playwright missing")
    import workbench
    from workbench.explore.server import get_server

    explorer = workbench.explore(engine_for_model("digits-cnn", "fp32", tmp_path))
    server = get_server()
    refused: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 800})
            page.on("response", lambda r: refused.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(explorer.url)
            page.wait_for_function(
                "() => document.querySelectorAll('split-pane graph-panel canvas').length >= 2",
                timeout=90_000,
                polling=POLL_MS,
            )
            page.wait_for_function(
                "() => [...document.querySelectorAll('info-panel')]"
                ".filter(p => p.innerText.includes('NODE DATA PROVIDERS')).length >= 2",
                timeout=60_000,
                polling=POLL_MS,
            )
            body = page.inner_text("body")
            # the same page without the token shows nothing of ours
            tokenless = browser.new_page()
            response = tokenless.goto(explorer.url.replace(f"workbench_token={server.token}&", ""))
            tokenless_status, tokenless_text = response.status, tokenless.inner_text("body")
        finally:
            browser.close()
    assert "digits-cnn.fp32 ONNX" in body and "digits-cnn.fp32 engine" in body and "precision" in body
    # the viewer's own requests all passed the gate (nothing it needs was refused)
    ours = [line for line in refused if f"127.0.0.1:{server.port}" in line]
    assert not ours, ours
    assert tokenless_status == 403 and "token" in tokenless_text


def test_session_folders_of_killed_processes_are_swept_and_only_ours(tmp_path: Path) -> None:
    from workbench.explore.server import SESSION_MARKER, sweep_stale_sessions

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"workbench-explore-{dead_pid}-abc123"
    (stale / "pages").mkdir(parents=True)
    (stale / SESSION_MARKER).write_text("pid\n")
    unmarked = tmp_path / f"workbench-explore-{dead_pid}-xyz789"  # same name pattern, not made by us: kept
    unmarked.mkdir()
    (unmarked / "notes.txt").write_text("mine")
    live = tmp_path / f"workbench-explore-{os.getpid()}-def456"
    live.mkdir()
    (live / SESSION_MARKER).write_text("pid\n")
    assert sweep_stale_sessions(tmp_path) == [stale]
    assert not stale.exists() and (unmarked / "notes.txt").is_file() and live.is_dir()


def test_a_stop_during_a_background_start_leaves_no_server_and_a_removed_folder_means_a_new_one() -> None:
    """`workbench explore` stops the server and removes the session folder when it returns; a start still under way
    (begun while the graphs were written) used to come up after the stop, in a folder of its own, and serve the next
    page from there. And a server whose session folder was removed under it is restarted in the new one."""
    from workbench.explore import server as srv

    srv.stop_server()
    srv.remove_session_folder()
    srv.start_server_in_background()
    srv.stop_server()  # waits for the start under way, then stops what it started
    assert srv._SERVER is None and not srv._STARTING.is_alive()
    srv.remove_session_folder()
    first = srv.get_server()
    assert first.session == srv.session_folder() and first.alive()
    srv.remove_session_folder()  # under the live server (what the race above did)
    second = srv.get_server()
    assert second is not first and second.session == srv.session_folder() and second.session.is_dir()
    assert not first.alive() and second.alive()
    srv.stop_server()
