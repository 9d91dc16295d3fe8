"""Real-browser test: JupyterLab on 127.0.0.1 with a token, Debian's Chromium driven by Playwright.

Opens the quickstart notebook, runs all cells, moves the streams slider and the precision dropdown, checks that
the panel's outputs updated, and saves screenshots under test-artifacts/ (copied to docs/img/ for the README when
WORKBENCH_UPDATE_DOCS_IMG=1).
Skipped only where Chromium or the playwright package is missing (``make test`` installs both).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts"
DOCS_IMG = REPO / "docs" / "img"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def jupyter_lab(tmp_path: Path):
    """A JupyterLab server on a copy of the quickstart notebook; yields (base url, token)."""
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(REPO / "notebooks" / "00_quickstart.ipynb", root)
    config = tmp_path / "jupyter-config" / "labconfig"
    config.mkdir(parents=True)
    # no news/update prompts: they would cover the panel in screenshots (and try to reach the network)
    (config / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    # render every cell (no windowing), so the panel stays in the DOM while later cells run
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
    )
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _panel_text(page) -> str:
    return page.locator(".workbench-quickstart-panel").inner_text()


def _wait_status(page, fragment: str, timeout_ms: int = 120_000) -> None:
    page.wait_for_function(
        "(text) => { const p = document.querySelector('.workbench-quickstart-panel');"
        " return p !== null && p.innerText.includes(text); }",
        arg=fragment,
        timeout=timeout_ms,
    )


def _screenshot(page, path: Path) -> None:
    """The panel from its top edge down to the bottom of the window (tall figures scroll inside the notebook)."""
    panel = page.locator(".workbench-quickstart-panel")
    panel.evaluate("element => element.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    box = panel.bounding_box()
    height = min(box["height"], page.viewport_size["height"] - box["y"] - 30)  # minus JupyterLab's status bar
    page.screenshot(path=str(path), clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": height})


def _open_tab(page, title: str) -> None:
    page.locator(".workbench-quickstart-panel .lm-TabBar-tab", has_text=title).first.click()


def test_quickstart_notebook_in_chromium(jupyter_lab, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="python package playwright missing (pip install -e '.[dev]')"
    )
    base, token = jupyter_lab
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.monotonic()
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            page.goto(f"{base}/lab/tree/00_quickstart.ipynb?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-StatusBar-Widget') !== null && "
                "document.body.innerText.includes('| Idle')",
                timeout=90_000,
            )
            for attempt in range(3):  # a Run All sent while the kernel connection settles can be dropped: retry
                page.click(".lm-MenuBar-itemLabel:text-is('Run')")
                page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
                try:
                    page.wait_for_function(
                        "() => [...document.querySelectorAll('.jp-InputArea-prompt')]"
                        ".some(e => /\\[(\\*|\\d+)\\]/.test(e.innerText))",
                        timeout=20_000,
                    )
                    break
                except sync_api.TimeoutError:
                    if attempt == 2:
                        raise
            page.wait_for_selector(".workbench-quickstart-panel", state="attached", timeout=150_000)
            _wait_status(page, "done: 11 stages complete")
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                ".some(e => e.innerText.includes('report: '))",
                timeout=120_000,
            )
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            tracebacks = [text for text in errors.all_inner_texts() if "Traceback" in text or "Error" in text]
            assert not tracebacks, tracebacks
            panel = page.locator(".workbench-quickstart-panel")
            panel.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            assert "int8 engine" in _panel_text(page)
            _screenshot(page, ARTIFACTS / "quickstart-panel.png")

            # streams slider: type into its readout, as a user would after dragging
            _open_tab(page, "Timing")
            page.wait_for_function(
                "() => document.querySelector('.workbench-quickstart-panel').innerText"
                ".includes('2 stream(s) x batch 8')",
                timeout=30_000,
            )
            slider = panel.locator(".widget-slider", has_text="streams")
            readout = slider.locator(".widget-readout")
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type("4")
            page.keyboard.press("Enter")
            _wait_status(page, "4 stream(s) x batch 8", 120_000)
            _wait_status(page, "done: 11 stages complete")
            assert "4 stream(s) x batch 8" in _panel_text(page)
            _screenshot(page, ARTIFACTS / "quickstart-timing-4-streams.png")

            # precision dropdown: FP16 builds the FP16 engine and re-times it
            panel.locator(".widget-dropdown", has_text="precision").locator("select").select_option(label="FP16")
            _open_tab(page, "Stages")
            _wait_status(page, "fp16 engine", 120_000)
            _wait_status(page, "done: 11 stages complete")
            _open_tab(page, "Task metric")
            _wait_status(page, "\u25b6 fp16", 30_000)
            _open_tab(page, "Fusion")
            _wait_status(page, "fp16.engine", 30_000)
            _screenshot(page, ARTIFACTS / "fusion-view-ocr-cls.png")

            # model picker: the small digits CNN re-runs every stage; its fusion view is small enough to read whole
            panel.locator(".widget-dropdown", has_text="model").locator("select").select_option(label="digits-cnn")
            _open_tab(page, "Stages")
            _wait_status(page, "digits-cnn.fp16.engine", 150_000)
            _wait_status(page, "done: 11 stages complete")
            _open_tab(page, "Fusion")
            _wait_status(page, "digits-cnn.fp16.engine", 30_000)
            time.sleep(1.0)  # let plotly finish laying out before the screenshot
            _screenshot(page, ARTIFACTS / "fusion-view.png")
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser-test-failure.png"), full_page=True)
            raise
        finally:
            context.close()
    seconds = time.monotonic() - started
    (ARTIFACTS / "browser-test-seconds.txt").write_text(f"{seconds:.1f}\n")
    for name in ("quickstart-panel.png", "fusion-view.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000
    # The README's screenshots come from this test, but a test run must not rewrite tracked files:
    # refresh them on purpose with WORKBENCH_UPDATE_DOCS_IMG=1.
    if os.environ.get("WORKBENCH_UPDATE_DOCS_IMG") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for name in ("quickstart-panel.png", "fusion-view.png"):
            shutil.copy(ARTIFACTS / name, DOCS_IMG / name)


def test_report_renders_offline_in_chromium(tmp_path: Path) -> None:
    """out/report.html draws every chart from a file:// URL with all network requests refused."""
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="python package playwright missing (pip install -e '.[dev]')"
    )
    from workbench.flow import QuickstartConfig, run_quickstart
    from workbench.report import write_report

    run = run_quickstart(
        QuickstartConfig(
            model="digits-cnn",
            out_dir=str(tmp_path / "out"),
            timing_window_s=0.1,
            calibration_samples=64,
            diff_samples=16,
        )
    )
    report = write_report(run, tmp_path / "out" / "report.html")
    ARTIFACTS.mkdir(exist_ok=True)
    refused: list[str] = []
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 900},
            offline=True,
        )
        try:

            def refuse(route) -> None:
                if not route.request.url.startswith("file://"):
                    refused.append(route.request.url)
                    route.abort()
                else:
                    route.continue_()

            context.route("**/*", refuse)
            page = context.new_page()
            page.goto(report.as_uri())
            page.wait_for_function(
                "() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5", timeout=30_000
            )
            drawn = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(e => e.id)")
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            context.close()
    assert {"fig-cleaning", "fig-fusion", "fig-layer-diff", "fig-metrics", "fig-timing"} <= set(drawn), drawn
    assert refused == [], refused
