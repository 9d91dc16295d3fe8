"""The engine explorer in a real browser: headless Debian Chromium (software WebGL) loads our Model Explorer page
from this process's server and draws both graphs with the overlays loaded."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from test_browser import POLL_MS, jupyter_lab  # noqa: F401  (the JupyterLab server fixture)

from workbench.engine import engine_for_model
from workbench.explore import graphs as g
from workbench.viz.engine_view import fused_ops_label

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--enable-unsafe-swiftshader", "--no-sandbox", "--use-angle=swiftshader"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "out" / "browser"


def _not_blank(png: bytes) -> int:
    """Distinct colours in a screenshot (a blank or one-colour page has very few)."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB").resize((400, 300))
    return len(image.getcolors(maxcolors=1 << 24) or ())


def _select_in_engine_pane_and_read_onnx_pane(page, layer_map):
    """Click a layer in the engine pane (a real click on the WebGL canvas) and return the ONNX pane's info panel.

    The layer is brought to the canvas centre with Model Explorer's search ("click to locate"), then clicked."""
    op_types = {n.name: n.op_type for n in layer_map.nodes}
    labels = {layer.name: fused_ops_label(layer, op_types) for layer in layer_map.layers}
    layer = next(
        layer
        for layer in layer_map.layers
        if len(layer.onnx_nodes) > 1 and sum(labels[layer.name] in other for other in labels.values()) == 1
    )
    pane = page.locator("split-pane").nth(1)
    search = pane.locator("input").first
    search.click()
    search.fill(re.escape(labels[layer.name]))
    search.press("Enter")
    pane.locator(".search-results-container mat-tree-node", has_text=labels[layer.name]).first.click()
    time.sleep(1.5)
    search.fill("")
    page.keyboard.press("Escape")
    time.sleep(1)
    canvas = pane.locator("graph-panel canvas").first.bounding_box()
    page.mouse.click(canvas["x"] + canvas["width"] / 2, canvas["y"] + canvas["height"] / 2)
    page.wait_for_function(
        "(id) => document.querySelectorAll('info-panel')[0].innerText.includes(id)",
        arg=layer.name,
        timeout=20_000,
        polling=POLL_MS,
    )
    return layer, page.evaluate("() => document.querySelectorAll('info-panel')[0].innerText")


def test_explorer_renders_both_graphs_with_overlays_in_chromium(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="python package playwright missing")
    import workbench
    from workbench.explore.server import get_server, healthy

    fp32 = engine_for_model("ocr-cls", "fp32", tmp_path)
    explorer = workbench.explore(fp32)
    server = get_server()
    assert server.host == "127.0.0.1" and healthy(server.port, server.token)
    again = workbench.explore(fp32)
    assert again.url.split("/?")[0] == explorer.url.split("/?")[0] == server.base_url  # one server, reused
    assert "<iframe" in explorer._repr_html_()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            started = time.monotonic()
            page.goto(explorer.url)
            page.wait_for_function(
                "() => document.querySelectorAll('split-pane graph-panel canvas').length >= 2",
                timeout=90_000,
                polling=POLL_MS,
            )
            first_canvas_s = time.monotonic() - started
            page.wait_for_function(
                "() => [...document.querySelectorAll('info-panel')].filter(p => p.innerText.includes('NODE DATA PROVIDERS')).length >= 2",
                timeout=60_000,
                polling=POLL_MS,
            )
            panes = page.evaluate(
                "() => [...document.querySelectorAll('split-pane')].map(p => p.innerText.slice(0, 4000))"
            )
            body = page.inner_text("body")
            synced = _select_in_engine_pane_and_read_onnx_pane(page, fp32.layer_map)
            time.sleep(2)
            png = page.screenshot(path=str(ARTIFACTS / "explorer.png"))
        finally:
            browser.close()
    assert len(panes) == 2
    onnx_pane, engine_pane = panes
    stats = fp32.layer_map.stats()
    assert "ocr-cls.fp32 ONNX" in body and "ocr-cls.fp32 engine" in body  # the two panes' titles
    # Model Explorer counts our nodes: ONNX nodes + layer nodes + graph inputs/outputs on the left, layers + I/O right
    assert f"{stats.onnx_nodes + stats.engine_layers + 2}" in onnx_pane
    assert f"{stats.engine_layers + 2}" in engine_pane
    for pane in panes:  # every overlay listed with its legend/stats in both panes
        for name in ("precision", "ONNX nodes fused per layer", "lint findings"):
            assert name in pane
    assert "Sync" in body  # the split view's sync control is shown (mode "match node id" comes with the URL)
    layer, onnx_info = synced
    # selecting the layer in the engine pane selected it in the ONNX pane, inside its own group (expanded there)
    assert layer.name in onnx_info and g.layer_group_name(layer) in onnx_info, onnx_info[:600]
    assert _not_blank(png) > 50, "the screenshot is (nearly) one colour"
    assert first_canvas_s < 60


def test_notebook_02_explorer_renders_inside_jupyterlab(jupyter_lab, tmp_path: Path) -> None:  # noqa: F811
    """Run All on notebook 02 (digits-cnn) in JupyterLab: the explorer IFrames in the cell outputs load Model Explorer
    from the kernel's server and draw both panes with the overlays. The panel checks of test_browser's every-notebook
    test too (one Run All): progress within 2 s, changing at least once a second and in view while the builds run;
    at 900, 1280 and 1920 px nothing wider than the output area, figures as wide as their container, no blank cell."""
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="python package playwright missing")
    from test_browser import (
        _SAMPLE_PROGRESS,
        _browser,
        _fit_at,
        _open_notebook,
        _progress_cadence,
        _progress_seconds,
        _run_all,
        _wait_idle,
    )

    base, token = jupyter_lab
    text = (Path(__file__).resolve().parents[1] / "notebooks" / "02_fusions.ipynb").read_text(encoding="utf-8")
    assert "MODEL = DEFAULT_MODEL" in text
    (tmp_path / "lab" / "02_digits.ipynb").write_text(text.replace("MODEL = DEFAULT_MODEL", 'MODEL = \\"digits-cnn\\"'))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        context = _browser(playwright, tmp_path)
        try:
            page = _open_notebook(context, base, token, "02_digits.ipynb")
            page.evaluate(_SAMPLE_PROGRESS)
            first_progress_s = _progress_seconds(page, _run_all(page, sync_api))
            page.wait_for_function(
                "() => document.querySelectorAll('.jp-OutputArea-output iframe').length >= 2",
                timeout=240_000,
                polling=POLL_MS,
            )
            frame_element = page.locator(".jp-OutputArea-output iframe").first
            frame_element.scroll_into_view_if_needed()
            frame = frame_element.content_frame
            # embedded, the info panels start collapsed (zero width): attached, not visible
            frame.locator("info-panel", has_text="op node count").nth(1).wait_for(state="attached", timeout=180_000)
            canvases = frame.locator("split-pane graph-panel canvas:not(.snapshot)").count()
            panes = [frame.locator("info-panel").nth(i).text_content() or "" for i in range(2)]
            widths = [frame.locator("info-panel").nth(i).bounding_box() for i in range(2)]
            page.wait_for_timeout(2000)
            frame_element.screenshot(path=str(ARTIFACTS / "explorer-in-jupyterlab.png"))
            _wait_idle(page, 300_000)
            cadence = _progress_cadence(page)
            fit = _fit_at(page, shot="notebook-02")
        finally:
            context.close()
    assert first_progress_s <= 2.0, f"no progress shown for {first_progress_s:.1f} s after Run All"
    # the rule test_browser applies to every notebook: progress never still, nor out of view, for over a second (a
    # count of hidden 250 ms samples, <= 2, failed at 3 on a loaded machine: a knife edge, not a frozen bar)
    assert cadence["still_ms"] <= 1000 and cadence["hidden_ms"] <= 1000, cadence
    assert not fit, fit
    assert canvases >= 2  # one WebGL canvas per pane
    assert all(box is None or box["width"] == 0 for box in widths), widths  # collapsed inside the notebook
    for pane in panes:
        assert "NODE DATA PROVIDERS".lower() in pane.lower() and "precision" in pane


FIRST_PAINT_JS = (
    "() => document.querySelectorAll('split-pane graph-panel canvas').length >= 2 && "
    "[...document.querySelectorAll('info-panel')].filter(p => p.innerText.includes('op node count')).length >= 2"
)
DENSENET_CELLS = [
    "# DenseNet-121 as the ONNX model zoo ships it (in the onnx package's backend tests): 1,746 nodes, no name scopes\n"
    "from pathlib import Path\n"
    "import onnx, workbench\n"
    "from workbench.engine.build import BuildOptions, engine_from_onnx\n"
    "from workbench.model import load_onnx\n"
    "source = Path(onnx.__file__).parent / 'backend' / 'test' / 'data' / 'light' / 'light_densenet121.onnx'\n"
    "artifact = engine_from_onnx(load_onnx(source), Path('densenet121.fp32.engine'), BuildOptions(progress=False))",
    # the command: its start on the wall clock (the browser on this machine compares its own at first paint)
    "import time\n"
    "started = time.time()\n"
    "explorer = workbench.explore(artifact)\n"
    "url = explorer.url  # the graphs written, this kernel's server up (it started while they were written)\n"
    "print(f'WB-STARTED {started:.3f} URL-AFTER {time.time() - started:.2f}')\n"
    "explorer",
]
PAINTED_AT_JS = "() => (" + FIRST_PAINT_JS + ")() ? Date.now() / 1000 : false"


def test_densenet121_first_paint_embedded_in_jupyterlab(jupyter_lab, tmp_path: Path) -> None:  # noqa: F811
    """DenseNet-121 without name scopes, embedded in a JupyterLab output: from the command (``workbench.explore``)
    and from the IFrame's appearance to both panes drawn. The first paint shows a few labelled blocks (not a 1 px
    column) with the info panels collapsed, so each pane's graph gets the output's width; the times are written to
    out/browser/ (the machine's load beside them)."""
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="python package playwright missing")
    import json
    import os

    import nbformat
    from test_browser import _browser, _open_notebook, _run_all

    base, token = jupyter_lab
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in DENSENET_CELLS],
        metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    )
    nbformat.write(notebook, str(tmp_path / "lab" / "densenet.ipynb"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        context = _browser(playwright, tmp_path)
        try:
            page = _open_notebook(context, base, token, "densenet.ipynb")
            _run_all(page, sync_api)
            frame_element = page.locator(".jp-OutputArea-output iframe").first
            frame_element.wait_for(state="attached", timeout=300_000)
            shown = time.time()
            load_before = os.getloadavg()[0]
            frame_element.scroll_into_view_if_needed()
            frame = frame_element.element_handle().content_frame()
            painted = frame.wait_for_function(PAINTED_AT_JS, timeout=180_000, polling=50).json_value()
            first_paint_s = painted - shown
            started, url_after = re.findall(
                r"WB-STARTED ([0-9.]+) URL-AFTER ([0-9.]+)", page.inner_text(".jp-Notebook")
            )[-1]
            command_to_paint_s = painted - float(started)
            output_width = page.evaluate(
                "() => document.querySelector('.jp-OutputArea-output iframe').getBoundingClientRect().width"
            )
            canvases = frame.evaluate(
                "() => [...document.querySelectorAll('split-pane graph-panel canvas.main')]"
                ".map(c => [c.getBoundingClientRect().width, c.getBoundingClientRect().height])"
            )
            panels = frame.evaluate(
                "() => [...document.querySelectorAll('info-panel')].map(p => p.getBoundingClientRect().width)"
            )
            page.wait_for_timeout(1500)
            frame_element.screenshot(path=str(ARTIFACTS / "explorer-densenet121-in-jupyterlab.png"))
        finally:
            context.close()
    measured = {
        "command_to_paint_s": round(command_to_paint_s, 2),  # `workbench.explore(artifact)` run -> both panes drawn
        "command_to_url_s": float(url_after),  # of which: graphs written and the server up
        "first_paint_s": round(first_paint_s, 2),  # the IFrame attached -> both panes drawn
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "output_width_px": output_width,
        "canvas_px": canvases,
        "info_panel_px": panels,
    }
    (ARTIFACTS / "explorer-densenet121-first-paint.json").write_text(json.dumps(measured, indent=1))
    print("DenseNet-121 embedded first paint:", measured)
    assert panels == [0, 0]  # collapsed by default inside the notebook
    assert len(canvases) == 2 and all(h >= 600 for _, h in canvases)  # graph area at least 600 px high
    assert sum(w for w, _ in canvases) >= 0.9 * output_width  # the panes' graphs take the output's width
    # generous bounds for a loaded 2-core machine (5 helpers' work measured 22 s here); the numbers are recorded
    # above, and bench/explorer.py measures the 5 s target on a quiet machine
    assert first_paint_s < 90 and command_to_paint_s < 120


def test_the_int8_damage_overlay_is_the_one_the_page_opens_with_when_a_diff_is_given(tmp_path: Path) -> None:
    """FP32 beside all-INT8 digits-cnn with the per-layer diff (as notebook 02's "Where INT8 hurts"): in Chromium, the
    INT8 pane's selected node-data run (the overlay drawn) is the SQNR drop, not the first overlay loaded."""
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (make test installs it with apt where apt works)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="python package playwright missing")
    import workbench
    from workbench.flow import QuickstartConfig, QuickstartSession

    config = QuickstartConfig(
        model="digits-cnn",
        out_dir=str(tmp_path / "int8"),
        sweep=False,
        export=False,
        calibration_samples=32,
        diff_samples=8,
    )
    session = QuickstartSession(config)
    run = session.run_stages(["build_fp32", "calibrate", "build_int8_all", "layer_diff"])
    explorer = workbench.explore(run.fp32_engine, compare=run.int8_all_build.engine, diff=run.layer_diff.diff)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.goto(explorer.url)
            page.wait_for_function(
                "() => [...document.querySelectorAll('info-panel')].filter(p => p.innerText.includes("
                "'INT8: drop of accumulated SQNR')).length >= 1",
                timeout=120_000,
                polling=POLL_MS,
            )
            page.wait_for_timeout(1500)  # every run added (each is selected as it is added)
            # per pane, the node-data runs whose eye icon is open: the overlay drawn on the graph
            selected = page.evaluate(
                "() => [...document.querySelectorAll('info-panel')].map(p => [...p.querySelectorAll('.index-row')]"
                ".filter(r => [...r.querySelectorAll('mat-icon')].some(i => i.textContent.trim() === 'visibility'))"
                ".map(r => r.querySelector('.run-name').textContent.trim()))"
            )
        finally:
            browser.close()
    assert len(selected) == 2, selected
    assert selected[1] == ["INT8: drop of accumulated SQNR at the node (dB)"], selected  # the INT8 build's pane
