"""The one palette every figure in :mod:`workbench.viz` (and every panel status line) draws with.

Precision colours follow the Okabe-Ito colour-blind-safe set and stay clear of the status colours: INT8 is never
red or green, so "INT8" never reads as "failed" or "fine". Grey means "not executed": folded away (light) or a
layer TensorRT inserted (dark).
"""

from __future__ import annotations

from workbench.precision.variant import VARIANTS, Variant

# --- precisions ------------------------------------------------------------------------------------------------
FP32 = "#0072B2"  # blue
FP16 = "#E69F00"  # orange
BF16 = "#56B4E9"  # sky blue
INT8 = "#CC79A7"  # reddish purple
FP8 = "#D55E00"  # vermillion
INT4 = "#8C6D31"  # brown
FP4 = "#B07AA1"  # mauve
INTEGER = "#7F7F7F"  # int32 / int64 / bool tensors (shape arithmetic)
FOLDED = "#D0D0D0"  # an ONNX node folded away: executed by no engine layer
INSERTED = "#777777"  # an engine layer TensorRT inserted (reformat, cast): no ONNX source
NO_TENSORS = "#9E9E9E"  # layers without tensors: stream signal/wait, shape calls
OTHER = "#BCBD22"  # a precision this palette does not know

PRECISION_COLORS = {
    "fp32": FP32,
    "fp16": FP16,
    "bf16": BF16,
    "int8": INT8,
    "fp8": FP8,
    "int4": INT4,
    "fp4": FP4,
    "int32": INTEGER,
    "int64": INTEGER,
    "bool": INTEGER,
    "folded": FOLDED,
    "inserted": INSERTED,
    "none": NO_TENSORS,
}


def precision_color(precision: Variant | str) -> str:
    """The colour of a precision variant (its compute precision's colour, from :data:`~workbench.precision.VARIANTS`)
    or of a precision / layer kind as engines and graphs name it (``fp16``, ``int32``, ``folded``, ``inserted``)."""
    if isinstance(precision, Variant):
        return PRECISION_COLORS[VARIANTS[precision].precision]
    return PRECISION_COLORS.get(precision.lower(), OTHER)


# --- status (stages, cleaning passes, panel status lines) ---------------------------------------------------------
OK = "#2A7A2A"
WARNING = "#A66D00"
ERROR = "#B00000"
MUTED = "#999999"
TEXT = "#333333"
BUSY = "#555555"

STATUS_COLORS = {
    # quickstart stages (workbench.flow.StageStatus)
    "done": OK,
    "failed": ERROR,
    "off": MUTED,
    "not_applicable": MUTED,
    "blocked": WARNING,
    "cancelled": WARNING,
    "pending": MUTED,
    "skipped": WARNING,
    # cleaning passes
    "accepted": OK,
    "unchecked": WARNING,
    "rolled_back": ERROR,
    "unchanged": MUTED,
    "report_only": MUTED,
    # panel status lines
    "ok": OK,
    "warning": WARNING,
    "error": ERROR,
    "info": TEXT,
    "busy": BUSY,
    "idle": TEXT,
    "stale": WARNING,
}

# --- changes (cleaning waterfall and neighbourhood, fusion diff) --------------------------------------------------
REMOVED = "#D9534F"  # nodes a pass removed / fusions lost
ADDED = "#3C9A3C"  # nodes a pass added / fusions gained
CHANGED = FP16  # a fusion group whose precision changed
UNCHANGED = "#7F7F7F"
DECREASE, INCREASE, TOTAL = OK, ERROR, "#4A6FA5"  # waterfall bars: fewer nodes is good
REMOVED_FILL, ADDED_FILL, CHANGED_FILL = "#F2DEDE", "#DFF0D8", "#FCF8E3"  # table rows

# --- pipeline timing stages (Gantt lanes) -------------------------------------------------------------------------
PIPELINE_STAGE_COLORS = {
    "enqueue": "#7F7F7F",
    "queue": "#BCBD22",
    "h2d": "#56B4E9",
    "compute": "#009E73",
    "d2h": "#E69F00",
}
QUANTILE_COLORS = {"p50": "#009E73", "p90": "#E69F00", "p99": "#D55E00"}

# --- calibration range methods ------------------------------------------------------------------------------------
METHOD_COLORS = {"max": "#444444", "percentile": "#0072B2", "entropy": "#D55E00", "mse": "#009E73"}

# --- neutral parts of a figure -----------------------------------------------------------------------------------
NEUTRAL = "#4A6FA5"  # bars/markers that carry no category
NEUTRAL_LIGHT = "#9ECAE1"  # histogram bars, unselected variants
MARKER_EDGE = "#444444"
EDGE = "#BBBBBB"  # graph edges, connectors
LINK = "rgba(120,120,120,0.35)"  # ONNX node -> engine layer links
SELECTION = "#D55E00"  # the highlighted selection
THRESHOLD = "#D55E00"  # reference lines: SLA, percentiles, thresholds
HEADER_FILL = "#EEEEEE"
CELL_FILL = "white"
GRAPH_NODE = "#8AA0C8"  # a graph node that did not change
WORST = "black"  # markers of the worst layers

# Series without a category of their own (e.g. one curve per batch size), in order.
SERIES_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

TEMPLATE = "plotly_white"
