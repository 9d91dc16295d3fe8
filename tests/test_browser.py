"""Real-browser test: JupyterLab on 127.0.0.1 with a token, Debian's Chromium driven by Playwright.

Opens the quickstart notebook, runs all cells, moves the streams slider and the precision dropdown, checks that
the panel's outputs updated, and saves screenshots under test-artifacts/ (copied to docs/img/ for the README when
WORKBENCH_UPDATE_DOCS_IMG=1).
Skipped only where Chromium or the playwright package is missing (``make test`` installs both).
"""

from __future__ import annotations

import json
import os
import re
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
# Playwright's wait_for_function polls on every animation frame unless told otherwise: up to 60 times a second, each
# reading the innerText of every output, on the cores the kernel it waits for needs (2026-12-06, the notebook test
# alone, one run each: Chromium 135 -> 107 CPU-s, 205 -> 184 s; but runs of the same code here spread by 15 %).
POLL_MS = 250
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _browser(playwright, tmp_path: Path, viewport: dict | None = None, **options):
    """Headless Chromium with its own profile under ``tmp_path`` (the one browser every page test drives)."""
    return playwright.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"),
        executable_path=str(CHROMIUM),
        headless=True,
        args=CHROMIUM_ARGS,
        viewport=viewport or {"width": 1400, "height": 1000},
        **options,
    )


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
    for name in ("05_export",):  # a digits-cnn copy: the fast model keeps the export checks lean
        text = (REPO / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8")
        (root / f"{name}_digits.ipynb").write_text(_with_model(text, "digits-cnn", f"out/{name}"), encoding="utf-8")
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


def _with_model(notebook_text: str, model: str, out_dir: str) -> str:
    """The notebook with its MODEL setting set to ``model`` (the settings cell assigns DEFAULT_MODEL) and its output
    folder to ``out_dir``."""
    from notebook_runner import with_model

    notebook = json.loads(notebook_text)
    cell = next(c for c in notebook["cells"] if c["cell_type"] == "code" and "MODEL = (" in "".join(c["source"]))
    source = re.sub(
        r'^OUT_DIR = ".*"$', f"OUT_DIR = {out_dir!r}", with_model("".join(cell["source"]), model), flags=re.M
    )
    assert f"OUT_DIR = {out_dir!r}" in source, "no OUT_DIR setting in the cell"
    cell["source"] = source.splitlines(keepends=True)
    return json.dumps(notebook)


def _panel_text(page) -> str:
    return page.locator(".workbench-quickstart-panel").inner_text()


def _wait_status(page, fragment: str, timeout_ms: int = 120_000) -> None:
    page.wait_for_function(
        "(text) => { const p = document.querySelector('.workbench-quickstart-panel');"
        " return p !== null && p.innerText.includes(text); }",
        arg=fragment,
        timeout=timeout_ms,
        polling=POLL_MS,
    )


def _screenshot(page, path: Path) -> None:
    """The panel from its top edge down to the bottom of the window (tall figures scroll inside the notebook)."""
    panel = page.locator(".workbench-quickstart-panel")
    panel.evaluate("element => element.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    box = panel.bounding_box()
    height = min(box["height"], page.viewport_size["height"] - box["y"] - 30)  # minus JupyterLab's status bar
    page.screenshot(path=str(path), clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": height})


def _type_into(panel, label: str, value: str) -> None:
    """Type ``value`` into the text field described by ``label`` and press Enter."""
    field = panel.locator(".widget-text", has_text=label).locator("input")
    field.fill(value)
    field.press("Enter")


def _open_tab(page, title: str) -> None:
    page.locator(".workbench-quickstart-panel .lm-TabBar-tab", has_text=title).first.click()


# The visible figures of the quickstart panel: any note text left in them (a stale "model changed" note), and how
# many axis tick labels they draw (a note figure has none).
_FIGURE_NOTES = """() => {
  const plots = [...document.querySelectorAll('.workbench-quickstart-panel .js-plotly-plot')].filter(p => p.offsetParent !== null);
  const notes = plots.flatMap(p => [...p.querySelectorAll('.annotation-text')].map(e => e.textContent))
    .filter(t => /model changed|Stale|re-runs/i.test(t));
  const ticks = plots.reduce((n, p) => n + p.querySelectorAll('.xtick, .ytick').length, 0);
  return {plots: plots.length, notes: notes, ticks: ticks};
}"""


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
        context = _browser(
            playwright,
            tmp_path,
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
                "() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4",
                timeout=30_000,
                polling=POLL_MS,
            )
            drawn = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(e => e.id)")
            # the fusion view is a static SVG drawing of the engine: named layer boxes, laid out by the browser
            boxes = page.evaluate(
                "() => [...document.querySelectorAll('#fig-fusion svg g.layer')].filter(g => g.getBBox().width > 0).length"
            )
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            context.close()
    assert {"fig-cleaning", "fig-layer-diff", "fig-metrics", "fig-pareto", "fig-timing"} <= set(drawn), drawn
    assert boxes == len(run.fp32_engine.layer_map.layers) > 0
    assert refused == [], refused


def _run_all(page, sync_api) -> float:
    """Run All Cells (retried while the kernel connection settles); returns the time the click went out."""
    for attempt in range(3):
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        clicked = time.monotonic()
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        try:
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(e => /\\[(\\*|\\d+)\\]/.test(e.innerText))",
                timeout=20_000,
                polling=POLL_MS,
            )
            return clicked
        except sync_api.TimeoutError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _open_notebook(context, base: str, token: str, name: str):
    page = context.new_page()
    page.goto(f"{base}/lab/tree/{name}?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.wait_for_function(
        "() => document.querySelector('.jp-StatusBar-Widget') !== null && document.body.innerText.includes('| Idle')",
        timeout=90_000,
        polling=POLL_MS,
    )
    return page


def _progress_seconds(page, clicked: float) -> float:
    """Seconds from Run All until a progress bar with a message is visible."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('.workbench-progress')]"
        ".some(e => e.offsetParent !== null && e.innerText.trim().length > 0)",
        timeout=60_000,
        polling=100,
    )
    return time.monotonic() - clicked


# Figures wider than the output area they sit in, and table cells that render empty in a row that has data.
_LAYOUT_PROBLEMS = """() => {
  const wide = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent !== null).map(p => {
    const area = p.closest('.jp-OutputArea-output');
    const svg = p.querySelector('.main-svg');
    return {w: svg ? svg.getBoundingClientRect().width : 0, area: area ? area.getBoundingClientRect().width : 1e9};
  }).filter(x => x.w > x.area + 1);
  const empty = [...document.querySelectorAll('.jp-OutputArea-output table tr')].filter(r => r.offsetParent !== null)
    .filter(r => r.innerText.trim().length > 0)
    .flatMap(r => [...r.querySelectorAll('td')]).filter(td => td.innerText.trim().length === 0).length;
  return {wide: wide, empty: empty};
}"""


# Elements wider than their output area: their right edge past the area's, unless a box that scrolls sideways
# (overflow-x auto/scroll) holds them and that box itself fits. Figures: each plotly figure's drawing as wide as the
# box it sits in (not plotly's 700 px default, not wider).
_FIT_PROBLEMS = """() => {
  const visible = (e) => e.offsetParent !== null && e.getBoundingClientRect().width > 0;
  // a box that scrolls sideways, or clips (a figure's SVG: plotly draws bars past the axis range and clips them;
  // getBoundingClientRect ignores the clip)
  const scrolls = (e) => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX) ||
    (e.tagName.toLowerCase() === 'svg' && ['hidden', 'clip'].includes(getComputedStyle(e).overflowX));
  const out = {wide: [], figures: []};
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    if (!visible(area)) continue;
    const right = area.getBoundingClientRect().right + 3;  // sub-pixel rounding of SVG groups
    for (const e of area.querySelectorAll('*')) {
      if (!visible(e) || e.getBoundingClientRect().right <= right) continue;
      let box = e.parentElement, held = false;
      while (box && box !== area) {
        if (scrolls(box) && box.getBoundingClientRect().right <= right) { held = true; break; }
        box = box.parentElement;
      }
      if (!held) {
        out.wide.push((e.className && e.className.baseVal === undefined ? e.className : e.tagName) + ' ' +
          Math.round(e.getBoundingClientRect().right - right + 1) + 'px');
        if (!out.chain) {  // what holds the first one: class, width, overflow-x of each box up to the output area
          out.chain = [];
          for (let b = e; b && b !== area.parentElement; b = b.parentElement) {
            out.chain.push([String(b.className).slice(0, 60), Math.round(b.getBoundingClientRect().width),
              getComputedStyle(b).overflowX, getComputedStyle(b).minWidth]);
          }
        }
      }
    }
    for (const plot of area.querySelectorAll('.js-plotly-plot')) {
      if (!visible(plot)) continue;
      const svg = plot.querySelector('.main-svg');
      const holder = plot.parentElement, style = getComputedStyle(holder);  // its content box: padding aside
      const box = holder.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      const drawn = svg ? svg.getBoundingClientRect().width : 0;
      if (Math.abs(drawn - box) > Math.max(4, 0.02 * box)) out.figures.push([Math.round(drawn), Math.round(box)]);
    }
  }
  out.wide = out.wide.slice(0, 12);
  out.installed = document.querySelector('style[data-workbench="fit"]') !== null;
  return out;
}"""


# Sampled every 250 ms in the page from before Run All: the text of the busy progress bar a person sees (the panel's
# own, or the copy pinned to the bottom of the notebook's view when Run All scrolled it away), whether it is in view,
# and the sampler's own time (a late sample means the page itself was starved, not that the kernel went quiet).
_SAMPLE_PROGRESS = """() => {
  if (window.__wbSampler) { clearInterval(window.__wbSampler); }
  window.__wbSamples = [];
  const scroller = (el) => {
    for (let b = el.parentElement; b; b = b.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(b).overflowY) && b.clientHeight < b.scrollHeight) { return b; }
    }
    return null;
  };
  window.__wbSampler = setInterval(() => {
    const busy = [...document.querySelectorAll('.workbench-progress.workbench-busy')].filter(e => e.offsetParent !== null);
    const sample = {t: performance.now(), busy: busy.length > 0, text: '', inView: false};
    const pinned = document.querySelector('.workbench-progress-pinned');
    if (pinned && getComputedStyle(pinned).display !== 'none') {
      sample.text = pinned.innerText; sample.inView = true;
    } else if (busy.length) {
      const el = busy[0], r = el.getBoundingClientRect(), box = scroller(el);
      const v = box ? box.getBoundingClientRect() : {top: 0, bottom: window.innerHeight};
      sample.text = el.innerText; sample.inView = r.top >= v.top && r.bottom <= Math.min(v.bottom, window.innerHeight);
    }
    window.__wbSamples.push(sample);
  }, 250);
}"""


def _progress_cadence(page) -> dict:
    """From the samples: the longest time the busy progress text stood still while the page's sampler ran on time
    (``still_ms``), the same for stretches where the page itself was late by over 0.6 s (``starved_still_ms``: the
    browser got no CPU, nothing the kernel can fix), the sampler's longest gap, how long progress was busy, and the
    busy samples whose progress was out of view and the longest stretch of them (``hidden_ms``: one sample counts its
    250 ms; a stretch with a sampler gap over 0.6 s goes to ``starved_hidden_ms`` instead: the page's pinning runs on
    a timer too, and seen on CI, one 1.7 s stall of the page made a stretch out of view look 2 s long)."""
    samples = page.evaluate("() => { clearInterval(window.__wbSampler); return window.__wbSamples; }")
    still, starved_still, late, busy_ms, hidden = 0.0, 0.0, 0.0, 0.0, 0
    changed, starved, worst, hidden_texts = None, False, [], []
    hidden_since, hidden_starved, hidden_ms, starved_hidden_ms = None, False, 0.0, 0.0
    t0 = samples[0]["t"] if samples else 0.0
    for before, sample in zip(samples, samples[1:]):
        late = max(late, sample["t"] - before["t"])
        if not sample["busy"]:
            changed = hidden_since = None
            continue
        busy_ms += sample["t"] - before["t"]
        if not sample["inView"]:
            hidden += 1
            hidden_texts.append(f"{(sample['t'] - t0) / 1000:.1f}s {sample['text'][:80]}")
            if hidden_since is None:
                hidden_since, hidden_starved = sample["t"], False
            # a stretch the page's own timers ran late in (the pinning runs on one too) is the browser's lack of CPU
            hidden_starved = hidden_starved or sample["t"] - before["t"] > 600
            if hidden_starved:
                starved_hidden_ms = max(starved_hidden_ms, sample["t"] - hidden_since + 250)
            else:
                hidden_ms = max(hidden_ms, sample["t"] - hidden_since + 250)
        else:
            hidden_since = None
        if changed is None or sample["text"] != before["text"]:
            changed, starved = sample["t"], False
        starved = starved or sample["t"] - before["t"] > 600
        if starved:
            starved_still = max(starved_still, sample["t"] - changed)
        elif sample["t"] - changed > still:
            still = sample["t"] - changed
            worst = [f"{(changed - t0) / 1000:.1f}s-{(sample['t'] - t0) / 1000:.1f}s", sample["text"][:120]]
    return {
        "still_ms": round(still),
        "starved_still_ms": round(starved_still),
        "late_ms": round(late),
        "busy_s": round(busy_ms / 1000, 1),
        "hidden": hidden,
        "hidden_ms": round(hidden_ms),
        "starved_hidden_ms": round(starved_hidden_ms),
        "worst": worst,
        "hidden_at": hidden_texts[:3] + hidden_texts[-2:],
    }


# True once the page has shown no fit problem and no blank cell for 600 ms in a row (a figure re-lays out after its
# box changed, debounced: it must stay right, not pass between two layouts).
_FIT_SETTLED = f"""() => {{
  const p = ({_FIT_PROBLEMS})(), empty = ({_LAYOUT_PROBLEMS})().empty, now = performance.now();
  if (p.wide.length || p.figures.length || empty) {{ window.__wbFitSince = null; return false; }}
  if (window.__wbFitSince == null) {{ window.__wbFitSince = now; }}
  return now - window.__wbFitSince >= 600;
}}"""


def _fit_at(page, widths=(900, 1280, 1920), tabs=(), shot: str = "") -> dict:
    """_FIT_PROBLEMS and blank cells at each window width (resized in place), in each of ``tabs`` if given: measured
    once the page has settled without a problem, or after 15 s (what is still wrong then is what is reported)."""
    found = {}
    for width in widths:
        page.set_viewport_size({"width": width, "height": 900})
        for tab in tabs or ("",):
            if tab:
                _open_tab(page, tab)
            page.wait_for_timeout(200)  # the resize or the tab switch reaches the widgets
            page.evaluate("() => { window.__wbFitSince = null; }")
            try:
                page.wait_for_function(_FIT_SETTLED, timeout=15_000, polling=100)
            except Exception:  # noqa: BLE001  (what is still wrong is asserted below)
                pass
            found[(width, tab)] = {**page.evaluate(_FIT_PROBLEMS), "empty": page.evaluate(_LAYOUT_PROBLEMS)["empty"]}
        if shot:
            page.screenshot(path=str(ARTIFACTS / f"{shot}-{width}px.png"), full_page=False)
    return {key: value for key, value in found.items() if value["wide"] or value["figures"] or value["empty"]}


def _wait_idle(page, timeout_ms: int) -> None:
    """Every cell ran (no [*] left) and the kernel is idle."""
    page.wait_for_function(
        "() => document.body.innerText.includes('| Idle') && "
        "[...document.querySelectorAll('.jp-InputArea-prompt')].every(e => !e.innerText.includes('*'))",
        timeout=timeout_ms,
        polling=500,
    )


def _with_parameters(notebook_text: str, parameters: dict[str, str]) -> str:
    """The notebook with ``NAME = value`` lines of its parameters cell replaced (a quicker run than the defaults)."""
    notebook = json.loads(notebook_text)
    cell = next(c for c in notebook["cells"] if "".join(c["source"]).lstrip().startswith("# parameters"))
    lines = "".join(cell["source"]).splitlines(keepends=True)
    for name, value in parameters.items():
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{name} = "))
        lines[at] = f"{name} = {value}\n"
    cell["source"] = lines
    return json.dumps(notebook)


def _errors(page) -> list[str]:
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    return [text[:1500] for text in errors.all_inner_texts() if "Traceback" in text or "Error" in text]


def test_every_notebook_in_chromium_at_900_1280_and_1920_px(jupyter_lab, tmp_path: Path) -> None:
    """Issues 16 and 24 in the page, one Run All per notebook (00 and 01 and 04 as shipped, 05 on digits-cnn, 03 with
    32 evaluation samples, a search budget of 2 and nearest weight rounding; 02 is driven by test_explore_browser
    with the same checks): progress visible within 2 s of Run All, its text changing at least once a second while the first run works and in
    view where Run All leaves the page (the pinned copy); at 900, 1280 and 1920 px windows (resized in place; 00 in
    every tab) nothing wider than the output area, every figure as wide as its container, no blank table cell.
    00: an out-of-range value is refused and changes nothing, quick changes export at most one bundle, FP16 re-builds
    and re-times, a model switch clears every result at once and marks the outputs below stale, no stale note stays
    over the redrawn figures, Cancel stops a run; the README's screenshots. 05: the notebook's and the button's
    exports."""
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="python package playwright missing")
    base, token = jupyter_lab
    ARTIFACTS.mkdir(exist_ok=True)
    root = tmp_path / "lab"
    for name in ("01_clean_graph", "04_async_pipeline"):
        shutil.copy(REPO / "notebooks" / f"{name}.ipynb", root)
    text = (REPO / "notebooks" / "03_int8_calibration.ipynb").read_text(encoding="utf-8")
    (root / "03_int8_calibration.ipynb").write_text(
        _with_parameters(
            text,
            {"EVAL_SAMPLES": "32", "SEARCH_BUDGET": "2", "WEIGHT_ROUNDING": '"nearest"', "GRID_ALIGNMENT": '"off"'},
        ),
        encoding="utf-8",
    )
    cadence, first_progress, fit, seconds, phases = {}, {}, {}, {}, {}
    with sync_api.sync_playwright() as playwright:
        context = _browser(playwright, tmp_path, viewport={"width": 1280, "height": 900})
        page = None
        try:
            # --- 00 as shipped (ocr-cls): the panel, then its product checks and the README's screenshots
            started = time.monotonic()
            page = _open_notebook(context, base, token, "00_quickstart.ipynb")
            page.evaluate(_SAMPLE_PROGRESS)
            first_progress["00"] = _progress_seconds(page, _run_all(page, sync_api))
            _wait_status(page, "done", 300_000)
            page.wait_for_function(  # the cells below the panel have run too (the report is the last)
                "() => [...document.querySelectorAll('.jp-OutputArea-output')].some(e => e.innerText.includes('report: '))",
                timeout=180_000,
                polling=POLL_MS,
            )
            _wait_idle(page, 60_000)
            cadence["00"] = _progress_cadence(page)
            assert not _errors(page), _errors(page)
            phases["00 run all"] = round(time.monotonic() - started, 1)
            fit["00"] = _fit_at(page, tabs=("Stages", "Task metric", "Timing", "Cleaning"), shot="notebook-00")
            page.set_viewport_size({"width": 1280, "height": 900})
            panel = page.locator(".workbench-quickstart-panel")
            _open_tab(page, "Stages")
            assert "Choose the engine" in _panel_text(page) and " engine" in _panel_text(page)
            _screenshot(page, ARTIFACTS / "quickstart-panel.png")
            stages_before = panel.locator("table").first.inner_text()

            phases["00 fit"] = round(time.monotonic() - started, 1)
            # out of range: refused with the CLI's message, the field goes back, nothing else changes
            _type_into(panel, "streams", "99")
            _wait_status(page, "streams=99 is out of range. Expected: 1..64.", 10_000)
            assert panel.locator(".widget-text", has_text="streams").locator("input").input_value() == "2"
            _type_into(panel, "max drop", "2")
            _wait_status(page, "max_metric_drop=2.0 is out of range. Expected: 0..1.", 10_000)
            assert float(panel.locator(".widget-text", has_text="max drop").locator("input").input_value()) == 0.01
            assert panel.locator("table").first.inner_text() == stages_before
            assert "Stale" not in _panel_text(page)

            phases["00 out of range"] = round(time.monotonic() - started, 1)
            # quick changes, typed as a user would: each cancels the run before it; only a run that finishes exports
            _open_tab(page, "Timing")
            exports = root / "out" / "quickstart" / "export"
            before = {p.name for p in exports.iterdir() if (p / "manifest.json").is_file()}
            for streams in ("3", "5", "4"):
                _type_into(panel, "streams", streams)
                page.wait_for_timeout(300)
            _wait_status(page, "4 stream(s) x batch 8", 120_000)
            _wait_status(page, " stages complete", 120_000)  # every stage that applies (FP8 is off unless asked for)
            new = {p.name for p in exports.iterdir() if (p / "manifest.json").is_file()} - before
            assert len(new) <= 1, new  # three changes, one finished run
            _screenshot(page, ARTIFACTS / "quickstart-timing-4-streams.png")

            phases["00 streams"] = round(time.monotonic() - started, 1)
            # precision dropdown: FP16 builds the FP16 engine and re-times it
            panel.locator(".widget-dropdown", has_text="precision").locator("select").select_option(label="FP16")
            _open_tab(page, "Stages")
            _wait_status(page, "fp16 engine", 120_000)
            _wait_status(page, " stages complete")
            _open_tab(page, "Task metric")
            _wait_status(page, "\u25b6 fp16", 30_000)
            _open_tab(page, "Fusion")
            _wait_status(page, "fp16.engine", 30_000)
            _screenshot(page, ARTIFACTS / "fusion-view-ocr-cls.png")

            phases["00 fp16"] = round(time.monotonic() - started, 1)
            # a model switch clears every result at once (nothing of ocr-cls stays) and marks the outputs of the
            # cells below stale (with the reason) until they run again
            panel.locator(".widget-dropdown", has_text="model").locator("select").select_option(label="digits-cnn")
            _wait_status(page, "model changed to digits-cnn", 5_000)
            results = panel.locator(".widget-tab").first.inner_text()  # every tab's content, not the model picker
            assert "ocr-cls" not in results, results[:2000]
            # the banner is its own widget: its view may render a moment after the tables' (a whole-suite run, 2026-12-06)
            _wait_status(page, "Stale: model changed to digits-cnn", 5_000)
            page.wait_for_function(
                "() => document.querySelectorAll('.workbench-stale-output').length >= 5",
                timeout=10_000,
                polling=POLL_MS,
            )
            marked = page.evaluate(
                "() => [...document.querySelectorAll('.workbench-stale-output')].map(e => e.innerText)"
            )
            assert any("report: " in text for text in marked), marked  # the last cell's output below the panel
            _open_tab(page, "Stages")
            _wait_status(page, "digits-cnn.fp16.engine", 150_000)
            _wait_status(page, " stages complete")  # digits-cnn: the mixed build may not apply (all-INT8 meets)
            # no stale note over the fresh figures: the "model changed" note each figure showed while the stages
            # re-ran is gone from every redrawn figure (their axes are back), and so is the banner; the cells below
            # still hold ocr-cls's outputs, so they stay marked
            redrawn = {}
            for tab in ("Cleaning", "Per-layer diff", "Task metric", "Timing"):
                _open_tab(page, tab)
                page.wait_for_timeout(800)
                redrawn[tab] = page.evaluate(_FIGURE_NOTES)
            assert all(not f["notes"] and f["ticks"] > 0 for f in redrawn.values()), redrawn
            assert "Stale" not in _panel_text(page)
            assert page.evaluate("() => document.querySelectorAll('.workbench-stale-output').length") >= 5
            _open_tab(page, "Fusion")
            _wait_status(page, "digits-cnn.fp16.engine", 30_000)
            time.sleep(1.0)  # let plotly finish laying out before the screenshot
            _screenshot(page, ARTIFACTS / "fusion-view.png")

            phases["00 model switch"] = round(time.monotonic() - started, 1)
            # Cancel stops a run at its next stage
            panel.locator("button", has_text="Run all stages").click()
            _wait_status(page, "running every stage", 10_000)
            panel.locator(".workbench-progress button", has_text="Cancel").click()
            _wait_status(page, "cancelled", 120_000)
            page.screenshot(path=str(ARTIFACTS / "notebook-00-cancelled.png"), full_page=False)
            seconds["00"] = time.monotonic() - started

            # --- 05 on digits-cnn: the export panel
            started = time.monotonic()
            page = _open_notebook(context, base, token, "05_export_digits.ipynb")
            page.evaluate(_SAMPLE_PROGRESS)
            first_progress["05"] = _progress_seconds(page, _run_all(page, sync_api))
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                ".filter(e => e.innerText.includes('model.engine')).length >= 2"
                " && [...document.querySelectorAll('.jp-OutputArea-output')]"
                ".some(e => e.innerText.includes('-plan'))",
                timeout=300_000,
                polling=POLL_MS,
            )
            _wait_idle(page, 60_000)
            cadence["05"] = _progress_cadence(page)
            assert not _errors(page), _errors(page)
            fit["05"] = _fit_at(page, shot="notebook-05")
            page.set_viewport_size({"width": 1280, "height": 900})
            bundles = [p for p in (root / "out" / "05_export" / "export").iterdir() if (p / "manifest.json").is_file()]
            assert len(bundles) == 3 and all((p / "model.engine").is_file() for p in bundles), bundles
            # the panel's own button exports the plan picked from the search's Pareto front (preselected: its pick)
            export_panel = page.locator(".workbench-export-panel")
            assert "search pick" in export_panel.inner_text() and "not speed" in export_panel.inner_text()
            export_panel.locator("button", has_text="Export plan").click()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                bundles = [
                    p for p in (root / "out" / "05_export" / "export").iterdir() if (p / "manifest.json").is_file()
                ]
                if len(bundles) == 4:
                    break
                time.sleep(0.5)
            assert len([p for p in bundles if "-plan" in p.name]) == 2, bundles  # the notebook's and the button's
            page.screenshot(path=str(ARTIFACTS / "notebook-05.png"), full_page=False)
            seconds["05"] = time.monotonic() - started

            # --- 01, 04 as shipped, 03 on quicker parameters (GPTQ's rounding is headless-tested in test_calib_notebook)
            for name in ("01_clean_graph", "03_int8_calibration", "04_async_pipeline"):
                started = time.monotonic()
                page = _open_notebook(context, base, token, f"{name}.ipynb")
                page.evaluate(_SAMPLE_PROGRESS)
                first_progress[name[:2]] = _progress_seconds(page, _run_all(page, sync_api))
                _wait_idle(page, 420_000)
                cadence[name[:2]] = _progress_cadence(page)
                assert not _errors(page), (name, _errors(page))
                fit[name[:2]] = _fit_at(page, shot=f"notebook-{name[:2]}")
                page.set_viewport_size({"width": 1280, "height": 900})
                seconds[name[:2]] = time.monotonic() - started
        except Exception:
            if page is not None:
                page.screenshot(path=str(ARTIFACTS / "notebooks-failure.png"), full_page=True)
            raise
        finally:
            context.close()
            report = {"first_progress_s": first_progress, "cadence": cadence, "seconds": seconds, "phases_00_s": phases}
            (ARTIFACTS / "browser-notebooks.json").write_text(json.dumps(report, indent=1, default=str))
    for name in ("quickstart-panel.png", "fusion-view.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000
    # The README's screenshots come from this test, but a test run must not rewrite tracked files:
    # refresh them on purpose with WORKBENCH_UPDATE_DOCS_IMG=1.
    if os.environ.get("WORKBENCH_UPDATE_DOCS_IMG") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for name in ("quickstart-panel.png", "fusion-view.png"):
            shutil.copy(ARTIFACTS / name, DOCS_IMG / name)
    problems = {f"{nb} {key}": value for nb, found in fit.items() for key, value in found.items()}
    assert not problems, json.dumps(problems, indent=0)[:6000]
    slow = {nb: s for nb, s in first_progress.items() if s > 2.0}
    assert not slow, f"no progress shown within 2 s of Run All: {slow}"
    # the progress text a person sees changes at least once a second, and is in view, while the first run works
    # (out of view: never longer than a second at a time, e.g. while the pinned copy takes over)
    frozen = {nb: c for nb, c in cadence.items() if c["still_ms"] > 1000 or c["hidden_ms"] > 1000}
    assert not frozen, json.dumps(cadence)
