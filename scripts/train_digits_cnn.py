"""Train the zoo's ``digits-cnn`` and export it to ``workbench/zoo/assets/digits_cnn.onnx`` (opset 17, dynamic batch).

Data: scikit-learn digits upsampled to 32x32 by ``workbench.zoo.digits.digits_dataset`` (the same preprocessing the
zoo uses at evaluation time); the 450-image stratified test split is held out and only scored at the end.
Deterministic: fixed seed, deterministic algorithms, one CPU thread. Takes ~20-40 s on 2 CPU cores.

    .venv/bin/python scripts/train_digits_cnn.py [--epochs 30] [--out workbench/zoo/assets/digits_cnn.onnx]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench._io import atomic_path, write_bytes_atomic  # noqa: E402
from workbench.zoo.base import export_to_onnx  # noqa: E402
from workbench.zoo.digits import DIGITS_ONNX, DIGITS_REFERENCE, INPUT_NAME, OUTPUT_NAME, digits_dataset  # noqa: E402

SEED = 20261202


def build_model():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    torch.manual_seed(SEED)
    return nn.Sequential(
        *block(1, 16, 1),
        *block(16, 32, 2),  # 16x16
        *block(32, 32, 1),
        *block(32, 64, 2),  # 8x8
        *block(64, 64, 2),  # 4x4
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=DIGITS_ONNX)
    parser.add_argument("--reference-out", type=Path, default=DIGITS_REFERENCE)
    args = parser.parse_args()

    import onnx
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    images, labels, train_idx, test_idx = digits_dataset()
    x_train, y_train = torch.from_numpy(images[train_idx]), torch.from_numpy(labels[train_idx])
    x_test, y_test = torch.from_numpy(images[test_idx]), torch.from_numpy(labels[test_idx])

    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    steps_per_epoch = (len(x_train) + 63) // 64
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(SEED)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        total_loss = 0.0
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            # small random shifts (±2 px) so the net does not memorise pixel positions
            shift = torch.randint(-2, 3, (2,), generator=generator).tolist()
            inputs = torch.roll(x_train[batch], shifts=shift, dims=(2, 3))
            loss = torch.nn.functional.cross_entropy(model(inputs), y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.item() * len(batch)
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            print(f"epoch {epoch + 1:3d}  train loss {total_loss / len(order):.4f}")
    model.eval()
    with torch.no_grad():
        test_logits = model(x_test)
    accuracy = float((test_logits.argmax(1) == y_test).float().mean())
    print(
        f"trained in {time.perf_counter() - started:.1f} s; held-out test top-1 (torch) = {accuracy:.4f} on {len(y_test)} images"
    )

    proto = export_to_onnx(
        model,
        (x_test[:1],),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        producer="trt-workbench scripts/train_digits_cnn.py",
    )
    proto.doc_string = "digits-cnn: sklearn digits 32x32, input [N,1,32,32] in [-1,1], output logits [N,10]"
    for key, value in {
        "seed": str(SEED),
        "epochs": str(args.epochs),
        "test_top1_torch": f"{accuracy:.6f}",
        "test_images": str(len(y_test)),
    }.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    write_bytes_atomic(args.out, proto.SerializeToString())
    with atomic_path(args.reference_out) as tmp:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, test_logits=test_logits.numpy().astype(np.float32), test_indices=test_idx)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(proto.graph.node)} nodes) and {args.reference_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
