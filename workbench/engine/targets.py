"""Which GPUs can run what: compute capabilities named the ways users write them, and FP8's minimum.

FP8 (E4M3) tensor-core math needs compute capability 8.9 or newer: Ada (8.9: L4, L40, L40S, RTX 40xx, RTX 6000 Ada),
Hopper (9.0: H100, H200), Blackwell (10.0: B200, GB200; 12.x: RTX 50xx, RTX PRO 6000). TensorRT-RTX refuses to
compile FP8 Q/DQ for an older target ("model contains HW-specific datatypes: fp8_e4m3"); it runs on 7.5, 8.0, 8.6,
8.9 and 12.x, so an RTX FP8 engine targets 8.9 and 12.x (Hopper runs full TensorRT's FP8 engines, not RTX ones).
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.errors import WorkbenchError

ComputeCapability = tuple[int, int]

FP8_MIN_COMPUTE_CAPABILITY: ComputeCapability = (8, 9)
FP8_GPUS = "compute capability 8.9+: Ada (L4, L40, L40S, RTX 40xx), Hopper (H100, H200), Blackwell (B200, RTX 50xx)"


def parse_compute_capability(name: str | Sequence[int]) -> ComputeCapability:
    """'SM89', 'sm_89', '8.9', '89' or (8, 9) -> (8, 9); 'SM120' -> (12, 0)."""
    if not isinstance(name, str):
        parts = tuple(int(part) for part in name)
        if len(parts) == 2:
            return (parts[0], parts[1])
        raise WorkbenchError(f"cannot read compute capability {name!r}.", expected="(major, minor), e.g. (8, 9)")
    text = name.strip().upper().replace("SM_", "").replace("SM", "")
    try:
        if "." in text:
            major, minor = text.split(".", 1)
            return (int(major), int(minor))
        if text.isdigit() and len(text) >= 2:
            return (int(text[:-1]), int(text[-1]))
    except ValueError:
        pass
    raise WorkbenchError(f"cannot read compute capability {name!r}.", expected="SM89, sm_89, 8.9 or 89")


def can_run_fp8(compute_capability: str | Sequence[int]) -> bool:
    """Whether a GPU of this compute capability has FP8 tensor cores (8.9 or newer)."""
    return parse_compute_capability(compute_capability) >= FP8_MIN_COMPUTE_CAPABILITY


def rtx_fp8_targets(supported: Sequence[ComputeCapability]) -> tuple[str, ...]:
    """The TensorRT-RTX build targets that can run FP8, as ``SM89``-style names (from the runtime's supported list)."""
    return tuple(f"SM{major}{minor}" for major, minor in supported if (major, minor) >= FP8_MIN_COMPUTE_CAPABILITY)


def fp8_incapable(targets: Sequence[str]) -> list[str]:
    """The requested targets (``SM86``, ``8.6`` ...) that cannot run FP8."""
    return [name for name in targets if not can_run_fp8(name)]


def fp8_support_line(gpu_name: str, compute_capability: Sequence[int] | None) -> tuple[bool, str]:
    """(can run FP8, a sentence saying so) for a detected GPU, or for none."""
    if not compute_capability:
        return False, f"no GPU here; FP8 engines run on {FP8_GPUS}"
    cc = ".".join(str(part) for part in compute_capability)
    if can_run_fp8(compute_capability):
        return True, f"{gpu_name} (compute capability {cc}) has FP8 tensor cores"
    return False, f"{gpu_name} (compute capability {cc}) has no FP8 tensor cores; FP8 engines need {FP8_GPUS}"
