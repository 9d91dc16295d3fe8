"""What a hot reload's latency bump is made of (issue 15, H200): the reload section of ``bench/serving_gpu.py`` run
with the loader's tuning switched on and off, in one process.

    python3 bench/reload_probe.py --reload-from bench/results/serving_h200_2026-12-03_run2.json --out $OUT/r.json

Variants (``workbench.timing.serving.server``): ``RELOAD_IN_BACKGROUND`` (the new version's graphs run at the lowest
priority until the swap) and ``RELOAD_SWITCH_INTERVAL_S`` (the interpreter's switch interval while it loads); each
variant is run ``--repeats`` times, interleaved. Prints p99 during the swap over steady state per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving_gpu  # noqa: E402  (sets CUDA_DEVICE_MAX_CONNECTIONS first)

from workbench.timing.serving import ServeConfig  # noqa: E402
from workbench.timing.serving import server as server_module  # noqa: E402

VARIANTS = {
    "background + 0.1 ms switch (default)": (True, 0.0001),
    "background + 0.5 ms switch": (True, 0.0005),
    "0.1 ms switch only": (False, 0.0001),
    "neither (before)": (False, 0.0005),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reload-from", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="reload_probe.json")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from VARIANTS")
    args = parser.parse_args()
    earlier = json.loads(Path(args.reload_from).read_text())
    chosen = earlier["sections"]["sla"]["sla_10ms_coordinate"]["chosen"]  # what serving_gpu.py --reload-from takes
    config = ServeConfig.from_json(chosen["config"])
    rate = 0.8 * chosen["best_rate_per_s"]
    module = serving_gpu.resnet()
    results = []
    for repeat in range(args.repeats):
        for name in args.variants.split(","):
            background, interval = VARIANTS[name]
            server_module.RELOAD_IN_BACKGROUND = background
            server_module.RELOAD_SWITCH_INTERVAL_S = interval
            out = serving_gpu.section_reload(module, False, rate, config)
            verdict = out["verdict"]
            row = {
                "variant": name,
                "repeat": repeat,
                "steady_p99_ms": out["steady"]["latency_ms"]["p99"],
                "swap_p99_ms": out["during_swap"]["latency_ms"]["p99"],
                "swap_n": out["during_swap"]["latency_n"],
                "ratio": verdict["p99_swap_over_steady"],
                "failed_or_refused": verdict["failed_or_refused"],
                "broken_rejected": verdict["broken_rejected"],
                "phase_p99": out["phase_p99"],
            }
            results.append(row)
            print(
                f"{name:40s} #{repeat}: steady p99 {row['steady_p99_ms']:.2f} ms, swap p99 {row['swap_p99_ms']:.2f} ms "
                f"(n={row['swap_n']}) -> {row['ratio']:.2f}x; failed/refused {row['failed_or_refused']}, "
                f"broken rejected {row['broken_rejected']}",
                flush=True,
            )
    Path(args.out).write_text(json.dumps({"rate_per_s": rate, "config": config.to_json(), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
