"""Per-layer time: torch.profiler per module mapped to the exported ONNX nodes (CPU time here), the trtexec
--exportProfile reader (fixture in trtexec's documented format) and the IProfiler accumulator."""

from __future__ import annotations

import io
import json
from pathlib import Path

import onnx
import pytest

from workbench.errors import WorkbenchError
from workbench.timing.layer_profile import (
    LayerProfile,
    onnx_module_path,
    read_trtexec_profile,
    torch_layer_profile,
    trt_layer_profiler,
)

torch = pytest.importorskip("torch")
FIXTURE = Path(__file__).parent / "fixtures" / "trtexec_profile.json"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.relu = torch.nn.ReLU()  # called twice: exported as relu and relu_1
        self.down = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8))

    def forward(self, x):
        return self.relu(self.relu(self.conv(x)) + self.down(x))


def test_module_times_map_to_every_exported_onnx_node() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.Sequential(Block(), Block()),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    ).eval()
    x = torch.randn(4, 3, 32, 32)
    buffer = io.BytesIO()
    torch.onnx.export(net, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    proto = onnx.load_from_string(buffer.getvalue())
    names = [n for n, _ in net.named_modules()]
    assert onnx_module_path("/1/1.0/down/down.0/Conv", names) == "1.0.down.0"
    assert onnx_module_path("/1/1.1/relu_1/Relu", names) == "1.1.relu"
    assert onnx_module_path("/1/1.0/Add", names) == "1.0"  # the residual add belongs to the block

    profile = torch_layer_profile(net, x, onnx_model=proto, iterations=5, warmup=1, model="toy")
    assert profile.clock.startswith("CPU time") and profile.batch == 4 and profile.total_ms > 0
    assert profile.unmapped_onnx_nodes == ()  # every ONNX node found its module
    mapped = {node for layer in profile.layers for node in layer.onnx_nodes}
    assert mapped == {n.name for n in proto.graph.node}
    by_name = {layer.name: layer for layer in profile.layers}
    assert by_name["1.0.conv"].onnx_nodes == ("/1/1.0/conv/Conv",) and by_name["1.0.conv"].time_ms > 0
    assert set(by_name["1.0.relu"].onnx_nodes) == {"/1/1.0/relu/Relu", "/1/1.0/relu_1/Relu"}
    assert "1.0.down.1" in profile.unmapped_modules  # BatchNorm folded into the Conv on export ...
    assert by_name["1.0.down.0"].folded == ("1.0.down.1",) and "1.0.down.1" not in by_name  # ... and its time too
    # self times add up to the whole forward (nothing counted twice, nothing lost)
    assert sum(layer.time_ms for layer in profile.layers) == pytest.approx(profile.total_ms, rel=0.02)
    per_node = profile.per_onnx_node()
    assert per_node["/1/1.0/relu/Relu"] == pytest.approx(by_name["1.0.relu"].time_ms / 2)
    again = LayerProfile.from_json(json.loads(json.dumps(profile.to_json())))
    assert again.layers == profile.layers


def test_trtexec_profile_reader_and_iprofiler_accumulate_layer_times(tmp_path: Path) -> None:
    layer_map = {"/conv1/Conv + /relu/Relu": ["/conv1/Conv", "/relu/Relu"], "/fc/Gemm": ["/fc/Gemm"]}
    profile = read_trtexec_profile(FIXTURE, model="resnet", layer_map=layer_map)
    assert profile.iterations == 120 and not profile.verified
    assert profile.total_ms == pytest.approx(0.09 + 0.06 + 0.01 + 0.04)
    assert profile.per_onnx_node()["/relu/Relu"] == pytest.approx(0.045)
    assert profile.top(1)[0].name == "/conv1/Conv + /relu/Relu"
    assert "Reformatting CopyNode for Input Tensor 0 to /fc/Gemm" in profile.unmapped_modules
    bad = tmp_path / "bad.json"
    bad.write_text('{"Layers": []}')
    with pytest.raises(WorkbenchError, match="not a trtexec layer profile"):
        read_trtexec_profile(bad)

    trt = pytest.importorskip("tensorrt_rtx")
    profiler = trt_layer_profiler(trt)
    assert isinstance(profiler, trt.IProfiler)
    for _ in range(4):  # what TensorRT calls once per layer per profiled inference
        profiler.report_layer_time("/fc/Gemm", 0.5)
        profiler.report_layer_time("/conv1/Conv + /relu/Relu", 1.5)
    result = profiler.profile("resnet", layer_map=layer_map)
    assert result.iterations == 4 and result.total_ms == pytest.approx(2.0)
    assert result.source == "tensorrt IProfiler" and not result.verified
