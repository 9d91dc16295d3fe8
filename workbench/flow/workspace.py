"""What the stages share besides the run record: the zoo entry, output paths and the caches kept between re-runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from workbench._io import validate_outputs
from workbench.calib.session import CalibrationSession
from workbench.engine import BuildOptions
from workbench.errors import WorkbenchError
from workbench.flow.artifacts import QuickstartRun
from workbench.flow.config import QuickstartConfig, calibration_batches
from workbench.model import OnnxModel
from workbench.precision import Precision, PrecisionPlan, apply_precision_plan
from workbench.progress import ProgressFn
from workbench.zoo import ZooEntry, get_entry
from workbench.zoo.base import MetricResult


def quickstart_entry(model: str, data: str = "") -> ZooEntry:
    """The entry the quickstart runs on: a zoo model by name, or an ONNX file (a path) as an
    :class:`~workbench.zoo.onnx_file.OnnxFileEntry`: seeded random inputs, or the ``.npz`` batches in ``data``;
    metric = agreement with its FP32 outputs on the worst output (top-1 accuracy with labels)."""
    if model.endswith(".onnx") or "/" in model or os.sep in model or Path(model).is_file():
        from workbench.zoo.onnx_file import OnnxFileEntry

        return OnnxFileEntry(model, data=data or None)
    if data:
        raise WorkbenchError(
            f"data={data!r} was given for the zoo model {model!r}, which brings its own data set.",
            expected="data only with your own ONNX file (a path), or no data for a zoo model",
        )
    return get_entry(model)


@dataclass(frozen=True)
class _CalibrationKey:
    model_sha256: str
    samples: int


class Workspace:
    """The entry, the output folder and two caches: the calibration session (its statistics are reused across
    range methods) and the FP16 model (rewritten only when the source model changes)."""

    def __init__(self, config: QuickstartConfig) -> None:
        self.entry: ZooEntry = quickstart_entry(config.model, config.data)
        self.model_name = config.model
        self.data = config.data
        self.file_stem = self.entry.name  # names the output files (an ONNX path's stem, or the zoo name)
        self.out = Path(config.out_dir)
        # before any stage runs: a file, FIFO or read-only folder given as out_dir is a message, not an OSError later
        validate_outputs({"out_dir": self.out}, directories=("out_dir",), overwrite=True, is_ours=lambda path: True)
        self._calibration: tuple[_CalibrationKey, CalibrationSession] | None = None
        self._fp16_source: str | None = None  # sha256 of the model fp16.onnx was made from
        # the session's progress callback: a stage with steps of its own (the search's evaluations) reports them here
        self.progress: ProgressFn | None = None

    def matches(self, config: QuickstartConfig) -> bool:
        """Whether ``config`` runs on this workspace (same model, data and output folder)."""
        return self.model_name == config.model and self.data == config.data and self.out == Path(config.out_dir)

    def path(self, suffix: str) -> Path:
        return self.out / f"{self.file_stem}.{suffix}"

    def build_options(self, precision: Precision = "fp32") -> BuildOptions:
        return BuildOptions(shapes=dict(self.entry.input_profiles()), progress=False, precision=precision)

    def source_model(self, run: QuickstartRun) -> OnnxModel:
        """The cleaned model, or the zoo model as shipped when the cleaning stage did not run."""
        return run.model_for_build or self.entry.load()

    def calibration_session(self, run: QuickstartRun) -> CalibrationSession:
        """One session per (model, calibration samples): its statistics are reused across range methods."""
        model = self.source_model(run)
        key = _CalibrationKey(model.sha256, run.config.calibration_samples)
        if self._calibration is None or self._calibration[0] != key:
            session = CalibrationSession(
                model,
                entry=self.entry,
                max_batches=calibration_batches(run.config.calibration_samples),
                progress=False,
            )
            self._calibration = (key, session)
        return self._calibration[1]

    def metric_of(self, run: QuickstartRun, path: Path) -> tuple[MetricResult, bool]:
        """The task metric of the ONNX file at ``path`` on the run's evaluation samples, and whether it was taken
        from the calibration session: a model it already scored on them in this run (the FP32 model, the all-INT8
        model of the rounding it chose) is not run again, since the same bytes, samples and ONNX Runtime settings give
        the same result (a ViT-B/16 spends about two minutes per evaluation on 2 cores)."""
        limit = run.config.evaluation_samples
        if self._calibration is not None:
            from workbench.model import load_onnx

            scored = self._calibration[1].scored_already(load_onnx(path).proto, limit=limit)
            if scored is not None:
                return scored, True
        return self.entry.evaluate_onnx(path, limit=limit), False

    def fp16_onnx(self, run: QuickstartRun) -> Path:
        """The model with FP16 compute (AutoCast rules): what the FP16 variant's metric is measured on."""
        model = self.source_model(run)
        path = self.path("fp16.onnx")
        if self._fp16_source != model.sha256 or not path.is_file():
            apply_precision_plan(model, PrecisionPlan(default="fp16")).save(path)
            self._fp16_source = model.sha256
        return path
