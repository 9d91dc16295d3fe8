"""The limits and defaults of timing settings: one constant each, read by configs, widgets and the CLI.

Streams (pipeline lanes, serving lanes) are capped at 64: twice the hardware work queues the pipeline asks for
(:data:`workbench.timing.lanes.HARDWARE_QUEUES`), beyond which lanes only share queues; the H200 measurements stop
gaining well before that (bench/results/pipeline_h200_*.md). The journey's batch is the engine profile's batch, so
it is offered in powers of two up to 64; ``workbench time`` times any request batch the memory guard lets through.
"""

from __future__ import annotations

from workbench.errors import WorkbenchError

MIN_STREAMS = 1
MAX_STREAMS = 64
STREAMS_EXPECTED = f"{MIN_STREAMS}..{MAX_STREAMS}"

BATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64)  # the batch sizes the journey and the panels offer
MAX_JOURNEY_BATCH = BATCH_CHOICES[-1]
MAX_REQUEST_BATCH = 2**24  # `workbench time --batch`: a sanity bound; the memory guard refuses what would not fit

# short interactive runs (journey timing stage, timing panel): a window, and at most this long a warm-up
MAX_INTERACTIVE_WARMUP_S = 0.2
INTERACTIVE_MIN_WINDOWS = 3
INTERACTIVE_MAX_WINDOWS = 4


def check_streams(value: int, name: str = "streams") -> int:
    """``value`` as an int when it is an allowed number of lanes, else a WorkbenchError naming ``name``."""
    if not MIN_STREAMS <= int(value) <= MAX_STREAMS:
        raise WorkbenchError(f"{name}={value} is out of range.", expected=STREAMS_EXPECTED)
    return int(value)


def check_journey_batch(value: int, name: str = "batch") -> int:
    """``value`` as an int when it is an allowed journey (engine profile) batch, else a WorkbenchError."""
    if not 1 <= int(value) <= MAX_JOURNEY_BATCH:
        raise WorkbenchError(f"{name}={value} is out of range.", expected=f"1..{MAX_JOURNEY_BATCH}")
    return int(value)
