"""Files of a dump: .bin and .txt round trips for every dtype, statistics, safe and unique file names."""

from __future__ import annotations

import io
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from onnxprec._graph import FileNames
from onnxprec.debug._arrays import statistics, write_binary, write_text


def _special_floats(dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    values = rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)
    values[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1000.0, 999.99994]
    with np.errstate(over="ignore"):
        return values.astype(dtype)


@pytest.mark.parametrize(
    "array",
    [
        _special_floats(np.dtype(np.float32)),
        _special_floats(np.dtype(np.float16)),
        _special_floats(np.dtype(ml_dtypes.bfloat16)),
        _special_floats(np.dtype(np.float64)),
        np.arange(-128, 128, dtype=np.int8).reshape(16, 16),
        np.arange(256, dtype=np.uint8),
        np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max], dtype=np.int64),
        np.array([True, False, True]),
        np.arange(-8, 8).astype(ml_dtypes.int4),
        np.zeros((0, 3), np.float32),
    ],
    ids=lambda a: str(a.dtype),
)
def test_bin_and_txt_round_trip(array: np.ndarray, tmp_path: Path) -> None:
    with open(tmp_path / "a.bin", "wb") as stream:
        write_binary(stream, array)
    with open(tmp_path / "a.txt", "wb") as stream:
        write_text(stream, array)
    back = np.fromfile(tmp_path / "a.bin", dtype=array.dtype).reshape(array.shape)
    assert back.tobytes() == array.tobytes()
    lines = (tmp_path / "a.txt").read_text().splitlines()
    assert len(lines) == array.size
    if array.size:
        exact = int if array.dtype.kind in "iub" or "int" in str(array.dtype) else float
        parsed = np.array([exact(v) for v in lines]).astype(array.dtype)
        assert parsed.tobytes() == array.reshape(-1).tobytes()  # exact: every value, -0.0, inf and nan included
        assert np.loadtxt(tmp_path / "a.txt", dtype=np.float64, ndmin=1).size == array.size


def test_text_lines_are_plain() -> None:
    stream = io.BytesIO()
    write_text(stream, np.array([1.5, -0.125, np.nan, -np.inf], np.float32))
    assert stream.getvalue().decode().splitlines() == ["+1.50000000e+00", "-1.25000000e-01", "nan", "-inf"]
    stream = io.BytesIO()
    write_text(stream, np.array([[7, -12], [0, 100]], np.int32))
    assert stream.getvalue() == b"7\n-12\n0\n100\n"


def test_parallel_text_is_the_serial_text() -> None:
    from concurrent.futures import ThreadPoolExecutor

    array = np.random.default_rng(1).standard_normal((3, 70_001)).astype(np.float32)
    serial, parallel = io.BytesIO(), io.BytesIO()
    write_text(serial, array)
    with ThreadPoolExecutor(3) as pool:
        write_text(parallel, array, pool, 3)
    assert serial.getvalue() == parallel.getvalue() and serial.getvalue().count(b"\n") == array.size


def test_big_endian_arrays_are_written_little_endian(tmp_path: Path) -> None:
    array = np.arange(5, dtype=">f4")
    with open(tmp_path / "a.bin", "wb") as stream:
        write_binary(stream, array)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "a.bin", dtype="<f4"), array)


def test_statistics_skip_nonfinite_values() -> None:
    stats = statistics(np.array([1.0, 3.0, np.nan, np.inf], np.float32))
    assert stats == {"min": 1.0, "max": 3.0, "mean": 2.0, "std": 1.0, "nonfinite": 2}
    assert statistics(np.array([np.nan]))["mean"] is None
    assert statistics(np.array([2, 4], np.int8))["mean"] == 3.0


def test_safe_names_replace_path_characters_and_never_collide() -> None:
    names = FileNames(reserved=("index",))
    got = [names(n) for n in ["/model/a:0", "_model_a_0", "_MODEL_A_0", "index", "..hidden", "-x", "", "a b\\c"]]
    assert got == ["_model_a_0", "_model_a_0_1", "_MODEL_A_0_2", "index_1", "hidden", "_x", "tensor", "a_b_c"]
    long = names("/".join(["layer"] * 100) + "/end")
    assert len(long) <= 180 and long.endswith("_end")
