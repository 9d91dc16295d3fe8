"""Which SM splits let cuDNN's ResNet-50 kernels run (H200)? One config per subprocess (failures can be sticky)."""

import subprocess
import sys

CODE = r"""
import sys, torch, torchvision
from cuda.bindings import driver as d
mode = sys.argv[1]
torch.backends.cudnn.benchmark = False
net = torchvision.models.resnet50().half().cuda().eval().to(memory_format=torch.channels_last)
def run_on(handle, label):
    ext = torch.cuda.ExternalStream(int(handle))
    with torch.inference_mode():
        for b in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(b, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
            net(x); torch.cuda.synchronize()
            with torch.cuda.stream(ext):
                net(x)
            torch.cuda.synchronize()
    print(label, "OK", flush=True)
d.cuInit(0); dev = d.cuDeviceGet(0)[1]
whole = d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)[1]
print("whole", whole.sm.smCount, "minPart", whole.sm.minSmPartitionSize, "align", whole.sm.smCoscheduledAlignment, flush=True)
F = int(d.CUdevSmResourceSplitByCount_flags.CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE)
def ctx_stream(res):
    desc = d.cuDevResourceGenerateDesc(res, len(res))
    assert int(desc[0]) == 0, desc[0]
    g = d.cuGreenCtxCreate(desc[1], dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM)
    assert int(g[0]) == 0, g[0]
    st = d.cuGreenCtxStreamCreate(g[1], int(d.CUstream_flags.CU_STREAM_NON_BLOCKING), 0)
    assert int(st[0]) == 0, st[0]
    return st[1]
if mode.startswith("units"):
    _, unit, flag, k = mode.split(":")
    err, groups, n, rem = d.cuDevSmResourceSplitByCount(whole.sm.smCount // int(unit), whole, F if flag == "1" else 0, int(unit))
    print(mode, "err", err, "n", n, "sizes", [g.sm.smCount for g in groups[:n]], "rem", rem.sm.smCount, flush=True)
    a = list(groups[: int(k)]); b = list(groups[int(k): n])
    run_on(ctx_stream(a), f"{mode} first {sum(g.sm.smCount for g in a)}")
    run_on(ctx_stream(b), f"{mode} rest {sum(g.sm.smCount for g in b)}")
elif mode.startswith("rem"):
    _, size = mode.split(":")
    err, groups, n, rem = d.cuDevSmResourceSplitByCount(1, whole, F, int(size))
    print(mode, "group", groups[0].sm.smCount, "rem", rem.sm.smCount, flush=True)
    run_on(ctx_stream([groups[0]]), f"{mode} group")
    run_on(ctx_stream([rem]), f"{mode} remainder")
"""
for mode in sys.argv[1:]:
    r = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, timeout=120)
    text = (r.stdout + r.stderr).splitlines()
    lines = [x for x in text if "OK" in x or x.startswith(("whole", mode)) or "Error" in x]
    print("\n".join(lines[-8:]), "rc", r.returncode, flush=True)
