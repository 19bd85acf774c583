"""Writes the sample's ten digit images (one per digit, 0-9) as PGM files.

The images are real handwritten digits from scikit-learn's bundled ``load_digits`` data set (the test part
of UCI's "Optical Recognition of Handwritten Digits": 1,797 images of 8x8 pixels, values 0-16; scikit-learn
ships it, so nothing is downloaded). They come from the held-out test split that ``train.py`` never trains
on: for each digit, the first test image of that digit.

This script was run once and its output committed under ``data/``; the sample itself reads only the PGM files
and needs neither scikit-learn nor PyTorch. Run it again only to regenerate them::

    python make_data.py [--out_dir DIR]

``train.py`` imports :func:`load_split` from here, so training and the sample's images use the same split.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_OUT_DIR = HERE / "data"

# The split, shared with train.py: 20 % of the images, stratified by digit, held out for testing.
TEST_FRACTION = 0.2
SPLIT_SEED = 0
# load_digits pixels are counts of set bits in 4x4 blocks of a 32x32 bitmap: integers 0..16.
PIXEL_MAX = 16


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Loads ``load_digits`` and splits it into training and held-out test images.

    Returns:
        ``(train_images, train_labels, test_images, test_labels, test_indices)``: images are uint8 arrays of
        shape (N, 8, 8) with values 0..16, labels int64 arrays of shape (N,), and ``test_indices`` the test
        images' positions in ``load_digits``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.uint8)
    labels = digits.target.astype(np.int64)
    indices = np.arange(len(labels))
    train_idx, test_idx = train_test_split(indices, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels)
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx], test_idx


def write_pgm(path: pathlib.Path, image: np.ndarray, comment: str) -> None:
    """Writes a binary (P5) PGM file with maxval 16, so the data set's pixel values are stored unchanged.

    Args:
        path: The file to write.
        image: A 2-D uint8 array with values 0..16.
        comment: One line of text stored as a ``#`` comment in the header.
    """
    if image.ndim != 2 or image.dtype != np.uint8 or int(image.max()) > PIXEL_MAX:
        raise ValueError(f"expected a 2-D uint8 image with values 0..{PIXEL_MAX}")
    height, width = image.shape
    header = f"P5\n# {comment}\n{width} {height}\n{PIXEL_MAX}\n".encode("ascii")
    path.write_bytes(header + image.tobytes())


def main(argv: list[str] | None = None) -> int:
    """Writes ``digit_0.pgm`` ... ``digit_9.pgm`` into the output folder.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out_dir",
        type=pathlib.Path,
        default=DEFAULT_OUT_DIR,
        help=f"output folder (default: {DEFAULT_OUT_DIR})",
    )
    args = parser.parse_args(argv)

    _, _, test_images, test_labels, test_indices = load_split()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for digit in range(10):
        position = int(np.flatnonzero(test_labels == digit)[0])
        source_index = int(test_indices[position])
        path = args.out_dir / f"digit_{digit}.pgm"
        comment = f"sklearn load_digits image {source_index} (held-out test split), label {digit}"
        write_pgm(path, test_images[position], comment)
        print(f"wrote {path} ({comment})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
