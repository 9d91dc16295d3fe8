"""``workbench.explore(...)``: the engine explorer, embedded in a notebook output (an IFrame onto Model Explorer).

One build: the split view shows the ONNX graph grouped by engine layer (left) and the engine graph (right), with
Model Explorer's "match node id" sync on (a layer selected on one side is selected on the other, where its group's
ONNX nodes show). Two builds (``compare=``): the engine graphs side by side, with overlays marking the fusions the
second build gained and the first lost. Overlays (precision, fusion size, lint, INT8 damage, layer time) are node-data
files the page loads; pick one under "Add per-node data" / the node-data selector.
"""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.engine.layermap import FusionDiff
from workbench.engine.lint import LintReport, lint
from workbench.explore import graphs as g
from workbench.explore import overlays as ov
from workbench.explore.embed import EMBED_HEIGHT_PX
from workbench.viz.engine_view import fusion_diff_of

if TYPE_CHECKING:
    from workbench.artifact import JsonObject
    from workbench.calib.diff import LayerDiff
    from workbench.engine.build import EngineArtifact
    from workbench.timing.layer_profile import LayerProfile

    # a build to show: built (an EngineArtifact, a view, an .engine or .layers.json path) or to build (zoo name, .onnx)
    BuildSource = EngineArtifact | g.BuildView | str | Path

SYNC_MODE = "match_node_id"
_COUNTER = itertools.count(1)


@dataclass
class Explorer:
    """The files of one explorer page and its URL on this kernel's server. Displays itself as an IFrame."""

    views: tuple[g.BuildView, ...]
    directory: Path
    graph_files: tuple[Path, ...]
    node_data_files: tuple[Path, ...]
    ui_state: JsonObject
    lint_reports: tuple[LintReport, ...]
    fusion_diff: FusionDiff | None = None
    overlays: tuple[ov.Overlay, ...] = ()
    height: int = EMBED_HEIGHT_PX

    @property
    def url(self) -> str:
        """The page on this kernel's Model Explorer server (started on first use, restarted if it died)."""
        from workbench.explore.server import get_server

        return get_server().url(
            self.graph_files, node_data=self.node_data_files, ui_state=self.ui_state, sync_mode=SYNC_MODE
        )

    def _repr_html_(self) -> str:
        return (
            f'<iframe src="{html.escape(self.url)}" width="100%" height="{self.height}" '
            'style="border:1px solid #ddd" title="Engine explorer (Model Explorer)"></iframe>'
            f'<div style="font-size:12px;color:#666">{html.escape(self.summary())} · '
            f'<a href="{html.escape(self.url)}" target="_blank">open in a new tab</a></div>'
        )

    def summary(self) -> str:
        parts = []
        for view, report in zip(self.views, self.lint_reports, strict=True):
            stats = view.layer_map.stats()
            parts.append(
                f"{view.label}: {stats.onnx_nodes} ONNX nodes -> {stats.engine_layers} layers, "
                f"{len(report.findings)} lint findings"
            )
        if self.fusion_diff is not None:
            s = self.fusion_diff.summary()
            parts.append(f"fusions gained {s['gained']}, lost {s['lost']}, precision changed {s['precision_changed']}")
        return "; ".join(parts)

    def export_names(self) -> list[str]:
        """The file names :meth:`export` writes."""
        return [p.name for p in (*self.graph_files, *self.node_data_files)] + ["lint.json", "view.json", "README.txt"]

    def export(self, directory: str | Path) -> Path:
        """Copy the graphs JSON and node-data JSON into ``directory`` with a README saying how to open them with
        the stock ``model-explorer`` command (no workbench needed). A file of that name already there is replaced
        only if the workbench wrote it (and nobody changed it since); otherwise nothing is written and the error
        names the files."""
        from workbench._io import (
            record_outputs,
            refuse_foreign_outputs,
            write_bytes_atomic,
            write_json_atomic,
            write_text_atomic,
        )

        out = Path(directory)
        refuse_foreign_outputs(out, self.export_names(), label="--export")
        out.mkdir(parents=True, exist_ok=True)
        for path in (*self.graph_files, *self.node_data_files):
            write_bytes_atomic(out / path.name, path.read_bytes())
        write_json_atomic(out / "lint.json", [r.to_json() for r in self.lint_reports])
        write_json_atomic(out / "view.json", {"uiState": self.ui_state, "sync": {"mode": SYNC_MODE}})
        models = ",".join(p.name for p in self.graph_files)
        node_data = ",".join(p.name for p in self.node_data_files)
        write_text_atomic(
            out / "README.txt",
            "Engine explorer export (trt-workbench). Open with the stock Model Explorer:\n\n"
            "  pip install ai-edge-model-explorer\n"
            f"  cd {out.resolve()} && model-explorer {models} --node_data_paths {node_data}\n\n"
            "Pick the 'JSON' adapter if asked. Graph 'onnx': ONNX nodes grouped by the engine layer that runs them;\n"
            "graph 'engine': the engine layers. Open both in split view and set Sync to 'match node id' to link\n"
            "them (view.json holds the layout the workbench uses). lint.json lists the linter's findings.\n",
        )
        record_outputs(out, [out / name for name in self.export_names()])
        return out


def _view(source: BuildSource, label: str, precision: str, workdir: Path) -> g.BuildView:
    """A build from an engine/artifact/.layers.json, or (for a zoo name or .onnx path) a fresh build."""
    text = str(source)
    if not isinstance(source, str | Path) or text.endswith((".engine", ".json", ".log")):
        return g.load_view(source, label=label)
    from workbench.engine.build import engine_for_model

    return g.view_from_artifact(engine_for_model(text, precision, workdir), label=label)  # type: ignore[arg-type]


def _load_diff(obj: LayerDiff | str | Path | None) -> LayerDiff | None:
    if obj is None or not isinstance(obj, str | Path):
        return obj
    from workbench._io import read_json
    from workbench.calib.diff import LayerDiff

    return LayerDiff.from_json(read_json(obj, what="DIFF.json written by `workbench diff`"))


def _load_profile(obj: LayerProfile | str | Path | None) -> LayerProfile | None:
    if obj is None or not isinstance(obj, str | Path):
        return obj
    from workbench._io import read_json
    from workbench.timing.layer_profile import LayerProfile

    return LayerProfile.from_json(read_json(obj, what="a LayerProfile JSON"))


def _pane(graph_id: str, label: str, fraction: float) -> JsonObject:
    return {
        "deepestExpandedGroupNodeIds": [],
        "selectedNodeId": "",
        "selectedGraphId": graph_id,
        "selectedCollectionLabel": label,
        "widthFraction": fraction,
    }


def build_explorer(
    model_or_engine: BuildSource,
    *,
    compare: BuildSource | None = None,
    diff: LayerDiff | str | Path | None = None,
    profile: LayerProfile | str | Path | None = None,
    precision: str = "fp32",
    compare_precision: str = "fp16",
    directory: str | Path | None = None,
    height: int = EMBED_HEIGHT_PX,
) -> Explorer:
    """Write the graphs and node data of one build (or two, with ``compare``) and describe the page; nothing is
    started here (the server starts when the page's URL is first asked for)."""
    if directory is None:  # this process's explorer session folder (the server reads only there; removed at exit)
        from workbench.explore.server import pages_folder

        directory = pages_folder()
    out = Path(directory) / f"explorer-{next(_COUNTER)}"
    out.mkdir(parents=True, exist_ok=True)
    first = _view(model_or_engine, "", precision, out)
    views = [first]
    if compare is not None:
        second = _view(compare, "", compare_precision, out)
        if second.label == first.label:
            second = g.load_view(second, label=second.label + " (2)")
        views = [first, second]
    diff_obj, profile_obj = _load_diff(diff), _load_profile(profile)
    reports = tuple(lint(view.layer_map, view.engine_layers, view.onnx_proto, view.precision_check) for view in views)
    graph_files: list[Path] = []
    node_data: list[Path] = []
    all_overlays: list[ov.Overlay] = []
    fusion_diff = fusion_diff_of(views[0].layer_map, views[1].layer_map) if len(views) == 2 else None
    for index, (view, report) in enumerate(zip(views, reports, strict=True)):
        ids = (
            (g.ONNX_GRAPH_ID, g.ENGINE_GRAPH_ID) if len(views) == 1 else (f"{view.label}:onnx", f"{view.label}:engine")
        )
        stem = _file_stem(view.label, index)
        # one collection per graph: Model Explorer applies remote node data once per collection, so the ONNX and
        # engine graphs each get theirs only as separate collections
        for graph in (g.onnx_graph(view, graph_id=ids[0]), g.engine_graph(view, graph_id=ids[1])):
            kind = "ONNX" if graph.id == ids[0] else "engine"
            collection = g.graph_collection(collection_label(view.label, kind), [graph])
            graph_files.append(g.write_graphs(collection, out / f"{stem}.{kind.lower()}.graphs.json"))
        # INT8 damage goes on the quantized side (the last build); the profile on the first
        overlays = ov.build_overlays(
            view,
            diff=diff_obj if index == len(views) - 1 else None,
            profile=profile_obj if index == 0 else None,
            lint_report=report,
            ids=ids,
        )
        if fusion_diff is not None:
            overlays.append(ov.fusion_diff_overlay(view, fusion_diff, "before" if index == 0 else "after", ids))
        overlays = ov.active_last(overlays)  # INT8 damage, where given, is the overlay the page opens with
        for overlay in overlays:
            path = overlay.save(out, prefix=f"{stem}.")
            node_data.append(path)
        all_overlays += overlays
    ui_state: JsonObject
    if len(views) == 1:
        ui_state = {
            "paneStates": [
                _pane(g.ONNX_GRAPH_ID, collection_label(first.label, "ONNX"), 0.5),
                _pane(g.ENGINE_GRAPH_ID, collection_label(first.label, "engine"), 0.5),
            ]
        }
    else:
        ui_state = {
            "paneStates": [
                _pane(f"{views[0].label}:engine", collection_label(views[0].label, "engine"), 0.5),
                _pane(f"{views[1].label}:engine", collection_label(views[1].label, "engine"), 0.5),
            ]
        }
    return Explorer(
        tuple(views),
        out,
        tuple(graph_files),
        tuple(node_data),
        ui_state,
        reports,
        fusion_diff,
        tuple(all_overlays),
        height,
    )


def collection_label(label: str, kind: str) -> str:
    return f"{label} {kind}"


def _file_stem(label: str, index: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "build"
    return f"{index}-{safe}"


def explore(
    model_or_engine: BuildSource,
    compare: BuildSource | None = None,
    diff: LayerDiff | str | Path | None = None,
    profile: LayerProfile | str | Path | None = None,
    *,
    precision: str = "fp32",
    compare_precision: str = "fp16",
    height: int = EMBED_HEIGHT_PX,
) -> Explorer:
    """Open the engine explorer on a build: an ``EngineArtifact``, an ``.engine`` (with its ``.layers.json``), a
    ``.layers.json``, or a zoo name / ``.onnx`` path (built here at ``precision``).

    ``compare``: a second build (or model, built at ``compare_precision``) shown beside the first, fusions gained
    and lost marked. ``diff``: a ``LayerDiff`` (or its JSON path, from ``workbench diff``) for the INT8-damage
    overlays. ``profile``: a ``LayerProfile`` (or its JSON path) for the layer-time overlay. The returned object
    displays itself in Jupyter; ``.url`` opens it in a browser; ``.export(DIR)`` writes shareable files.
    """
    from workbench.explore.server import start_server_in_background

    start_server_in_background()  # this kernel's server starts while the graphs are written; the page waits for it
    return build_explorer(
        model_or_engine,
        compare=compare,
        diff=diff,
        profile=profile,
        precision=precision,
        compare_precision=compare_precision,
        height=height,
    )
