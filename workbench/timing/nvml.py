"""GPU clocks, temperature and power through NVML (``pynvml`` from nvidia-ml-py), when it is available."""

from __future__ import annotations

import time

from workbench.artifact import JsonObject


class NvmlSampler:
    """Samples SM/memory clocks, temperature, power and throttle reasons. ``available`` is False without NVML."""

    def __init__(self, index: int = 0) -> None:
        self.available = False
        self.reason = ""
        self.samples: list[JsonObject] = []
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.name = str(pynvml.nvmlDeviceGetName(self._handle))
            self.available = True
        except Exception as error:  # no library, no driver, no GPU
            self.reason = f"NVML unavailable: {error}"

    def sample(self, label: str = "") -> JsonObject | None:
        if not self.available:
            return None
        n, h = self._nvml, self._handle
        entry: JsonObject = {"t": time.time(), "label": label}
        for key, fn in (
            ("sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            ("mem_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            ("temperature_c", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            ("power_w", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("throttle_reasons", lambda: int(n.nvmlDeviceGetCurrentClocksEventReasons(h))),
        ):
            try:
                entry[key] = fn()
            except Exception:
                entry[key] = None
        self.samples.append(entry)
        return entry
