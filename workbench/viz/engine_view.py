"""A static, readable drawing of an engine: named layer boxes, coloured by precision, with the ONNX nodes each fused.

For ``out/report.html`` and ``workbench fusions --html``: plain SVG inside HTML (no script library, opens offline and
fast). Layers are drawn top to bottom in layers of a longest-path layering of the engine graph (edges are the tensors
one layer writes and another reads); each box says, without hovering, which ONNX op types it fused
(``Conv+BatchNormalization+Relu``), its layer type and precision, and the first ONNX node names. Large engines are
cut into sections by ONNX name scope (``features/denseblock2``), each a collapsible ``<details>`` with its counts;
edges that cross sections are written as "from ..." labels. The ONNX node -> layer table below is searchable.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engine.layermap import FusionDiff, LayerEntry, LayerMap
from workbench.engine.records import EngineLayers
from workbench.viz import palette

BOX_W = 290
BOX_H = 58
GAP_X = 22
GAP_Y = 34
MARGIN = 12
LABEL_MAX = 44
# Above this many layers the drawing is cut into sections by ONNX name scope (collapsed ones stay unrendered text).
SECTION_MIN_LAYERS = 80
OPEN_SECTIONS_MAX_LAYERS = 80
SECTION_CHUNK = 40  # layers per section when a scope (or the whole model) has more  # sections open by default while the whole engine is at most this big
HIDDEN_OPS = ("QuantizeLinear", "DequantizeLinear", "Cast")


def fused_ops_label(layer: LayerEntry, op_types: Mapping[str, str], limit: int = LABEL_MAX, repeat: str = "×") -> str:
    """``Conv+BatchNormalization+Relu``: the op types a layer fused, in order, repeats collapsed (``Add×3``);
    Q/DQ and Cast are left out when anything else is there. The layer type for a layer with no ONNX source."""
    ops = [op_types.get(node, "") or "?" for node in layer.onnx_nodes]
    ops = [op for op in ops if op not in HIDDEN_OPS] or ops
    runs: list[list[Any]] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    text = "+".join(op if count == 1 else f"{op}{repeat}{count}" for op, count in runs)
    if not text:
        return f"{layer.layer_type} (inserted)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fusion_diff_of(before: LayerMap, after: LayerMap) -> FusionDiff:
    """The fusion diff of two builds keyed by the compute nodes each layer executes: AutoCast's Casts and the Q/DQ
    nodes of an INT8 build are left out of the keys, so FP32 vs FP16 vs INT8 compare on the model's own nodes."""
    from workbench.engine.layermap import diff_layer_maps

    ops = {node.name: node.op_type for layer_map in (before, after) for node in layer_map.nodes}

    def ignore(name: str) -> bool:
        return name.startswith("autocast/") or ops.get(name) in HIDDEN_OPS

    return diff_layer_maps(before, after, ignore=ignore)


def scope_of(node_name: str, depth: int = 2) -> str:
    """The first ``depth`` levels of an ONNX name scope (``/features/denseblock1/denselayer3/conv1/Conv`` ->
    ``features/denseblock1``); '' for names without one."""
    parts = [p for p in node_name.split("/") if p]
    return "/".join(parts[:-1][:depth]) if len(parts) >= 2 else ""


def layer_edges(layer_map: LayerMap, engine_layers: EngineLayers | None) -> dict[str, list[str]]:
    """Layer -> the layers it reads tensors from. Without records, consecutive layers are chained."""
    names = [layer.name for layer in layer_map.layers]
    if engine_layers is None:
        return {name: ([names[i - 1]] if i else []) for i, name in enumerate(names)}
    producer: dict[str, str] = {}
    for record in engine_layers.layers:
        for tensor in record.outputs:
            producer.setdefault(tensor.name, record.name)
    records = {record.name: record for record in engine_layers.layers}
    parents: dict[str, list[str]] = {}
    for name in names:
        layer_record = records.get(name)
        found = [] if layer_record is None else [producer[t.name] for t in layer_record.inputs if t.name in producer]
        parents[name] = list(dict.fromkeys(p for p in found if p != name))
    return parents


@dataclass(frozen=True)
class Section:
    title: str
    layers: tuple[LayerEntry, ...]


def sections(layer_map: LayerMap, chunk: int = SECTION_CHUNK, min_layers: int = SECTION_MIN_LAYERS) -> list[Section]:
    """Runs of consecutive layers sharing an ONNX scope (inserted layers join the run they sit in); runs of fewer
    than 3 layers join the run before; runs longer than ``chunk`` (or a model without name scopes) are cut into
    numbered chunks."""
    if len(layer_map.layers) < min_layers:
        return [Section("engine", layer_map.layers)]
    runs: list[list[Any]] = []
    for layer in layer_map.layers:
        title = (scope_of(layer.onnx_nodes[0]) or "(top level)") if layer.onnx_nodes else None
        if runs and (title is None or title == runs[-1][0] or len(runs[-1][1]) < 3):
            runs[-1][1].append(layer)
        else:
            runs.append([title or "(top level)", [layer]])
    out: list[Section] = []
    for title, layers in runs:
        for start in range(0, len(layers), chunk):
            part = layers[start : start + chunk]
            name = title if len(layers) <= chunk else f"{title} · L{part[0].index}–L{part[-1].index}"
            out.append(Section(name, tuple(part)))
    return out


def _ranks(layers: Sequence[LayerEntry], parents: Mapping[str, list[str]]) -> dict[str, int]:
    inside = {layer.name for layer in layers}
    rank: dict[str, int] = {}
    for layer in layers:  # engine order is topological
        rank[layer.name] = 1 + max(
            (rank[p] for p in parents.get(layer.name, ()) if p in inside and p in rank), default=-1
        )
    return rank


def _box(layer: LayerEntry, x: float, y: float, op_types: Mapping[str, str], mark: str) -> str:
    colour = palette.precision_color("inserted" if layer.inserted else layer.precision)
    fill = _tint(colour)
    nodes = layer.onnx_nodes
    names = ", ".join(n.rsplit("/", 1)[-1] or n for n in nodes[:3]) + (f" +{len(nodes) - 3}" if len(nodes) > 3 else "")
    title = f"{layer.name}\n{layer.layer_type}, {layer.precision}, tactic {layer.tactic or '-'}\n" + (
        "\n".join(nodes) if nodes else "inserted by TensorRT (no ONNX source)"
    )
    stroke = {"gained": palette.OK, "lost": palette.ERROR}.get(mark, colour)
    width = 3 if mark else 1.4
    dash = ' stroke-dasharray="5 3"' if layer.inserted else ""
    return (
        f'<g class="layer" data-layer="{html.escape(layer.name)}"><title>{html.escape(title)}</title>'
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" stroke="{stroke}" '
        f'stroke-width="{width}"{dash}/>'
        f'<text x="{x + 8:.0f}" y="{y + 17:.0f}" class="ops">{html.escape(fused_ops_label(layer, op_types))}</text>'
        f'<text x="{x + 8:.0f}" y="{y + 33:.0f}" class="meta">L{layer.index} · {html.escape(layer.layer_type)} · '
        f"{html.escape(layer.precision)}{' · ' + mark if mark else ''}</text>"
        f'<text x="{x + 8:.0f}" y="{y + 49:.0f}" class="nodes">{html.escape(names or "no ONNX source")}</text></g>'
    )


def _tint(colour: str, amount: float = 0.8) -> str:
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def section_svg(
    section: Section,
    parents: Mapping[str, list[str]],
    op_types: Mapping[str, str],
    marks: Mapping[str, str] | None = None,
) -> str:
    """One section as an SVG: layers placed by rank (rows), edges as curves, inputs from other sections as labels."""
    marks = marks or {}
    rank = _ranks(section.layers, parents)
    rows: dict[int, list[LayerEntry]] = {}
    for layer in section.layers:
        rows.setdefault(rank[layer.name], []).append(layer)
    widest = max((len(r) for r in rows.values()), default=1)
    width = MARGIN * 2 + widest * BOX_W + (widest - 1) * GAP_X
    pos: dict[str, tuple[float, float]] = {}
    for r, row in sorted(rows.items()):
        row_w = len(row) * BOX_W + (len(row) - 1) * GAP_X
        x0 = (width - row_w) / 2
        for i, layer in enumerate(row):
            pos[layer.name] = (x0 + i * (BOX_W + GAP_X), MARGIN + 14 + r * (BOX_H + GAP_Y))
    height = MARGIN * 2 + 14 + len(rows) * (BOX_H + GAP_Y)
    edges, outside = [], []
    for layer in section.layers:
        x, y = pos[layer.name]
        for parent in parents.get(layer.name, ()):
            if parent in pos:
                px, py = pos[parent]
                x1, y1, x2, y2 = px + BOX_W / 2, py + BOX_H, x + BOX_W / 2, y
                mid = (y1 + y2) / 2
                edges.append(f'<path d="M{x1:.0f},{y1:.0f} C{x1:.0f},{mid:.0f} {x2:.0f},{mid:.0f} {x2:.0f},{y2:.0f}"/>')
            else:
                outside.append(
                    f'<text x="{x + BOX_W / 2:.0f}" y="{y - 4:.0f}" class="from" text-anchor="middle">'
                    f"from {html.escape(parent[:38])}</text>"
                )
    boxes = [_box(layer, *pos[layer.name], op_types, marks.get(layer.name, "")) for layer in section.layers]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" class="engine-svg"><g class="edges">{"".join(edges)}</g>'
        f"{''.join(outside)}{''.join(boxes)}</svg>"
    )


CSS = """
.engine-view svg text{font-family:system-ui,sans-serif} .engine-view .ops{font-size:12px;font-weight:600;fill:#222}
.engine-view .meta{font-size:10.5px;fill:#444} .engine-view .nodes{font-size:10px;fill:#666}
.engine-view .from{font-size:9.5px;fill:#999} .engine-view .edges path{fill:none;stroke:#9a9a9a;stroke-width:1.2}
.engine-view details{border:1px solid #e3e3e3;border-radius:6px;margin:.35rem 0;padding:.2rem .6rem}
.engine-view summary{cursor:pointer;font-size:.92rem} .engine-view .scroll{overflow:auto;max-height:80vh}
.engine-view .legend span{display:inline-block;padding:1px 8px;margin:0 4px 4px 0;border-radius:4px;font-size:12px}
.engine-view table{font-size:12px;border-collapse:collapse} .engine-view td,.engine-view th{border:1px solid #ddd;padding:2px 6px}
.engine-view input{margin:.4rem 0;padding:.25rem .4rem;width:22rem}
"""

_SEARCH_JS = (
    "function wbFilter(input,id){const q=input.value.toLowerCase();"
    "for(const tr of document.getElementById(id).tBodies[0].rows){"
    "tr.style.display=tr.innerText.toLowerCase().includes(q)?'':'none'}}"
)


def _legend(layer_map: LayerMap, marks: Mapping[str, str]) -> str:
    counts: dict[str, int] = {}
    for layer in layer_map.layers:
        key = "inserted" if layer.inserted else layer.precision
        counts[key] = counts.get(key, 0) + 1
    items = [
        f'<span style="background:{_tint(palette.precision_color(k))};border:1px solid {palette.precision_color(k)}">'
        f"{html.escape(k)}: {v} layers</span>"
        for k, v in sorted(counts.items())
    ]
    for mark, colour in (("gained", palette.OK), ("lost", palette.ERROR)):
        n = sum(1 for m in marks.values() if m == mark)
        if n:
            items.append(f'<span style="border:3px solid {colour}">fusion {mark}: {n}</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def node_table_html(layer_map: LayerMap, table_id: str = "wb-node-table") -> str:
    """ONNX node -> engine layer(s), searchable (a text filter over the rows)."""
    rows = "".join(
        f"<tr><td>{node.index}</td><td>{html.escape(node.name)}</td><td>{html.escape(node.op_type)}</td>"
        f"<td>{html.escape(', '.join(node.engine_layers) or 'folded by TensorRT')}</td></tr>"
        for node in layer_map.nodes
    )
    return (
        f'<input type="search" placeholder="filter ONNX nodes / layers" oninput="wbFilter(this,\'{table_id}\')">'
        f'<div class="scroll" style="max-height:40vh"><table id="{table_id}"><thead><tr><th>#</th><th>ONNX node</th>'
        f"<th>op</th><th>engine layer(s)</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def engine_view_html(
    layer_map: LayerMap,
    engine_layers: EngineLayers | None = None,
    *,
    fusion_diff: FusionDiff | None = None,
    side: str = "after",
    with_table: bool = True,
    table_id: str = "wb-node-table",
) -> str:
    """The engine drawing as an HTML fragment (SVG sections, legend, searchable node table, its small script).

    ``fusion_diff`` marks the layers whose fusion this build gained (``side="after"``) or lost (``"before"``).
    """
    op_types = {node.name: node.op_type for node in layer_map.nodes}
    parents = layer_edges(layer_map, engine_layers)
    marks: dict[str, str] = {}
    if fusion_diff is not None:
        for group in fusion_diff.gained if side == "after" else fusion_diff.lost:
            marks[group.layer] = "gained" if side == "after" else "lost"
    parts = [_legend(layer_map, marks)]
    cut = sections(layer_map)
    open_all = len(layer_map.layers) <= OPEN_SECTIONS_MAX_LAYERS
    for section in cut:
        svg = section_svg(section, parents, op_types, marks)
        if len(cut) == 1:
            parts.append(f'<div class="scroll">{svg}</div>')
            continue
        precisions: dict[str, int] = {}
        for layer in section.layers:
            precisions[layer.precision] = precisions.get(layer.precision, 0) + 1
        fused = sum(len(layer.onnx_nodes) for layer in section.layers)
        summary = (
            f"<b>{html.escape(section.title)}</b> — {len(section.layers)} layers, {fused} ONNX nodes fused; "
            + ", ".join(f"{k} {v}" for k, v in sorted(precisions.items()))
        )
        parts.append(
            f"<details{' open' if open_all else ''}><summary>{summary}</summary>"
            f'<div class="scroll">{svg}</div></details>'
        )
    if with_table:
        parts.append("<h3>ONNX node → engine layer</h3>" + node_table_html(layer_map, table_id))
    return f'<div class="engine-view"><style>{CSS}</style><script>{_SEARCH_JS}</script>{"".join(parts)}</div>'


def fusions_page(
    layer_map: LayerMap,
    path: str | Path,
    *,
    engine_layers: EngineLayers | None = None,
    compare_with: LayerMap | None = None,
    lint_rows: Sequence[Mapping[str, str]] = (),
) -> Path:
    """``workbench fusions --html``: one self-contained page (no script library) with the engine drawing, the fusion
    statistics, the Q/DQ audit, the fusion diff against ``compare_with`` and the searchable node table."""
    from workbench._io import write_text_atomic

    diff = fusion_diff_of(compare_with, layer_map) if compare_with is not None else None
    stats = layer_map.stats()
    title = html.escape(f"Fusions: {layer_map.label or 'engine'}")
    stat_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in (
            ("ONNX nodes (compute)", f"{stats.onnx_nodes} ({stats.onnx_compute_nodes})"),
            ("engine layers (inserted by TensorRT)", f"{stats.engine_layers} ({stats.inserted_layers})"),
            ("folded away", stats.folded_nodes),
            ("largest fusion", f"{stats.largest_group} ONNX nodes"),
            ("nodes split over several layers", stats.nodes_in_several_layers),
            ("layers by precision", ", ".join(f"{k} {v}" for k, v in stats.by_precision.items())),
            ("layers by type", ", ".join(f"{k} {v}" for k, v in stats.by_type.items())),
        )
    )
    audit = "".join(
        f"<tr><td>{html.escape(p.quantize)}</td><td>{html.escape(p.dequantize)}</td><td>{p.kind}</td>"
        f"<td>{p.status}</td><td>{html.escape(', '.join(p.layers))}</td></tr>"
        for p in layer_map.qdq_audit()
    )
    diff_html = ""
    if diff is not None:
        s = diff.summary()
        rows = "".join(
            f"<tr><td>{kind}</td><td>{html.escape(g.layer)}</td><td>{html.escape(g.precision)}</td>"
            f"<td>{html.escape(', '.join(sorted(g.nodes)))}</td></tr>"
            for kind, groups in (("gained", diff.gained), ("lost", diff.lost))
            for g in groups
        )
        diff_html = (
            f"<h2>Fusion diff vs {html.escape(diff.before_label or 'before')}</h2><p>{s['gained']} gained, "
            f"{s['lost']} lost, {s['common']} unchanged, {s['precision_changed']} precision changes.</p>"
            "<table><tr><th></th><th>layer</th><th>precision</th><th>ONNX nodes</th></tr>" + rows + "</table>"
        )
    lint_html = ""
    if lint_rows:
        keys = list(lint_rows[0])
        lint_html = (
            "<h2>Engine lint</h2><table><tr>"
            + "".join(f"<th>{html.escape(k)}</th>" for k in keys)
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(str(r[k]))}</td>" for k in keys) + "</tr>" for r in lint_rows)
            + "</table>"
        )
    page = (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1rem 2rem;color:#222} table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:2px 6px;font-size:12px;text-align:left;vertical-align:top}</style></head>"
        f"<body><h1>{title}</h1><p>Generated by trt-workbench from layer records in format "
        f"<code>{html.escape(layer_map.source_format)}</code>. Each box is one engine layer: the ONNX op types it "
        "fused, its index, type and precision, and its first ONNX nodes (hover for all). Dashed boxes: layers "
        "TensorRT inserted.</p>"
        + engine_view_html(layer_map, engine_layers, fusion_diff=diff)
        + f"<h2>Statistics</h2><table>{stat_rows}</table>"
        + diff_html
        + lint_html
        + "<h2>Q/DQ audit</h2><table><tr><th>Quantize</th><th>Dequantize</th><th>kind</th><th>status</th>"
        f"<th>layers</th></tr>{audit or '<tr><td colspan=5>no Q/DQ pairs</td></tr>'}</table>"
        f"<details><summary>ONNX nodes folded away ({len(layer_map.folded_nodes)})</summary><p>"
        + html.escape(", ".join(f"{n.name} [{n.op_type}]" for n in layer_map.folded_nodes) or "none")
        + "</p></details></body></html>\n"
    )
    return write_text_atomic(path, page)
