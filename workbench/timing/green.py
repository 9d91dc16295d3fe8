"""SM partitions for lanes: a CUDA green context holding a subset of the GPU's SMs, and streams inside it.

Stream priorities only order thread blocks that are still pending; a low-priority model whose large batches keep
every SM busy still makes a high-priority kernel wait for SM space. A green context confines a model's kernels to a
fixed set of SMs, so the SMs outside it stay free for others. cuda.core (1.2) has no green-context API and this
must not depend on torch, so the driver calls are made through cuda.bindings directly (a handful of calls).

Kernels launched into a green-context stream run on that context's SMs, and so does a CUDA graph captured on such
a stream; a graph captured in the primary context keeps running on every SM even when launched here (measured on
an H200, bench/green_probe.py). Device memory is shared with the primary context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from cuda.bindings import driver
    from cuda.core import Event


def _check(result: Any, what: str) -> Any:
    from cuda.bindings import driver  # type: ignore[import-not-found]

    error, *values = result if isinstance(result, tuple) else (result,)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise WorkbenchError(
            f"{what} failed: {error!r}.",
            expected="a driver with CUDA green contexts (CUDA 12.4 or newer) on a GPU that supports them",
        )
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class GreenStream:
    """The parts of a cuda.core ``Stream`` that lanes use (``handle``, ``record``, ``sync``, ``close``).

    ``confined`` tells executors that a CUDA graph must be captured on this stream to run inside the partition: on
    an H200 a graph captured in the primary context and launched here still ran on every SM (bench/green_probe.py).
    """

    confined = True

    def __init__(self, handle: driver.CUstream) -> None:
        self._stream = handle
        self.handle = handle  # a CUstream, as cuda.core's Stream.handle (int() of it is the raw pointer)

    def record(self, event: Event) -> None:
        from cuda.bindings import driver

        _check(driver.cuEventRecord(event.handle, self._stream), "cuEventRecord")

    def sync(self) -> None:
        from cuda.bindings import driver

        _check(driver.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    def close(self) -> None:
        from cuda.bindings import driver

        if self._stream is not None:
            driver.cuStreamDestroy(self._stream)
            self._stream = None


class _SmPool:
    """One device's SMs as at most two disjoint partitions: a sized one, then the rest of the GPU.

    Disjointness matters: a model outside any partition still spreads its blocks over every SM, including those a
    saturating partition keeps busy, so a high-priority model takes the rest as its own partition. Why only two:
    on an H200, a green context built from several split groups failed CUDA graph capture in cuDNN
    (CUDNN_STATUS_EXECUTION_FAILED), while one split group and its remainder both worked (bench/green_probe.py,
    bench/green_cfg_probe.py).
    """

    def __init__(self, device_index: int) -> None:
        from cuda.bindings import driver

        _check(driver.cuInit(0), "cuInit")
        self.device = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        self.whole = _check(
            driver.cuDeviceGetDevResource(self.device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
            "cuDeviceGetDevResource",
        )
        self.device_sm_count = int(self.whole.sm.smCount)
        major = _check(
            driver.cuDeviceGetAttribute(
                driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device
            ),
            "cuDeviceGetAttribute",
        )
        # Hopper and later: keep the SMs of a cluster together, or kernels launched with thread-block clusters
        # (cuDNN picks some) fail in the partition (CUDNN_STATUS_EXECUTION_FAILED on an H200 without this flag).
        self.flags = (
            int(driver.CUdevSmResourceSplitByCount_flags.CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE)
            if int(major) >= 9
            else 0
        )
        self.group: driver.CUdevResource | None = None
        self.remainder: driver.CUdevResource | None = None
        # part ("group" / "rest") -> its holder: the versions of one model (hot reload) share its part
        self.taken: dict[str, _Holder] = {}

    def take(self, sm_count: int, owner: str | None = None) -> tuple[str, driver.CUdevResource]:
        from cuda.bindings import driver

        for part, holder in self.taken.items():
            if owner is not None and holder.owner == owner:
                holder.count += 1
                return part, self._part(part)
        if not self.taken:
            groups, _count, remainder = _check(
                driver.cuDevSmResourceSplitByCount(1, self.whole, self.flags, int(sm_count)),
                "cuDevSmResourceSplitByCount",
            )
            self.group, self.remainder = groups[0], remainder
            self.taken["group"] = _Holder(owner)
            return "group", self._part("group")
        if "group" in self.taken and "rest" not in self.taken and sm_count <= int(self._part("rest").sm.smCount):
            self.taken["rest"] = _Holder(owner)
            return "rest", self._part("rest")
        raise WorkbenchError(
            f"sm_count={sm_count} does not fit: this GPU ({self.device_sm_count} SMs) is split into one partition "
            f"and the rest of the GPU, and the part asked for is taken or smaller.",
            expected="at most two partitioned models per GPU, the second asking no more than the first leaves; "
            "other models sm_count=None (whole GPU, shared)",
        )

    def give_back(self, part: str) -> None:
        holder = self.taken.get(part)
        if holder is not None:
            holder.count -= 1
            if holder.count <= 0:
                del self.taken[part]

    def _part(self, part: str) -> driver.CUdevResource:
        resource = self.group if part == "group" else self.remainder
        if resource is None:
            raise WorkbenchError(f"the SM partition's {part!r} part was not split off yet.")
        return resource


@dataclass
class _Holder:
    """Who holds a part of the SM pool (a model name, or None) and how many lane sets of it do."""

    owner: str | None
    count: int = 1


_POOLS: dict[int, _SmPool] = {}


class SmPartition:
    """A green context on device ``device_index`` with at least ``sm_count`` SMs, disjoint from the other open
    partition on that device (the first is rounded up to the split's granularity, the second gets all the SMs the
    first left; ``sm_count`` after construction is what was granted). Partitions of the same ``owner`` (the versions
    of one served model during a hot reload) share that owner's SMs instead of taking new ones."""

    def __init__(self, sm_count: int, device_index: int = 0, owner: str | None = None) -> None:
        from cuda.bindings import driver

        if sm_count < 1:
            raise WorkbenchError(f"sm_count={sm_count} gives a model no SMs.", expected="sm_count >= 1 or None")
        pool = _POOLS.get(device_index)
        if pool is None:
            pool = _POOLS[device_index] = _SmPool(device_index)
        self._pool = pool
        self.device_sm_count = pool.device_sm_count
        if sm_count >= self.device_sm_count:
            raise WorkbenchError(
                f"sm_count={sm_count} is not a partition of this GPU ({self.device_sm_count} SMs).",
                expected=f"1 <= sm_count < {self.device_sm_count}, or None for the whole GPU",
            )
        self._part, resource = pool.take(int(sm_count), owner)
        self.sm_count = int(resource.sm.smCount)
        try:
            desc = _check(driver.cuDevResourceGenerateDesc([resource], 1), "cuDevResourceGenerateDesc")
            self._context = _check(
                driver.cuGreenCtxCreate(desc, pool.device, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                "cuGreenCtxCreate",
            )
        except BaseException:
            pool.give_back(self._part)
            raise
        self._streams: list[GreenStream] = []

    def create_stream(self, priority: int = 0) -> GreenStream:
        from cuda.bindings import driver

        handle = _check(
            driver.cuGreenCtxStreamCreate(
                self._context, int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), int(priority)
            ),
            "cuGreenCtxStreamCreate",
        )
        stream = GreenStream(handle)
        self._streams.append(stream)
        return stream

    def close(self) -> None:
        from cuda.bindings import driver

        for stream in self._streams:
            stream.close()
        self._streams = []
        if self._context is not None:
            driver.cuGreenCtxDestroy(self._context)
            self._context = None
            self._pool.give_back(self._part)
