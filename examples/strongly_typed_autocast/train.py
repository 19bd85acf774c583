"""Trains the sample's small digit classifier and exports it to ONNX (opset 17).

Trains a small CNN (Conv/BatchNorm/ReLU x2, MaxPool, Gemm, LayerNorm, ReLU, Gemm -> 10 logits) on the training
split of scikit-learn's ``load_digits`` (see ``make_data.py``), reports its accuracy on the held-out test
split, and exports it with :func:`onnxprec.export.export_torch` (dynamic batch) to
``model/digits_cnn.onnx``. The file was made once with this script and committed; ``sample.py`` only reads it.

The input normalisation the model expects (pixel / 16, then ``(x - mean) / std`` with the training set's mean
and standard deviation) and the test accuracy are stored in the model's ``metadata_props``.

Needs PyTorch and scikit-learn (not needed by ``sample.py``)::

    pip install torch scikit-learn
    pip install -e <repo root>     # onnxprec, for onnxprec.export
    python train.py [--out PATH] [--epochs N] [--seed N]

Training is seeded and runs on the CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import onnx
import torch
from make_data import PIXEL_MAX, load_split
from torch import nn

from onnxprec._io import write_atomically
from onnxprec._ort import create_session
from onnxprec.export import export_torch

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "model" / "digits_cnn.onnx"
INPUT_NAME = "image"
OUTPUT_NAME = "logits"


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 digit images, returning 10 logits (no softmax).

    BatchNorm gets folded into the convolutions at export time; the LayerNorm after the first fully connected
    layer stays a ``LayerNormalization`` node, a reduction that mixed precision has to treat with care.
    """

    def __init__(self) -> None:
        """Creates the layers."""
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 32 x 4 x 4
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 64),
            nn.LayerNorm(64),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Maps a (N, 1, 8, 8) batch of normalised images to (N, 10) logits."""
        return self.classifier(self.features(x))


def normalise(images: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Turns uint8 (N, 8, 8) images with values 0..16 into the float32 (N, 1, 8, 8) model input."""
    scaled = images.astype(np.float32) / PIXEL_MAX
    return ((scaled - mean) / std)[:, None, :, :].astype(np.float32)


def random_shift(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shifts each image by up to one pixel in each direction (zero padding), a light augmentation."""
    padded = nn.functional.pad(batch, (1, 1, 1, 1), value=float(batch.min()))
    shifted = torch.empty_like(batch)
    offsets = torch.randint(0, 3, (batch.shape[0], 2), generator=generator)
    for index, (dy, dx) in enumerate(offsets.tolist()):
        shifted[index] = padded[index, :, dy : dy + 8, dx : dx + 8]
    return shifted


def train(model: DigitsCNN, inputs: np.ndarray, labels: np.ndarray, epochs: int, seed: int) -> None:
    """Trains the model in place with Adam and a cosine learning-rate schedule.

    Args:
        model: The model to train.
        inputs: Normalised float32 images, (N, 1, 8, 8).
        labels: int64 labels, (N,).
        epochs: Passes over the training data.
        seed: Seed for shuffling and augmentation.
    """
    generator = torch.Generator().manual_seed(seed)
    x_all = torch.from_numpy(inputs)
    y_all = torch.from_numpy(labels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    loss_fn = nn.CrossEntropyLoss()
    batch_size = 64
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(y_all), generator=generator)
        total_loss = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = random_shift(x_all[idx], generator)
            optimizer.zero_grad()
            loss = loss_fn(model(batch), y_all[idx])
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(idx)
        scheduler.step()
        if (epoch + 1) % 10 == 0 or epoch == 0:
            print(f"epoch {epoch + 1:3d}/{epochs}: loss {total_loss / len(y_all):.4f}")


def accuracy_onnx(path: pathlib.Path, inputs: np.ndarray, labels: np.ndarray) -> int:
    """Counts the test images that the exported ONNX model classifies correctly (ONNX Runtime, CPU)."""
    session = create_session(path, optimization="all", what="the exported model")
    (logits,) = session.run({INPUT_NAME: inputs}, [OUTPUT_NAME])
    return int((logits.argmax(axis=1) == labels).sum())


def add_metadata(path: pathlib.Path, metadata: dict[str, str]) -> None:
    """Adds ``metadata_props`` to an ONNX file, rewriting it atomically."""
    proto = onnx.load(path)
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key = key
        entry.value = value
    proto.doc_string = "Handwritten digit classifier for onnxprec's strongly typed AutoCast sample."
    onnx.checker.check_model(proto, full_check=True)
    write_atomically(path, proto.SerializeToString())


def main(argv: list[str] | None = None) -> int:
    """Trains, evaluates and exports the model.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help=f"ONNX file (default: {DEFAULT_OUT})")
    parser.add_argument("--epochs", type=int, default=60, help="training epochs (default: 60)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    train_images, train_labels, test_images, test_labels, _ = load_split()
    scaled = train_images.astype(np.float64) / PIXEL_MAX
    mean, std = round(float(scaled.mean()), 4), round(float(scaled.std()), 4)
    print(f"train {len(train_labels)} images, test {len(test_labels)}; normalisation mean {mean}, std {std}")

    model = DigitsCNN()
    train(model, normalise(train_images, mean, std), train_labels, args.epochs, args.seed)

    test_inputs = normalise(test_images, mean, std)
    model.eval()
    with torch.no_grad():
        torch_correct = int((model(torch.from_numpy(test_inputs)).argmax(1).numpy() == test_labels).sum())
    print(f"PyTorch test accuracy: {torch_correct}/{len(test_labels)}")

    path = export_torch(
        model,
        torch.from_numpy(test_inputs[:4]),
        args.out,
        opset=17,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
    )
    correct = accuracy_onnx(path, test_inputs, test_labels)
    accuracy = correct / len(test_labels)
    add_metadata(
        path,
        {
            "input_pixel_max": str(PIXEL_MAX),
            "input_mean": str(mean),
            "input_std": str(std),
            "input_layout": "NCHW, (N, 1, 8, 8), float32: (pixel / input_pixel_max - input_mean) / input_std",
            "test_accuracy": f"{accuracy:.4f} ({correct}/{len(test_labels)} held-out load_digits images)",
        },
    )
    print(f"ONNX Runtime test accuracy: {correct}/{len(test_labels)} = {accuracy:.2%}")
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
