"""Several models served at once on one device, each with its own lanes, batcher, priority and statistics.

Priorities act in two places. On the GPU each model's lanes are CUDA streams of its priority, so the block
scheduler starts a high-priority kernel's blocks before pending low-priority ones. On the host, with
``contended_inflight`` set, a model dispatches at most that many batches at a time while any model of higher
priority has work waiting or in flight (a kernel already running is never pre-empted by stream priority alone, so
fewer low-priority batches in flight means less to wait behind).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.timing.serving.config import PRIORITIES, ServeConfig
from workbench.timing.serving.result import ModelStats, ReloadReport, Response
from workbench.timing.serving.server import Loader, ModelServer

_RANK = {p: i for i, p in enumerate(PRIORITIES)}  # 0 = high


class EngineManager:
    """Serve several models; ``add`` one, ``submit``/``infer`` to it by name, ``reload`` it, read ``stats``.

    ``switch_interval_s`` shortens Python's thread switch interval (default 5 ms) so one model's dispatcher thread
    never waits long for the interpreter while another's runs; it is restored on ``close``.
    """

    def __init__(self, *, contended_inflight: int | None = None, switch_interval_s: float | None = 0.0005) -> None:
        if contended_inflight is not None and contended_inflight < 1:
            raise WorkbenchError(
                f"contended_inflight={contended_inflight} would stop lower-priority models entirely.",
                expected="None (stream priorities only) or >= 1 batches in flight",
            )
        self.contended_inflight = contended_inflight
        self._servers: dict[str, ModelServer] = {}
        self._old_switch = sys.getswitchinterval()
        if switch_interval_s is not None:
            sys.setswitchinterval(switch_interval_s)

    def add(
        self,
        name: str,
        loader: Loader,
        version: str = "1",
        config: ServeConfig | None = None,
        *,
        golden: Mapping[str, np.ndarray] | None = None,
        seed: int = 0,
        owns_executor: bool = True,
    ) -> ModelServer:
        if name in self._servers:
            raise WorkbenchError(f"a model named {name!r} is already served.", expected="a new model name")
        server = ModelServer(
            name,
            loader,
            version,
            config,
            golden=golden,
            may_dispatch=self._may_dispatch,
            seed=seed,
            owns_executor=owns_executor,
        )
        self._servers[name] = server
        return server

    def __getitem__(self, name: str) -> ModelServer:
        try:
            return self._servers[name]
        except KeyError:
            raise WorkbenchError(
                f"no model named {name!r} is served.", expected=" | ".join(self._servers) or "a model added first"
            ) from None

    @property
    def models(self) -> list[str]:
        return list(self._servers)

    def submit(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
        samples: int | None = None,
    ) -> Future[Response]:
        return self[name].submit(inputs, samples)

    def infer(self, name: str, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> Response:
        return self[name].infer(inputs)

    def reload(self, name: str, loader: Loader, version: str, **check: Any) -> ReloadReport:
        return self[name].reload(loader, version, **check)

    def stats(self, since_s: float | None = None, until_s: float | None = None) -> dict[str, ModelStats]:
        return {name: server.stats(since_s, until_s) for name, server in self._servers.items()}

    def _may_dispatch(self, server: ModelServer) -> bool:
        if self.contended_inflight is None or server.inflight_batches < self.contended_inflight:
            return True
        rank = _RANK[server.priority]
        return not any(
            other.busy for other in self._servers.values() if other is not server and _RANK[other.priority] < rank
        )

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        sys.setswitchinterval(self._old_switch)

    def __enter__(self) -> EngineManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
