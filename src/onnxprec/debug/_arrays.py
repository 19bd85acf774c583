"""Arrays to files and back: raw little-endian ``.bin``, one value a line ``.txt``, safe file names, statistics.

Text is made with vectorised numpy (several times faster than ``np.savetxt``): floats of 32 bits or fewer as 9
significant digits in signed scientific notation (``+1.25730217e-01``, ``-3.00000000e+02``: fixed width, and
9 digits round-trip every float32, hence every float16 and bfloat16 value), float64 with Python's shortest
round-trip ``repr``, integers and booleans as decimal integers; ``nan``, ``inf`` and ``-inf`` as such.
``np.loadtxt(path, dtype=...)`` reads a file back.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from typing import Any, BinaryIO

import numpy as np

__all__ = ["statistics", "write_binary", "write_text"]

_SLICE = 1 << 20  # values formatted per step (16 MiB of text for floats)
_MIN_PARALLEL = 1 << 15  # smaller slices are not worth a thread
_STATS_PART = 1 << 22
_POWER_OFFSET = 60  # _POWERS[e + _POWER_OFFSET] == 10.0**e for the exponents of float32 values and their mantissas
_POWERS = 10.0 ** np.arange(-_POWER_OFFSET, 50, dtype=np.float64)


def _is_float(dtype: np.dtype) -> bool:
    """numpy floats and the ml_dtypes float types (bfloat16, float8...)."""
    return bool(np.issubdtype(dtype, np.floating)) or "float" in str(dtype)


def write_binary(stream: BinaryIO, array: np.ndarray) -> None:
    """The array's elements in C order, little-endian, nothing else (``np.fromfile(path, dtype)`` reads it)."""
    data = np.ascontiguousarray(array)
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    stream.write(data.reshape(-1).view(np.uint8).data)


# --------------------------------------------------------------------------------------------------
# Text


def _words(texts: list[bytes]) -> np.ndarray:
    """4-byte texts as native uint32 words (a row of ``[n, 4]`` uint8 read as one number)."""
    rows = np.frombuffer(b"".join(t.ljust(4, b"\0") for t in texts), dtype=np.uint8).reshape(-1, 4)
    return rows.view(np.uint32)[:, 0]


# A float line is 16 bytes, 4 words: [± d0 . d1] [d2 d3 d4 d5] [d6 d7 d8 e] [± x x \n], each from a table indexed
# by the digits it shows. Fixed width (the sign is always written), so the lines are the words' bytes as they are.
_LEAD = _words([b"+%d.%d" % divmod(i, 10) for i in range(100)] + [b"-%d.%d" % divmod(i, 10) for i in range(100)])
_FOUR = _words([b"%04d" % i for i in range(10_000)])
_THREE = _words([b"%03de" % i for i in range(1000)])
_EXPONENT_OFFSET = 60
_EXPONENT = _words([b"%+03d\n" % e for e in range(-_EXPONENT_OFFSET, 50)])


def _float_text(values: np.ndarray) -> bytes:
    """``-d.dddddddde±xx`` lines of 32-bit-or-narrower floats."""
    x32 = values.astype(np.float32)
    negative = np.signbit(x32)
    finite = np.isfinite(x32)
    a32 = np.where(finite, np.abs(x32), np.float32(0))
    nonzero = a32 > 0
    exponent = np.floor(np.log10(np.where(nonzero, a32, np.float32(1)))).astype(np.int32)
    a = a32.astype(np.float64)
    mantissa = np.rint(a / _POWERS[exponent + (_POWER_OFFSET - 8)])
    # float32's log10 may be one off next to a power of ten: fix the exponent where the mantissa has 8 or 10 digits
    for wrong, step in ((nonzero & (mantissa < 1e8), -1), (mantissa >= 1e9, 1)):
        if wrong.any():
            exponent[wrong] += step
            mantissa[wrong] = np.rint(a[wrong] / _POWERS[exponent[wrong] + (_POWER_OFFSET - 8)])
    digits = mantissa.astype(np.uint32)
    words = np.empty((x32.size, 4), dtype=np.uint32)
    words[:, 0] = _LEAD[digits // np.uint32(10_000_000) + np.where(negative, 100, 0).astype(np.uint32)]
    words[:, 1] = _FOUR[(digits // np.uint32(1000)) % np.uint32(10_000)]
    words[:, 2] = _THREE[digits % np.uint32(1000)]
    words[:, 3] = _EXPONENT[exponent + _EXPONENT_OFFSET]
    chars = words.view(np.uint8).reshape(-1, 16)
    special = ~finite
    if not special.any():
        return chars.tobytes()
    chars[special] = 0  # nan, inf, -inf: shorter lines, the zero bytes are dropped
    chars[special, 15] = ord("\n")
    nan = np.isnan(x32)
    for word, rows in ((b"nan", nan), (b"inf", special & ~nan)):
        if rows.any():
            chars[np.ix_(rows, np.arange(1, 4))] = np.frombuffer(word, dtype=np.uint8)
    chars[special & ~nan & negative, 0] = ord("-")
    return chars[chars != 0].tobytes()


def _int_text(values: np.ndarray) -> bytes:
    """Decimal integer lines (any integer or bool dtype)."""
    if values.dtype == np.uint64 and values.size and int(values.max()) > np.iinfo(np.int64).max:
        return "".join(f"{v}\n" for v in values.tolist()).encode()
    x = values.astype(np.int64)
    magnitude = np.abs(x).astype(np.uint64)  # |int64 min| fits in uint64
    width = max(1, len(str(int(magnitude.max())))) if x.size else 1
    chars = np.zeros((x.size, width + 2), dtype=np.uint8)
    chars[:, 0] = np.where(x < 0, ord("-"), 0)
    digits = np.empty((x.size, width), dtype=np.uint8)
    rest = magnitude
    for column in range(width - 1, -1, -1):
        digits[:, column] = (rest % 10).astype(np.uint8)
        rest = rest // 10
    significant = np.cumsum(digits != 0, axis=1) > 0
    significant[:, -1] = True
    chars[:, 1:-1] = np.where(significant, 48 + digits, 0)
    chars[:, -1] = ord("\n")
    return chars[chars != 0].tobytes()


def _text(values: np.ndarray) -> bytes:
    if values.dtype == np.float64:
        return "".join(f"{v!r}\n" for v in values.tolist()).encode()
    if _is_float(values.dtype):
        return _float_text(values)
    if values.dtype.kind in "iub":
        return _int_text(values)
    if "int" in str(values.dtype):  # ml_dtypes int4 / uint4
        return _int_text(values.astype(np.int8))
    return "".join(f"{v}\n" for v in values.tolist()).encode()


def write_text(stream: BinaryIO, array: np.ndarray, pool: Executor | None = None, workers: int = 1) -> None:
    """One value a line, C order, made in slices so that the text of a large tensor is never held whole.

    With a thread pool of ``workers`` threads, the slices of a window are formatted in parallel (numpy releases the
    GIL) and written in order.
    """
    flat = np.asarray(array).reshape(-1)
    workers = workers if pool is not None else 1
    step = _SLICE if workers == 1 else max(_MIN_PARALLEL, min(_SLICE, -(-flat.size // workers)))
    starts = range(0, flat.size, step)
    if pool is None or len(starts) == 1:
        for start in starts:
            stream.write(_text(flat[start : start + step]))
        return
    for window in range(0, len(starts), workers):
        parts = [flat[start : start + step] for start in starts[window : window + workers]]
        for text in pool.map(_text, parts):
            stream.write(text)


# --------------------------------------------------------------------------------------------------
# Statistics


def statistics(array: np.ndarray) -> dict[str, Any]:
    """min, max, mean, std of the finite values (None when there are none) and the count of the others."""
    flat = np.asarray(array).reshape(-1)
    count = 0
    nonfinite = 0
    total = 0.0
    squares = 0.0
    lo, hi = math.inf, -math.inf
    for start in range(0, flat.size, _STATS_PART):
        part = flat[start : start + _STATS_PART].astype(np.float64)
        finite = np.isfinite(part)
        if not finite.all():
            nonfinite += int(finite.size - finite.sum())
            part = part[finite]
        if part.size:
            lo, hi = min(lo, float(part.min())), max(hi, float(part.max()))
            total += float(part.sum())
            squares += float(np.square(part).sum())
            count += part.size
    if not count:
        return {"min": None, "max": None, "mean": None, "std": None, "nonfinite": nonfinite}
    mean = total / count
    variance = max(squares / count - mean * mean, 0.0)
    return {"min": lo, "max": hi, "mean": mean, "std": math.sqrt(variance), "nonfinite": nonfinite}
