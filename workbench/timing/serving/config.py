"""How one model is served: lanes, batching, admission bound, priority. A frozen, JSON-round-tripping dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.artifact import Artifact
from workbench.errors import WorkbenchError
from workbench.timing.limits import MAX_STREAMS, MIN_STREAMS, STREAMS_EXPECTED

PRIORITIES = ("high", "normal", "low")
# Triton's rate limiter weights scheduling chances by 1/priority (1 = most often); the same order as ours.
TRITON_PRIORITY = {"high": 1, "normal": 2, "low": 4}


@dataclass(frozen=True)
class ServeConfig(Artifact):
    """Serving settings of one model.

    ``lanes`` x ``depth`` batches can be in flight (one CUDA stream per lane, ``depth`` slots each). Queued requests
    are batched up to ``max_batch`` samples and padded to the next of ``bucket_sizes()`` (one CUDA graph each).
    ``max_queue_delay_ms`` caps how long a free lane waits for more requests; with ``adaptive_delay`` the wait is the
    time the current arrival rate needs to fill the batch the GPU must run to keep up (0 when it keeps up with
    single requests), never more than the cap. ``queue_capacity`` bounds the requests waiting for dispatch: beyond it
    a request is refused at once (status ``refused``). ``timeout_ms`` expires requests that waited longer (status
    ``expired``). ``priority`` sets the CUDA stream priority of the model's lanes (and Triton's rate-limiter
    priority on export). ``sm_count`` confines the model's kernels to that many SMs (a CUDA green context; rounded
    up to the GPU's partition granularity) so that the SMs outside stay free for other models: stream priority
    only orders pending blocks, while a partition keeps a saturating low-priority model off SMs a high-priority one
    needs. ``None`` (default): the whole GPU.
    """

    lanes: int = 2
    depth: int = 2
    max_batch: int = 8
    max_queue_delay_ms: float = 0.0
    adaptive_delay: bool = True
    queue_capacity: int = 1024
    timeout_ms: float | None = None
    priority: str = "normal"
    buckets: tuple[int, ...] = ()  # empty: powers of two below max_batch, and max_batch
    spin_wait: bool = False
    sm_count: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if not MIN_STREAMS <= self.lanes <= MAX_STREAMS:
            problems.append(f"lanes={self.lanes} (expected {STREAMS_EXPECTED})")
        if self.depth < 1:
            problems.append(f"depth={self.depth} (expected >= 1)")
        if self.max_batch < 1:
            problems.append(f"max_batch={self.max_batch} (expected >= 1)")
        if self.max_queue_delay_ms < 0:
            problems.append(f"max_queue_delay_ms={self.max_queue_delay_ms} (expected >= 0)")
        if self.queue_capacity < 1:
            problems.append(f"queue_capacity={self.queue_capacity} (expected >= 1)")
        if self.timeout_ms is not None and self.timeout_ms <= 0:
            problems.append(f"timeout_ms={self.timeout_ms} (expected > 0 or None)")
        if self.priority not in PRIORITIES:
            problems.append(f"priority={self.priority!r} (expected {' | '.join(PRIORITIES)})")
        if self.sm_count is not None and self.sm_count < 1:
            problems.append(f"sm_count={self.sm_count} (expected >= 1 or None)")
        if self.buckets and (min(self.buckets) < 1 or max(self.buckets) < self.max_batch):
            problems.append(f"buckets={self.buckets} (expected sizes >= 1 that reach max_batch={self.max_batch})")
        if problems:
            raise WorkbenchError("serving config: " + "; ".join(problems) + ".", expected="a valid ServeConfig")

    def bucket_sizes(self) -> list[int]:
        """Batch sizes prepared ahead (one CUDA graph each on the torch executor); a batch is padded up to one."""
        if self.buckets:
            return sorted({int(b) for b in self.buckets if b <= self.max_batch} | {self.max_batch})
        sizes = {self.max_batch}
        size = 1
        while size < self.max_batch:
            sizes.add(size)
            size *= 2
        return sorted(sizes)

    def pad(self, samples: int) -> int:
        for size in self.bucket_sizes():
            if size >= samples:
                return size
        return self.max_batch

    def label(self) -> str:
        delay = f"{self.max_queue_delay_ms:g} ms" + (
            " adaptive" if self.adaptive_delay and self.max_queue_delay_ms else ""
        )
        sms = f", {self.sm_count} SMs" if self.sm_count is not None else ""
        return f"{self.lanes} lanes x {self.depth}, max batch {self.max_batch}, delay {delay}{sms}"


def cuda_stream_priority(priority: str, least: int, greatest: int) -> int:
    """CUDA priority number for a level; CUDA counts down (``greatest`` is the most urgent, e.g. -5; least is 0)."""
    if priority == "high":
        return greatest
    if priority == "low":
        return least
    return (least + greatest) // 2 if greatest < least - 1 else least
