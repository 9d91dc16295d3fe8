"""One served model: admission, dynamic batching into buckets, a dispatcher thread, versions and hot reload.

Requests come from ``submit`` (any thread; answered through a ``concurrent.futures.Future``) or from an open-loop
Poisson load that the dispatcher generates itself (``start_load``: arrival times fixed in advance, so queueing delay
is never hidden). Admission is a bound on requests waiting for dispatch: a request beyond it is answered at once
with status ``refused``. The dispatcher thread batches queued requests (``DynamicBatcher``), pads each batch to
the next prepared bucket, and dispatches it to a free slot of the *active* version; it reads the active version
once per batch, so a reload switches versions at request boundaries and batches already in flight finish on the
version they started on. Every response names its version.

A reload builds, warms and checks the new version on the caller's thread while the old one keeps serving; only a
version that loaded and passed its golden-batch check is handed to the dispatcher.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.timing.batcher import DynamicBatcher, Request, poisson_arrivals
from workbench.timing.executors import Executor, random_feed
from workbench.timing.serving.config import ServeConfig
from workbench.timing.serving.result import ModelStats, ReloadReport, Response, latency_summary
from workbench.timing.serving.runtime import VersionRuntime

Loader = Callable[[], Executor]
_STATUS_CODE = {"ok": 0, "refused": 1, "expired": 2, "failed": 3}
_CODE_STATUS = {v: k for k, v in _STATUS_CODE.items()}


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Hold Python's cyclic collector off while a new version loads next to live traffic.

    Why: loading allocates many objects, and the full collection that triggers scans every object the process holds
    (torch's included) with the GIL held, so the dispatcher thread stalls for tens to hundreds of milliseconds.
    ``gc.freeze`` moves what exists out of the collector's view; both are undone when the reload ends.
    """
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


# While a new version loads next to live traffic: the interpreter's thread switch interval (the dispatcher waits at
# most this long for the GIL while the loader runs Python), and whether its GPU work runs at the lowest priority.
RELOAD_SWITCH_INTERVAL_S = 0.0001
RELOAD_IN_BACKGROUND = True


@dataclass
class ServeRequest(Request):
    inputs: Any = None
    future: Future[Response] | None = None
    want_outputs: bool = False


class _Batch:
    __slots__ = ("requests", "samples", "padded", "runtime", "key", "dispatch_s")

    def __init__(self, requests: list[ServeRequest], samples: int, padded: int, runtime: VersionRuntime, key, now):
        self.requests, self.samples, self.padded, self.runtime, self.key = requests, samples, padded, runtime, key
        self.dispatch_s = now


class _Load:
    def __init__(self, rate_per_s: float, start_s: float, stop_s: float, seed: int) -> None:
        self.rate = rate_per_s
        self.stop_s = stop_s
        self.arrivals: Iterator[float] = poisson_arrivals(rate_per_s, seed=seed, start_s=start_s)
        self.next_s = next(self.arrivals)
        self.done = threading.Event()


class ModelServer:
    """Serve one model; see the module docstring. Use :class:`~workbench.timing.serving.EngineManager` for several.

    ``loader`` builds the executor of ``version`` (called here, on this thread). ``golden`` is the batch every later
    version is checked on (default: ``min(8, max_batch)`` deterministic random samples); the first version's
    outputs on it are the reference unless ``reference`` outputs are given to ``reload``.
    """

    def __init__(
        self,
        name: str,
        loader: Loader,
        version: str,
        config: ServeConfig | None = None,
        *,
        golden: Mapping[str, np.ndarray] | None = None,
        may_dispatch: Callable[[ModelServer], bool] | None = None,
        idle_poll_s: float = 50e-6,
        seed: int = 0,
        owns_executor: bool = True,
    ) -> None:
        self.name = name
        self._owns_executor = owns_executor  # False: close() leaves the first version's executor open (reuse)
        self.config = config or ServeConfig()
        self._seed = seed
        self._idle_poll_s = idle_poll_s
        self._may_dispatch = may_dispatch
        try:
            executor = loader()
        except WorkbenchError:
            raise
        except Exception as error:
            raise WorkbenchError(f"{name} {version}: the loader failed: {type(error).__name__}: {error}") from error
        runtime = VersionRuntime(name, version, executor, self.config, seed=seed)
        runtime.warm_up()
        self.golden = (
            dict(golden)
            if golden is not None
            else random_feed(executor.inputs, min(8, runtime.max_batch), seed=seed + 7)
        )
        runtime.golden_outputs = runtime.run_batch(self.golden)  # type: ignore[attr-defined]
        self._active = runtime
        self._swap_to: VersionRuntime | None = None
        self._swapped = threading.Event()
        self._retired: list[VersionRuntime] = []
        self.versions: list[str] = [version]  # accepted versions, in order
        self._all_versions: list[str] = [version]  # index -> version label of per-request records
        self.reloads: list[ReloadReport] = []

        self._batcher = DynamicBatcher(
            self.config.max_batch,
            self.config.max_queue_delay_ms / 1e3,
            None if self.config.timeout_ms is None else self.config.timeout_ms / 1e3,
        )
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._inbox: collections.deque[ServeRequest] = collections.deque()
        self._pending = 0  # admitted, not yet dispatched (inbox + batcher)
        self._wake = threading.Event()
        self._load: _Load | None = None
        self._load_request: _Load | None = None
        self._recent_arrivals: collections.deque[float] = collections.deque(maxlen=64)
        self._inflight: dict[tuple[int, int, int], _Batch] = {}
        # Per-request records (one writer: the dispatcher; refusals from submit go under the lock).
        self._arrival: list[float] = []
        self._done: list[float] = []
        self._queue_s: list[float] = []
        self._status: list[int] = []
        self._version_of: list[int] = []
        self._batch_log: list[tuple[float, int, int]] = []  # (first arrival_s, samples, padded)
        self._error: BaseException | None = None
        self._stop = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"serve-{name}")
        self._thread.start()

    # --- public API --------------------------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._active.version

    @property
    def priority(self) -> str:
        return self.config.priority

    @property
    def busy(self) -> bool:
        """Work waiting or in flight (what a lower-priority model's dispatch gate looks at)."""
        return self._pending > 0 or bool(self._inflight)

    @property
    def inflight_batches(self) -> int:
        return len(self._inflight)

    def submit(
        self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None, samples: int | None = None
    ) -> Future[Response]:
        """Queue one request (batch-first ``inputs``, or ``samples`` synthetic samples); the future holds its
        Response. A full queue or a closed server answers at once with status ``refused``."""
        if inputs is not None:
            first = inputs[next(iter(inputs))] if isinstance(inputs, Mapping) else inputs[0]
            samples = int(np.asarray(first).shape[0])
        samples = int(samples or 1)
        if not 1 <= samples <= self.config.max_batch:
            raise WorkbenchError(
                f"{self.name}: a request of {samples} samples does not fit the batch.",
                expected=f"1..{self.config.max_batch} samples per request",
            )
        future: Future[Response] = Future()
        now = time.perf_counter()
        request = ServeRequest(next(self._ids), now, samples, inputs=inputs, future=future, want_outputs=True)
        with self._lock:
            reason = "server closed" if self._stop else ""
            if not reason and self._pending >= self.config.queue_capacity:
                reason = f"queue full ({self.config.queue_capacity} requests waiting)"
            if reason:
                self._record_refusal(now)
                future.set_result(Response(request.request_id, self.name, None, "refused", reason=reason))
                return future
            self._pending += 1
            self._inbox.append(request)
        self._wake.set()
        return future

    def infer(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], timeout_s: float | None = 60.0):
        """Submit and wait: the Response."""
        return self.submit(inputs).result(timeout=timeout_s)

    def start_load(self, rate_per_s: float, duration_s: float, seed: int = 0) -> float:
        """Open-loop Poisson arrivals generated by the dispatcher for ``duration_s``; returns the start time."""
        if self._load is not None or self._load_request is not None:
            raise WorkbenchError(f"{self.name}: a load is already running.")
        start = time.perf_counter() + 0.002
        load = _Load(float(rate_per_s), start, start + float(duration_s), seed)
        self._load_request = load
        self._wake.set()
        return start

    def wait_load(self, timeout_s: float = 120.0) -> None:
        load = self._load or self._load_request
        if load is None:
            return
        if not load.done.wait(timeout_s):
            raise WorkbenchError(f"{self.name}: the load did not finish within {timeout_s} s.")
        self._raise_if_failed()

    def run_load(self, rate_per_s: float, duration_s: float, warmup_s: float = 0.2, seed: int = 0) -> ModelStats:
        """Run an open-loop load and return the statistics of the requests that arrived after ``warmup_s``."""
        start = self.start_load(rate_per_s, duration_s + warmup_s, seed=seed)
        self.wait_load(timeout_s=duration_s + warmup_s + 120)
        return self.stats(since_s=start + warmup_s, until_s=start + warmup_s + duration_s)

    def reload(
        self,
        loader: Loader,
        version: str,
        *,
        reference: Sequence[np.ndarray] | None = None,
        rtol: float = 1e-3,
        atol: float = 1e-3,
        drain_timeout_s: float = 60.0,
    ) -> ReloadReport:
        """Load ``version`` on the side, warm it, check it on the golden batch, then switch to it.

        The check compares the new version's outputs with ``reference`` (if given) or the active version's outputs
        on the same golden batch, elementwise within ``atol + rtol * |expected|``; non-finite outputs fail. A version
        that fails to load or to check is closed and reported (``accepted=False``); the old one keeps serving.
        """
        # The reload's Python work (building the executor, capturing graphs) shares the interpreter with the
        # dispatcher thread; a short switch interval keeps the dispatcher's waits for the GIL short meanwhile.
        previous_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(previous_interval, RELOAD_SWITCH_INTERVAL_S))
        try:
            with quiet_gc():
                return self._reload(loader, version, reference, rtol, atol, drain_timeout_s)
        finally:
            sys.setswitchinterval(previous_interval)

    def _reload(
        self,
        loader: Loader,
        version: str,
        reference: Sequence[np.ndarray] | None,
        rtol: float,
        atol: float,
        drain_timeout_s: float,
    ) -> ReloadReport:
        old = self._active
        started = time.perf_counter()
        phases: dict[str, float] = {}

        def rejected(stage: str, reason: str, **extra: Any) -> ReloadReport:
            report = ReloadReport(
                self.name,
                old.version,
                version,
                False,
                stage,
                reason,
                rtol=rtol,
                atol=atol,
                started_s=started,
                phases=dict(phases),
                **extra,
            )
            self.reloads.append(report)
            return report

        if version in self.versions:
            return rejected("load", f"version {version!r} was already served; versions must be new")
        runtime: VersionRuntime | None = None
        try:
            executor = loader()
            phases["executor_built"] = time.perf_counter()
            runtime = VersionRuntime(
                self.name, version, executor, self.config, seed=self._seed, background=RELOAD_IN_BACKGROUND
            )
            phases["lanes_ready"] = time.perf_counter()
            runtime.warm_up()
            phases["warmed_up"] = time.perf_counter()
        except Exception as error:
            if runtime is not None:
                runtime.close()
            return rejected("load", f"{type(error).__name__}: {error}", load_s=time.perf_counter() - started)
        load_s = time.perf_counter() - started
        checked = time.perf_counter()
        try:
            outputs = runtime.run_batch(self.golden)
            expected = list(reference) if reference is not None else old.golden_outputs  # type: ignore[attr-defined]
            max_abs, max_rel, why = compare_outputs(outputs, expected, rtol, atol)
        except Exception as error:
            runtime.close()
            return rejected("check", f"{type(error).__name__}: {error}", load_s=load_s)
        check_s = time.perf_counter() - checked
        phases["checked"] = time.perf_counter()
        n_golden = int(np.asarray(next(iter(self.golden.values()))).shape[0])
        if why:
            runtime.close()
            _close_executor(runtime.executor)
            return rejected(
                "check",
                why,
                max_abs_error=max_abs,
                max_rel_error=max_rel,
                golden_samples=n_golden,
                load_s=load_s,
                check_s=check_s,
            )
        runtime.golden_outputs = outputs  # type: ignore[attr-defined]
        try:
            runtime.promote()
        except Exception as error:
            runtime.close()
            return rejected("load", f"could not give the new version its priority: {error}", load_s=load_s)
        runtime.drained = threading.Event()  # type: ignore[attr-defined]
        old.drained = threading.Event()  # type: ignore[attr-defined]
        self._swapped.clear()
        self._swap_to = runtime
        self._wake.set()
        if not self._swapped.wait(30.0):
            raise WorkbenchError(f"{self.name}: the dispatcher did not take the new version within 30 s.")
        swapped = self._swapped_at
        old.drained.wait(drain_timeout_s)  # type: ignore[attr-defined]
        drained = getattr(old, "drained_s", math.nan)
        old.close()
        if self._owns_executor or old.version != self._all_versions[0]:
            _close_executor(old.executor)
        phases["old_closed"] = time.perf_counter()
        self.versions.append(version)
        report = ReloadReport(
            self.name,
            old.version,
            version,
            True,
            "swapped",
            "",
            max_abs,
            max_rel,
            rtol,
            atol,
            n_golden,
            load_s,
            check_s,
            started,
            swapped,
            drained,
            phases,
        )
        self.reloads.append(report)
        return report

    def stats(self, since_s: float | None = None, until_s: float | None = None) -> ModelStats:
        """Statistics over requests that arrived in [since_s, until_s] (default: all), however they ended."""
        with self._lock:
            n = len(self._status)
            arrival = np.asarray(self._arrival[:n])
            done = np.asarray(self._done[:n])
            queue_s = np.asarray(self._queue_s[:n])
            status = np.asarray(self._status[:n], dtype=np.int8)
            version_of = np.asarray(self._version_of[:n], dtype=np.int32)
            batches = list(self._batch_log)
        lo = -math.inf if since_s is None else since_s
        hi = math.inf if until_s is None else until_s
        mask = (arrival >= lo) & (arrival <= hi)
        if since_s is None:
            lo = float(arrival.min()) if arrival.size else 0.0
        if until_s is None:
            hi = float(arrival.max()) if arrival.size else lo
        window = max(hi - lo, 1e-9)
        ok = mask & (status == 0)
        latencies = (done[ok] - arrival[ok]) * 1e3
        point, ci, reliable, n_lat = latency_summary(latencies)
        in_window = [b for b in batches if lo <= b[0] <= hi]
        samples = sum(b[1] for b in in_window)
        padded = sum(b[2] for b in in_window)
        buckets: dict[int, int] = {}
        for b in in_window:
            buckets[b[2]] = buckets.get(b[2], 0) + 1
        by_version: dict[str, int] = {}
        for index, count in zip(*np.unique(version_of[ok], return_counts=True)):
            by_version[self._all_versions[int(index)]] = int(count)
        samples_ok = int(ok.sum())
        return ModelStats(
            model=self.name,
            active_version=self._active.version,
            versions=tuple(self.versions),
            priority=self.config.priority,
            stream_priority=self._active.stream_priority,
            config=self.config,
            window_s=window,
            offered=int(mask.sum()),
            refused=int((mask & (status == 1)).sum()),
            expired=int((mask & (status == 2)).sum()),
            failed=int((mask & (status == 3)).sum()),
            completed=samples_ok,
            throughput_per_s=samples_ok / window,
            samples_per_s=samples / window,
            batches=len(in_window),
            mean_batch=samples / len(in_window) if in_window else 0.0,
            padding_fraction=(padded - samples) / padded if padded else 0.0,
            bucket_counts=dict(sorted(buckets.items())),
            responses_by_version=by_version,
            latency_ms=point,
            latency_ci_ms=ci,
            latency_n=n_lat,
            latency_reliable=reliable,
            queue_ms_p50=float(np.median(queue_s[ok]) * 1e3) if ok.any() else math.nan,
            pending_at_end=self._pending,
        )

    def latencies(self, since_s: float | None = None, until_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(arrival_s, latency_ms) of the requests that completed, arrivals in [since_s, until_s]."""
        with self._lock:
            n = len(self._status)
            arrival = np.asarray(self._arrival[:n])
            done = np.asarray(self._done[:n])
            status = np.asarray(self._status[:n])
        mask = status == 0
        if since_s is not None:
            mask &= arrival >= since_s
        if until_s is not None:
            mask &= arrival <= until_s
        return arrival[mask], (done[mask] - arrival[mask]) * 1e3

    def responses_log(
        self, since_s: float | None = None, until_s: float | None = None
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(arrival_s, latency_ms, version) of every completed request that arrived in [since_s, until_s]."""
        with self._lock:
            n = len(self._status)
            arrival = np.asarray(self._arrival[:n])
            done = np.asarray(self._done[:n])
            status = np.asarray(self._status[:n])
            version_of = np.asarray(self._version_of[:n], dtype=np.int64)
        mask = status == 0
        if since_s is not None:
            mask &= arrival >= since_s
        if until_s is not None:
            mask &= arrival <= until_s
        names = [self._all_versions[i] for i in version_of[mask]]
        return arrival[mask], (done[mask] - arrival[mask]) * 1e3, names

    def reset_stats(self) -> None:
        with self._lock:
            for items in (self._arrival, self._done, self._queue_s, self._status, self._version_of, self._batch_log):
                items.clear()

    def close(self) -> None:
        """Stop accepting requests, finish the queued and in-flight ones, release every version."""
        if self._closed:
            return
        with self._lock:
            self._stop = True
        self._wake.set()
        self._thread.join(timeout=60)
        self._closed = True
        for runtime in [self._active, *self._retired]:
            runtime.close()
            if self._owns_executor or runtime.version != self._all_versions[0]:
                _close_executor(runtime.executor)

    def __enter__(self) -> ModelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- dispatcher thread -------------------------------------------------------------------------------------

    _swapped_at = math.nan

    def _run(self) -> None:
        try:
            if self._active.device == "cuda":
                from cuda.core import Device  # type: ignore[import-not-found]

                Device().set_current()  # driver calls from this thread need the context current
            self._dispatch_loop()
        except BaseException as error:  # surfaced to callers by wait_load / stats
            self._error = error
            self._fail_everything(f"dispatcher stopped: {type(error).__name__}: {error}")
            if self._load is not None:
                self._load.done.set()

    def _dispatch_loop(self) -> None:
        clock = time.perf_counter
        batcher = self._batcher
        config = self.config
        cap_s = config.max_queue_delay_ms / 1e3
        idle = self._idle_poll_s
        while True:
            now = clock()
            if self._swap_to is not None:
                self._take_new_version(now)
            if self._load_request is not None:
                self._load, self._load_request = self._load_request, None
            self._intake(now)
            if self._inflight:
                self._reap(blocking=False)
            runtime = self._active
            load = self._load
            if load is not None and load.next_s > load.stop_s and not self._pending and not self._inflight:
                self._load = None
                load.done.set()
                continue
            if self._stop and not self._pending and not self._inflight and not self._inbox and load is None:
                return
            gate_open = self._may_dispatch is None or self._may_dispatch(self)
            if runtime.free and gate_open and len(batcher):
                batcher.max_queue_delay_s = self._delay_s(runtime, now, cap_s) if config.adaptive_delay else cap_s
                batch = batcher.poll(now)
                expired = batcher.take_expired()
                if expired:
                    self._finish_unrun(expired, "expired", f"waited over {config.timeout_ms} ms in the queue")
                if batch:
                    self._dispatch(runtime, batch, now)
                    continue
            # Nothing to dispatch now: wait for a completion, an arrival, a batch deadline or a submit.
            if self._inflight and (not runtime.free or not gate_open):
                if gate_open:
                    self._reap(blocking=True)
                else:
                    time.sleep(idle)
                continue
            wake = math.inf
            if load is not None:
                wake = load.next_s
            deadline = batcher.deadline_s()
            if deadline is not None:
                wake = min(wake, deadline)
            if self._inflight or len(batcher):
                time.sleep(min(max(wake - clock(), 0.0), idle))
            elif math.isfinite(wake):
                gap = wake - clock()
                if gap > 0:
                    self._wake.wait(min(gap, 0.01))
                    self._wake.clear()
            else:
                self._wake.wait(0.01)
                self._wake.clear()

    def _take_new_version(self, now: float) -> None:
        old, self._active = self._active, self._swap_to  # type: ignore[assignment]
        self._swap_to = None
        self._all_versions.append(self._active.version)
        self._retired.append(old)
        self._swapped_at = now
        if not any(b.runtime is old for b in self._inflight.values()):
            old.drained_s = now  # type: ignore[attr-defined]
            old.drained.set()  # type: ignore[attr-defined]
        self._swapped.set()

    def _intake(self, now: float) -> None:
        inbox = self._inbox
        while inbox:
            request = inbox.popleft()
            self._recent_arrivals.append(request.arrival_s)
            self._batcher.offer(request)
        load = self._load
        if load is None:
            return
        capacity = self.config.queue_capacity
        while load.next_s <= now and load.next_s <= load.stop_s:
            arrival = load.next_s
            load.next_s = next(load.arrivals)
            self._recent_arrivals.append(arrival)
            with self._lock:
                if self._pending >= capacity:
                    self._record_refusal(arrival)
                    continue
                self._pending += 1
            self._batcher.offer(ServeRequest(next(self._ids), arrival, 1))

    def _delay_s(self, runtime: VersionRuntime, now: float, cap_s: float) -> float:
        recent = self._recent_arrivals
        if cap_s <= 0 or len(recent) < 2:
            return 0.0
        rate = (len(recent) - 1) / max(now - recent[0], 1e-6)
        return adaptive_delay_s(rate, runtime.service_ms, self._batcher.queued_samples, cap_s)

    def _dispatch(self, runtime: VersionRuntime, batch: list[Request], now: float) -> None:
        samples = sum(r.samples for r in batch)
        padded = self.config.pad(samples)
        key = runtime.free.popleft()
        row = 0
        for request in batch:
            if getattr(request, "inputs", None) is not None:
                runtime.write_inputs(key[0], key[1], row, request.inputs)  # type: ignore[attr-defined]
            row += request.samples
        runtime.lanes.submit(key[0], key[1], padded)
        with self._lock:
            self._pending -= len(batch)
            self._batch_log.append((batch[0].arrival_s, samples, padded))
        self._inflight[(id(runtime), key[0], key[1])] = _Batch(batch, samples, padded, runtime, key, now)  # type: ignore[arg-type]

    def _reap(self, blocking: bool) -> None:
        if blocking:
            oldest = next(iter(self._inflight))
            batch = self._inflight[oldest]
            try:
                batch.runtime.lanes.wait(*batch.key)
            except WorkbenchError as error:
                self._complete(oldest, error)
                return
            self._complete(oldest, None)
        for k in list(self._inflight):
            batch = self._inflight[k]
            if batch.runtime.lanes.is_done(*batch.key):
                try:
                    batch.runtime.lanes.wait(*batch.key)
                except WorkbenchError as error:
                    self._complete(k, error)
                    continue
                self._complete(k, None)

    def _complete(self, k: tuple[int, int, int], error: BaseException | None) -> None:
        batch = self._inflight.pop(k)
        runtime = batch.runtime
        version_index = self._all_versions.index(runtime.version)
        if error is None:
            spans = runtime.lanes.spans_ms(*batch.key)
            done = runtime.t0_host + spans[3] / 1e3
            service = spans[3] - spans[0]
            if batch.padded in runtime.service_ms:  # running estimate for the adaptive delay
                runtime.service_ms[batch.padded] = 0.9 * runtime.service_ms[batch.padded] + 0.1 * service
        else:
            done = time.perf_counter()
        status = 0 if error is None else 3
        row = 0
        with self._lock:
            for request in batch.requests:
                self._arrival.append(request.arrival_s)
                self._done.append(done)
                self._queue_s.append(batch.dispatch_s - request.arrival_s)
                self._status.append(status)
                self._version_of.append(version_index)
        for request in batch.requests:
            future = request.future  # type: ignore[attr-defined]
            if future is not None:
                outputs = None
                if error is None and request.want_outputs:  # type: ignore[attr-defined]
                    outputs = tuple(runtime.read_outputs(batch.key[0], batch.key[1], row, row + request.samples))
                future.set_result(
                    Response(
                        request.request_id,
                        self.name,
                        runtime.version,
                        "ok" if error is None else "failed",
                        (done - request.arrival_s) * 1e3,
                        (batch.dispatch_s - request.arrival_s) * 1e3,
                        batch.samples,
                        batch.padded,
                        outputs,
                        "" if error is None else str(error),
                    )
                )
            row += request.samples
        if runtime is self._active:
            runtime.free.append(batch.key)
        elif not any(b.runtime is runtime for b in self._inflight.values()):
            # A batch timed before the swap can be handed back after it: the old version is drained at the swap then.
            runtime.drained_s = max(done, self._swapped_at)  # type: ignore[attr-defined]
            runtime.drained.set()  # type: ignore[attr-defined]

    def _finish_unrun(self, requests: list[Request], status: str, reason: str) -> None:
        now = time.perf_counter()
        with self._lock:
            self._pending -= len(requests)
            for request in requests:
                self._arrival.append(request.arrival_s)
                self._done.append(now)
                self._queue_s.append(now - request.arrival_s)
                self._status.append(_STATUS_CODE[status])
                self._version_of.append(-1)
        for request in requests:
            future = getattr(request, "future", None)
            if future is not None and not future.done():
                future.set_result(Response(request.request_id, self.name, None, status, reason=reason))

    def _record_refusal(self, arrival: float) -> None:
        # caller holds self._lock
        self._arrival.append(arrival)
        self._done.append(arrival)
        self._queue_s.append(0.0)
        self._status.append(1)
        self._version_of.append(-1)

    def _fail_everything(self, reason: str) -> None:
        leftover: list[Request] = list(self._inbox)
        self._inbox.clear()
        while len(self._batcher):
            leftover.extend(self._batcher.poll(math.inf) or [])
        for batch in self._inflight.values():
            leftover.extend(batch.requests)
        self._inflight.clear()
        self._finish_unrun(leftover, "failed", reason)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WorkbenchError(f"{self.name}: the dispatcher failed: {self._error}") from self._error


def adaptive_delay_s(rate_per_s: float, service_ms: Mapping[int, float], queued_samples: int, cap_s: float) -> float:
    """How long a free lane should wait for more requests (the batcher's delay, counted from the oldest arrival).

    The target batch is the smallest bucket that keeps up with the arrival rate when batches of it run one after
    another (``size / service time >= 1.1 x rate``; the largest bucket if none does). If that many samples are
    queued, dispatch now; otherwise wait as long as the rate needs to bring them (``target / rate``), never more
    than ``cap_s``. Low rates give no wait (single requests keep up); rising rates wait for bigger batches.
    """
    if cap_s <= 0 or rate_per_s <= 0 or not service_ms:
        return 0.0
    sizes = sorted(service_ms)
    target = sizes[-1]
    for size in sizes:
        if size / max(service_ms[size], 1e-6) * 1e3 >= 1.1 * rate_per_s:
            target = size
            break
    if queued_samples >= target:
        return 0.0
    return min(cap_s, target / rate_per_s)


def compare_outputs(
    outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float, atol: float
) -> tuple[float, float, str]:
    """(max abs error, max relative error, why it failed or ''), elementwise |a - e| <= atol + rtol * |e|."""
    if len(outputs) != len(expected):
        return math.nan, math.nan, f"{len(outputs)} outputs, expected {len(expected)}"
    max_abs = max_rel = 0.0
    for index, (got, want) in enumerate(zip(outputs, expected)):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return math.nan, math.nan, f"output {index} has shape {got.shape}, expected {want.shape}"
        if not np.all(np.isfinite(got)):
            return math.nan, math.nan, f"output {index} has {int((~np.isfinite(got)).sum())} non-finite values"
        diff = np.abs(got - want)
        max_abs = max(max_abs, float(diff.max(initial=0.0)))
        max_rel = max(max_rel, float((diff / np.maximum(np.abs(want), 1e-12)).max(initial=0.0)))
        bad = diff > atol + rtol * np.abs(want)
        if bad.any():
            return (
                max_abs,
                max_rel,
                (
                    f"output {index}: {int(bad.sum())} of {bad.size} values differ beyond atol={atol:g} + rtol={rtol:g}"
                    f" x |expected| (max abs error {float(diff.max()):.3g})"
                ),
            )
    return max_abs, max_rel, ""


def _close_executor(executor: object) -> None:
    close = getattr(executor, "close", None)
    if close is not None:
        close()
