"""Conv patches (im2col) and their Hessians: the patches times the weights are the Conv that ONNX Runtime runs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.quantization.int8.grams import ConvGeometry, HessianObserver


@pytest.mark.parametrize(
    "groups, kernel, strides, pads, dilations",
    [(1, 3, 2, [0, 0, 1, 1], 1), (4, 3, 1, [1, 1, 1, 1], 1), (2, 1, 1, [0, 0, 0, 0], 1), (1, 3, 1, [2, 2, 2, 2], 2)],
)
def test_patches_times_weights_is_the_convolution(
    groups: int, kernel: int, strides: int, pads: list[int], dilations: int
) -> None:
    rng = np.random.default_rng(0)
    c, m = 4, 8
    w = rng.standard_normal((m, c // groups, kernel, kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=groups, kernel_shape=[kernel, kernel],
                            strides=[strides] * 2, pads=pads, dilations=[dilations] * 2)  # fmt: skip
    proto = make_model([node], [tensor_info("x", F, [2, c, 9, 9])], [tensor_info("y", F, None)], {"w": w})
    x = rng.standard_normal((2, c, 9, 9)).astype(np.float32)
    (expected,) = run(proto, {"x": x})
    conv = next(iter(ir.serde.deserialize_model(proto).graph))
    geometry = ConvGeometry.of(conv)
    assert geometry is not None and geometry.groups == groups
    patches = geometry.patches(x)  # [G, N*Ho*Wo, K]
    per_group = w.reshape(groups, m // groups, -1).transpose(0, 2, 1)  # [G, K, M/G]
    out = np.einsum("gtk,gkm->tgm", patches, per_group).reshape(2, *expected.shape[2:], m).transpose(0, 3, 1, 2)
    assert np.allclose(out, expected, atol=1e-4)
    observer = HessianObserver({"x": geometry})
    observer.update("x", x)
    observer.update("x", x)
    assert observer.rows["x"] == 2 * patches.shape[1]
    assert np.allclose(observer.hessians["x"], 2 * np.einsum("gtk,gtl->gkl", patches, patches))
