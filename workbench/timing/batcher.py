"""Load generation and dynamic batching, with an injectable clock so the logic is testable without a GPU.

Closed loop: a fixed number of requests always outstanding (each completion frees a slot for the next request).
Open loop: Poisson arrivals at a rate, independent of completions, so queueing delay is not hidden (coordinated
omission). The dynamic batcher groups queued requests up to ``max_batch`` and holds the oldest at most
``max_queue_delay_s``; a request's queue time (arrival to dispatch) is accounted separately from service time.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import WorkbenchError


@dataclass
class Request:
    request_id: int
    arrival_s: float  # host clock, seconds
    samples: int = 1
    dispatch_s: float | None = None
    status: str = "queued"  # queued -> dispatched -> done | late | expired

    @property
    def queue_s(self) -> float | None:
        return None if self.dispatch_s is None else self.dispatch_s - self.arrival_s


@dataclass
class DynamicBatcher:
    """Queue that releases batches of up to ``max_batch`` samples.

    A batch is released when it is full, or when its oldest request has waited ``max_queue_delay_s`` (0 means:
    take whatever is queued right away, Triton's default). ``timeout_s`` expires requests that waited too long
    before dispatch; they are never run and are returned by ``take_expired``.
    """

    max_batch: int = 8
    max_queue_delay_s: float = 0.0
    timeout_s: float | None = None
    _queue: collections.deque[Request] = field(default_factory=collections.deque, repr=False)
    _expired: list[Request] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise WorkbenchError(
                f"dynamic batcher: max_batch={self.max_batch} is not allowed.", expected="max_batch >= 1"
            )
        if self.max_queue_delay_s < 0:
            raise WorkbenchError(
                f"dynamic batcher: max_queue_delay={self.max_queue_delay_s} s is negative.", expected="a delay >= 0"
            )

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def queued_samples(self) -> int:
        return sum(r.samples for r in self._queue)

    def offer(self, request: Request) -> None:
        if request.samples > self.max_batch:
            raise WorkbenchError(
                f"request {request.request_id} has {request.samples} samples, more than max_batch={self.max_batch}.",
                expected="requests no larger than the maximum batch",
            )
        self._queue.append(request)

    def _expire(self, now_s: float) -> None:
        if self.timeout_s is None:
            return
        while self._queue and now_s - self._queue[0].arrival_s > self.timeout_s:
            request = self._queue.popleft()
            request.status = "expired"
            self._expired.append(request)

    def take_expired(self) -> list[Request]:
        out, self._expired = self._expired, []
        return out

    def deadline_s(self) -> float | None:
        """When the oldest queued request's delay budget runs out (None if the queue is empty)."""
        if not self._queue:
            return None
        return self._queue[0].arrival_s + self.max_queue_delay_s

    def poll(self, now_s: float) -> list[Request] | None:
        """A batch to dispatch now, or None if the batcher should keep waiting."""
        self._expire(now_s)
        if not self._queue:
            return None
        full = self.queued_samples >= self.max_batch
        waited_enough = now_s - self._queue[0].arrival_s >= self.max_queue_delay_s
        if not (full or waited_enough):
            return None
        batch: list[Request] = []
        total = 0
        while self._queue and total + self._queue[0].samples <= self.max_batch:
            request = self._queue.popleft()
            request.dispatch_s = now_s
            request.status = "dispatched"
            total += request.samples
            batch.append(request)
        return batch


def poisson_arrivals(rate_per_s: float, seed: int = 0, start_s: float = 0.0) -> Iterator[float]:
    """Endless Poisson arrival times (exponential gaps with mean 1/rate) starting after ``start_s``."""
    if rate_per_s <= 0:
        raise WorkbenchError(f"open-loop rate {rate_per_s}/s is not positive.", expected="a rate > 0 requests/s")
    rng = np.random.default_rng(seed)
    t = start_s
    while True:
        # Draw in blocks: one numpy call per 4096 arrivals keeps the generator off the hot path.
        for gap in rng.exponential(1.0 / rate_per_s, size=4096):
            t += float(gap)
            yield t


class FakeClock:
    """A manually advanced clock for tests of time-dependent logic."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


Clock = Callable[[], float]
