"""Engine explorer timings: time to first paint of the Model Explorer page (alone, in a notebook-sized box, and
embedded in a real JupyterLab from the `workbench.explore(...)` command) and load time of the static fusions page, in
headless Chromium (software WebGL), for the zoo models we can build here, DenseNet-121 / DenseNet-264 (the paper's
configurations, torchvision module names, random weights), DenseNet-121 without name scopes (densenet121-noscope, the
ONNX model zoo's as the onnx package ships it) and a 10,000-node residual chain (chain-10k).

    PYTHONPATH=. WORKBENCH_CACHE=/work/zoo-cache .venv/bin/python bench/explorer.py [--models a,b] [--runs 3] \
        [--work DIR] [--no-lab]

The 5 s target (issue 24): ``--models densenet121-noscope,chain-10k --work .cache/bench-explorer`` on a quiet
machine (``--work`` keeps the builds: chain-10k takes 20 minutes to build on a loaded 2-core machine).

Builds are excluded from the timings (FP32 engines built first with TensorRT-RTX, CPU ahead-of-time). "First paint":
until both split panes show their graph canvas and their graph info (node counts), i.e. the graphs were loaded, laid
out and drawn. In JupyterLab it is timed from the start of the cell that runs ``workbench.explore(build)`` (graphs
written, the kernel's server started, the page loaded in the output's IFrame). "Static page": ``workbench fusions
--html``'s page from navigation to the load event, plus a check that its SVG boxes are laid out. Writes
bench/results/<--out>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ZOO = ["digits-cnn", "ocr-cls", "ocr-rec", "ocr-det", "efficientnet-lite0", "minilm"]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--enable-unsafe-swiftshader", "--no-sandbox", "--use-angle=swiftshader"]


def densenet_onnx(path: Path, blocks: tuple[int, ...] = (6, 12, 48, 32)) -> Path:
    """DenseNet-201 by default (Huang et al.; torchvision's module names, random weights: structure only) exported to ONNX."""
    import torch
    from torch import nn

    class DenseLayer(nn.Module):
        def __init__(self, cin: int, growth: int = 32, bn_size: int = 4) -> None:
            super().__init__()
            self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU()
            self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
            self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU()
            self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))], 1)

    class Transition(nn.Sequential):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.norm, self.relu = nn.BatchNorm2d(cin), nn.ReLU()
            self.conv, self.pool = nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2, 2)

    class DenseNet(nn.Module):
        def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16)) -> None:
            super().__init__()
            self.features = nn.Sequential()
            self.features.add_module("conv0", nn.Conv2d(3, 64, 7, 2, 3, bias=False))
            self.features.add_module("norm0", nn.BatchNorm2d(64))
            self.features.add_module("relu0", nn.ReLU())
            self.features.add_module("pool0", nn.MaxPool2d(3, 2, 1))
            channels = 64
            for i, count in enumerate(blocks):
                block = nn.Sequential()
                for j in range(count):
                    block.add_module(f"denselayer{j + 1}", DenseLayer(channels + j * 32))
                self.features.add_module(f"denseblock{i + 1}", block)
                channels += count * 32
                if i != len(blocks) - 1:
                    self.features.add_module(f"transition{i + 1}", Transition(channels, channels // 2))
                    channels //= 2
            self.features.add_module("norm5", nn.BatchNorm2d(channels))
            self.classifier = nn.Linear(channels, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.features(x))
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    model = DenseNet(blocks).eval()
    torch.onnx.export(
        model,
        (torch.randn(1, 3, 224, 224),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamo=False,
        do_constant_folding=False,  # keep BatchNormalization nodes (as a training-framework export does)
    )
    return path


def light_densenet121() -> Path:
    """DenseNet-121 of the ONNX model zoo as the ``onnx`` package ships it for its backend tests (weights replaced by
    ConstantOfShape, 1,746 nodes, no names: a graph without name scopes, as many exporters write them)."""
    import onnx

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_densenet121.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"{path} (shipped with the onnx package)")
    return path


def residual_chain_onnx(path: Path, nodes: int = 10_000, channels: int = 8, size: int = 8) -> Path:
    """A graph of about ``nodes`` unnamed ONNX nodes (no name scopes): residual blocks Conv-BN-Relu-Conv-BN-Add-Relu
    on a small tensor, so the build stays short while the graph has real layers (~2 per block)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph_nodes, initializers = [], []

    def weight(name: str, shape: tuple[int, ...], scale: float = 0.1) -> str:
        initializers.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def batchnorm(x: str, out: str, tag: str) -> None:
        params = [
            weight(f"{tag}_s", (channels,), 0.01),
            weight(f"{tag}_b", (channels,), 0.01),
            weight(f"{tag}_m", (channels,), 0.01),
        ]
        initializers.append(numpy_helper.from_array(np.ones(channels, np.float32), f"{tag}_v"))
        graph_nodes.append(helper.make_node("BatchNormalization", [x, *params, f"{tag}_v"], [out]))

    x = "x"
    for block in range(nodes // 7):
        t = f"b{block}"
        graph_nodes.append(
            helper.make_node("Conv", [x, weight(f"{t}_w1", (channels, channels, 3, 3))], [f"{t}_c1"], pads=[1] * 4)
        )
        batchnorm(f"{t}_c1", f"{t}_n1", f"{t}_bn1")
        graph_nodes.append(helper.make_node("Relu", [f"{t}_n1"], [f"{t}_r1"]))
        graph_nodes.append(
            helper.make_node(
                "Conv", [f"{t}_r1", weight(f"{t}_w2", (channels, channels, 3, 3))], [f"{t}_c2"], pads=[1] * 4
            )
        )
        batchnorm(f"{t}_c2", f"{t}_n2", f"{t}_bn2")
        graph_nodes.append(helper.make_node("Add", [f"{t}_n2", x], [f"{t}_sum"]))
        graph_nodes.append(helper.make_node("Relu", [f"{t}_sum"], [f"{t}_out"]))
        x = f"{t}_out"
    graph_nodes.append(helper.make_node("Identity", [x], ["y"]))
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        graph_nodes,
        "residual_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def build(model: str, out: Path):
    from workbench.engine import engine_for_model
    from workbench.engine.build import BuildOptions, engine_from_onnx
    from workbench.model import load_onnx

    started = time.monotonic()
    built = out / f"{model}.fp32.engine"
    if model in ("densenet121-noscope", "chain-10k") and built.is_file():
        from workbench.engine.build import EngineArtifact

        return EngineArtifact.load(built), None  # built by an earlier run with the same --work (not timed again)
    if model in ("densenet121-noscope", "chain-10k"):
        onnx_path = (
            light_densenet121() if model == "densenet121-noscope" else residual_chain_onnx(out / "chain10k.onnx")
        )
        artifact = engine_from_onnx(load_onnx(onnx_path), out / f"{model}.fp32.engine", BuildOptions(progress=False))
    elif model.startswith("densenet"):
        blocks = {"densenet121": (6, 12, 24, 16), "densenet201": (6, 12, 48, 32), "densenet264": (6, 12, 64, 48)}[model]
        onnx_path = densenet_onnx(out / f"{model}.onnx", blocks)
        artifact = engine_from_onnx(load_onnx(onnx_path), out / f"{model}.fp32.engine", BuildOptions(progress=False))
    else:
        artifact = engine_for_model(model, "fp32", out)
    return artifact, time.monotonic() - started


FIRST_PAINT_JS = (
    "() => document.querySelectorAll('split-pane graph-panel canvas').length >= 2 && "
    "[...document.querySelectorAll('info-panel')].filter(p => p.innerText.includes('op node count')).length >= 2"
)


def time_explorer(browser, url: str) -> tuple[float, dict[str, float]]:
    """Navigation to first paint, and when the phases ended: the web app loaded and the graphs JSON fetched (the last
    graphs file received), the graphs processed and drawn (Model Explorer asks for the node-data files after that)."""
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    marks: dict[str, float] = {}

    def finished(request) -> None:
        if "read_text_file" in request.url:
            key = "graphs_fetched_s" if ".graphs.json" in request.url else "drawn_overlays_asked_s"
            if key == "graphs_fetched_s" or key not in marks:
                marks[key] = round(time.monotonic() - started, 2)

    try:
        page.on("requestfinished", finished)
        started = time.monotonic()
        page.goto(url)
        page.wait_for_function(FIRST_PAINT_JS, timeout=180_000, polling=50)
        return time.monotonic() - started, marks
    finally:
        page.close()


# A notebook as a user runs it: the first cell loads the build (imports warm, not timed); the second is the command,
# `workbench.explore(build)` displayed, and prints the wall clock it started at, which the page compares with the
# wall clock at first paint (kernel and browser share this machine's clock).
LAB_CELLS = [
    "import time\nimport workbench\nfrom workbench.engine.build import EngineArtifact\nartifact = EngineArtifact.load({engine!r})",
    "started = time.time()\nexplorer = workbench.explore(artifact)\nurl = explorer.url\n"
    "print(f'WB-STARTED {{started:.3f}} URL-AFTER {{time.time() - started:.2f}}')\nexplorer",
]
LAB_PAINTED_JS = "() => (" + FIRST_PAINT_JS + ")() ? Date.now() / 1000 : false"


def time_in_jupyterlab(
    engines: dict[str, Path], runs: int, folder: Path, results: dict[str, list[dict[str, float]]]
) -> None:
    """For each build: Run All on its notebook ``runs`` times in a real JupyterLab (tests/test_browser.py's server,
    one per build, Chromium at 1400x1000, the explorer in a cell output); per run, from the command's start to first
    paint inside the output's IFrame, the part of it until the page URL existed (graphs written, server up), and from
    the parent page's notice of the IFrame to first paint (the IFrame shares the page's thread, so that notice can come
    late: a lower bound). The first run of a kernel starts its explorer server (overlapped with the graphs)."""
    import nbformat
    from playwright import sync_api

    sys.path.insert(0, str(REPO / "tests"))
    from test_browser import _browser, _open_notebook, _run_all, jupyter_lab

    for model, engine in engines.items():
        home = folder / model
        home.mkdir(parents=True)
        lab = jupyter_lab.__wrapped__(home)  # the tests' JupyterLab server (a generator fixture): started, stopped
        base, token = next(lab)
        try:
            notebook = nbformat.v4.new_notebook(
                cells=[nbformat.v4.new_code_cell(c.format(engine=str(engine))) for c in LAB_CELLS],
                metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            )
            nbformat.write(notebook, str(home / "lab" / "explore.ipynb"))
            with sync_api.sync_playwright() as playwright:
                context = _browser(playwright, home)
                try:
                    page = _open_notebook(context, base, token, "explore.ipynb")
                    results[model] = []
                    previous = ""
                    for _ in range(runs):
                        _run_all(page, sync_api)
                        page.wait_for_function(
                            "(old) => { const f = document.querySelector('.jp-OutputArea-output iframe');"
                            " return f && f.src && f.src !== old; }",
                            arg=previous,
                            timeout=600_000,
                            polling=50,
                        )
                        attached = time.time()
                        frame_element = page.locator(".jp-OutputArea-output iframe").first
                        previous = frame_element.get_attribute("src") or ""
                        frame_element.scroll_into_view_if_needed()
                        frame = frame_element.element_handle().content_frame()
                        painted = frame.wait_for_function(LAB_PAINTED_JS, timeout=600_000, polling=50).json_value()
                        printed = page.wait_for_function(
                            "() => { const m = [...document.querySelectorAll('.jp-OutputArea-output')]"
                            ".map(e => e.textContent).join(' ').match(/WB-STARTED ([0-9.]+) URL-AFTER ([0-9.]+)/);"
                            " return m ? [m[1], m[2]] : false; }",
                            timeout=60_000,
                        ).json_value()
                        started, url_after = float(printed[0]), float(printed[1])
                        results[model].append(
                            {
                                "command_to_paint_s": round(painted - started, 2),
                                "command_to_url_s": url_after,
                                "iframe_to_paint_s": round(painted - attached, 2),
                                "loadavg_1m": round(os.getloadavg()[0], 2),
                            }
                        )
                        print(model, "in JupyterLab:", results[model][-1], flush=True)
                finally:
                    context.close()
        finally:
            lab.close()


EMBED_WIDTH_PX = 935  # JupyterLab's output area beside the file browser in a 1400 px window (issue 24)


def embedded_page(explorer, directory: Path) -> Path:
    """The notebook output as JupyterLab shows it: the explorer's own HTML (IFrame + summary) in a 935 px box."""
    page = directory / "embedded.html"
    page.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body style='margin:0'>"
        f"<div style='width:{EMBED_WIDTH_PX}px'>{explorer._repr_html_()}</div></body></html>",
        encoding="utf-8",
    )
    return page


def time_embedded(browser, page_url: str) -> tuple[float, list[list[float]], list[float]]:
    """First paint inside the IFrame (served from 127.0.0.1 like JupyterLab, so the frame is same-site and keeps its
    storage), then the size of each pane's graph canvas and of its info panel."""
    page = browser.new_page(viewport={"width": EMBED_WIDTH_PX + 40, "height": 900})
    try:
        started = time.monotonic()
        page.goto(page_url)
        frame = page.frame_locator("iframe").first
        frame.locator("split-pane graph-panel canvas").nth(1).wait_for(state="attached", timeout=180_000)
        inner = next(f for f in page.frames if f != page.main_frame)
        inner.wait_for_function(FIRST_PAINT_JS, timeout=180_000, polling=50)
        took = time.monotonic() - started
        canvases = inner.evaluate(
            "() => [...document.querySelectorAll('split-pane graph-panel canvas.main')]"
            ".map(c => [Math.round(c.getBoundingClientRect().width), Math.round(c.getBoundingClientRect().height)])"
        )
        panels = inner.evaluate(
            "() => [...document.querySelectorAll('info-panel')].map(p => Math.round(p.getBoundingClientRect().width))"
        )
        return took, canvases, panels
    finally:
        page.close()


def serve_directory(directory: Path) -> str:
    """A local HTTP server for the embedded page (a file:// parent would make the 127.0.0.1 frame third-party)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def time_static(browser, path: Path, layers: int) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        started = time.monotonic()
        page.goto(path.as_uri(), wait_until="load")
        drawn = page.evaluate("() => document.querySelectorAll('svg g.layer').length")
        took = time.monotonic() - started
        assert drawn == layers, (drawn, layers)
        return took
    finally:
        page.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join([*ZOO, "densenet121", "densenet264"]))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work", default="", help="build folder to reuse (chain-10k takes minutes to build)")
    parser.add_argument("--out", default="explorer", help="result file stem under bench/results/")
    parser.add_argument(
        "--no-lab", action="store_true", help="skip the JupyterLab measurement (Run All on a notebook per model)"
    )
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from workbench.engine.lint import lint
    from workbench.explore.explorer import build_explorer
    from workbench.explore.graphs import view_from_artifact
    from workbench.explore.server import get_server
    from workbench.viz.engine_view import fusions_page

    # absolute: the static page is opened by a file:// URL
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="bench-explorer-"))
    work.mkdir(parents=True, exist_ok=True)
    site = serve_directory(work)
    rows, failures = [], {}
    engines: dict[str, Path] = {}
    server_started = time.monotonic()
    get_server()
    server_start_s = time.monotonic() - server_started
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        for model in args.models.split(","):
            try:
                artifact, build_s = build(model, work)
            except Exception as error:  # a model that cannot be built here is reported, not hidden
                failures[model] = f"{type(error).__name__}: {error}"[:300]
                print(f"{model}: build failed: {failures[model]}")
                continue
            view = view_from_artifact(artifact)
            prepared = time.monotonic()
            explorer = build_explorer(view, directory=work)
            prepare_s = time.monotonic() - prepared
            url = explorer.url
            load_before = os.getloadavg()[0]
            timed = [time_explorer(browser, url) for _ in range(args.runs)]
            paints = [t for t, _ in timed]
            engines[model] = Path(artifact.engine_path).resolve()
            embedded_url = f"{site}/{embedded_page(explorer, work).name}"
            embedded = [time_embedded(browser, embedded_url) for _ in range(args.runs)]
            page = fusions_page(
                view.layer_map,
                work / f"{model}.fusions.html",
                engine_layers=view.engine_layers,
                lint_rows=lint(view.layer_map, view.engine_layers).rows(),
            )
            statics = [time_static(browser, page, len(view.layer_map.layers)) for _ in range(args.runs)]
            graph_bytes = sum(p.stat().st_size for p in explorer.graph_files)
            row = {
                "model": model,
                # the machine's load (1-minute average) before and after this row's page loads: other work shares
                # the cores, and every timing here grows with it
                "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "onnx_nodes": len(view.layer_map.nodes),
                "engine_layers": len(view.layer_map.layers),
                "build_s": None if build_s is None else round(build_s, 2),
                "prepare_graphs_s": round(prepare_s, 3),
                "graphs_json_mb": round(graph_bytes / 1e6, 2),
                "first_paint_s": [round(t, 2) for t in paints],
                "first_paint_median_s": round(statistics.median(paints), 2),
                "first_paint_phases_s": [marks for _, marks in timed],
                "embedded_first_paint_s": [round(t, 2) for t, _, _ in embedded],
                "embedded_first_paint_median_s": round(statistics.median(t for t, _, _ in embedded), 2),
                "embedded_canvas_px": embedded[-1][1],
                "embedded_info_panel_px": embedded[-1][2],
                "static_page_mb": round(page.stat().st_size / 1e6, 3),
                "static_load_s": [round(t, 3) for t in statics],
                "static_load_median_s": round(statistics.median(statics), 3),
            }
            rows.append(row)
            print(json.dumps(row))
        browser.close()
    lab: dict[str, list[dict[str, float]]] = {}
    if not args.no_lab and engines:
        try:
            time_in_jupyterlab(engines, args.runs, Path(tempfile.mkdtemp(prefix="bench-explorer-lab-")), lab)
        except Exception as error:  # the page measurements above are still written; the failure is reported
            failures["jupyterlab"] = f"{type(error).__name__}: {error}"[:300]
            print("JupyterLab measurement failed:", failures["jupyterlab"])
    for row in rows:
        runs = lab.get(row["model"], [])
        row["jupyterlab"] = runs
        if runs:
            row["jupyterlab_command_to_paint_median_s"] = statistics.median(r["command_to_paint_s"] for r in runs)
    result = {
        "what": "engine explorer: Model Explorer first paint and static fusions page load, headless Chromium",
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}",
        "browser": "Debian Chromium, headless, software WebGL (SwiftShader)",
        "runs": args.runs,
        "server_start_s": round(server_start_s, 2),
        "rows": rows,
        "failures": failures,
        "targets": {
            "first_paint_s": 5.0,
            "static_load_s": 3.0,
            "on": "DenseNet-121 (no name scopes) and a 10,000-node graph, embedded in JupyterLab, quiet machine",
        },
        "embedded": f"the explorer's notebook HTML in a {EMBED_WIDTH_PX} px box, served from 127.0.0.1",
    }
    out = REPO / "bench" / "results"
    (out / f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Engine explorer timings",
        "",
        f"Headless Debian Chromium with software WebGL on the dev machine ({result['machine']}); {args.runs} loads "
        "per model (first = cold), builds excluded. First paint: until both split panes show their graph and its "
        "node counts. Page: navigation to first paint (1600x900; phases: graphs JSON received / graphs processed "
        f"and drawn, when the page asks for the overlays). Box: the notebook output's IFrame in a {EMBED_WIDTH_PX} px "
        "box of a bare page. JupyterLab: Run All on a notebook whose second cell is `workbench.explore(build)`; "
        "command: from that cell's start to first paint in its output (of it, until the page URL existed: graphs "
        "written, server up); the first run starts the kernel's explorer server. Load avg: the machine's 1-minute "
        "load before and after the row (2 cores; other work running counts).",
        "",
        "| model | ONNX nodes | engine layers | graphs JSON MB | graphs written s | page first paint s (median; all) | "
        "page phases s (last run) | box first paint s (median) | JupyterLab command to paint s (each run) | "
        "of it to URL s | IFrame to paint s | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lab_runs = r.get("jupyterlab") or []
        phases = r["first_paint_phases_s"][-1] if r["first_paint_phases_s"] else {}
        lines.append(
            f"| {r['model']} | {r['onnx_nodes']} | {r['engine_layers']} | {r['graphs_json_mb']} | "
            f"{r['prepare_graphs_s']} | "
            f"{r['first_paint_median_s']} ({', '.join(map(str, r['first_paint_s']))}) | "
            f"{phases.get('graphs_fetched_s', '-')} / {phases.get('drawn_overlays_asked_s', '-')} | "
            f"{r['embedded_first_paint_median_s']} | "
            f"{', '.join(str(x['command_to_paint_s']) for x in lab_runs) or 'not run'} | "
            f"{', '.join(str(x['command_to_url_s']) for x in lab_runs) or '-'} | "
            f"{', '.join(str(x['iframe_to_paint_s']) for x in lab_runs) or '-'} | "
            f"{' -> '.join(map(str, r['loadavg_1m']))}"
            f"{' -> ' + str(lab_runs[-1]['loadavg_1m']) if lab_runs else ''} |"
        )
    if failures:
        lines += ["", "Not built here: " + "; ".join(f"{k}: {v}" for k, v in failures.items())]
    lines += ["", f"Model Explorer server start (once per kernel): {result['server_start_s']} s."]
    (out / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
