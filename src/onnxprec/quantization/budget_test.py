"""Size-budget arithmetic: the stored bytes of each precision in each output format."""

from __future__ import annotations

import numpy as np
import pytest

from onnxprec.quantization.algorithms.rtn import quantize_rtn
from onnxprec.quantization.budget import FLOAT, Precision, stored_bytes
from onnxprec.quantization.packing import pack_matmulnbits, qdq_arrays


@pytest.mark.parametrize(("bits", "block", "symmetric"), [(4, 32, True), (4, 64, False), (8, 64, True), (8, -1, True)])
def test_stored_bytes_are_the_packed_arrays(bits: int, block: int, symmetric: bool) -> None:
    w = np.random.default_rng(0).standard_normal((100, 24)).astype(np.float32)  # K=100: a partial last block
    qw = quantize_rtn(w, block, symmetric=symmetric, bits=bits)
    precision = Precision(bits, block)
    packed = pack_matmulnbits(qw, 100)
    mnb = sum(a.nbytes for a in packed if a is not None)
    assert stored_bytes(100, 24, 4, precision, symmetric=symmetric, output_format="matmulnbits")[0] == mnb
    data, scales, zero_points = qdq_arrays(qw)
    zp = 0 if zero_points is None else (zero_points.size * bits + 7) // 8
    qdq = (data.size * bits + 7) // 8 + scales.nbytes + zp
    assert stored_bytes(100, 24, 4, precision, symmetric=symmetric, output_format="qdq")[0] == qdq
    assert stored_bytes(100, 24, 2, FLOAT, symmetric=symmetric, output_format="qdq") == (4800, 4800)
