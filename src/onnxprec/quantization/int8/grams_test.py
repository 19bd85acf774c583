"""Conv patches (im2col) and their Hessians: the patches times the weights are the Conv that ONNX Runtime runs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.quantization.int8 import grams
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
    assert observer.rows["x"] == observer.sampled["x"] == 2 * patches.shape[1]
    assert np.allclose(observer.hessians["x"], 2 * np.einsum("gtk,gtl->gkl", patches, patches))


def test_sampled_patches_are_the_patches_at_those_positions() -> None:
    rng = np.random.default_rng(1)
    geometry = ConvGeometry((3, 3), (2, 1), (1, 0, 1, 2), (1, 2), 2)
    x = rng.standard_normal((2, 4, 11, 10)).astype(np.float32)
    every = geometry.patches(x)
    assert every.shape[1] == geometry.positions(x.shape)
    take = np.array([0, 3, 17, every.shape[1] - 1])
    assert np.array_equal(geometry.patches(x, take), every[:, take])


def test_an_expensive_hessian_is_a_row_sample_spread_over_the_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grams, "EXACT_MULTIPLY_ADDS", 1000)  # every product of this test is past it
    rng = np.random.default_rng(2)
    geometry = ConvGeometry((1, 1))
    k = 6
    observer = HessianObserver({"x": geometry}, batches=3)
    xs = [rng.standard_normal((1, k, 8, 8)).astype(np.float32) for _ in range(3)]
    for x in xs:
        observer.update("x", x)
    per_batch = -(-grams.ROWS_PER_INPUT * k // 3)
    assert observer.rows["x"] == 3 * 64 and observer.sampled["x"] == 3 * per_batch
    every = np.concatenate([geometry.patches(x) for x in xs], axis=1)
    exact = np.einsum("gtk,gtl->gkl", every, every) / every.shape[1]
    estimate = observer.hessians["x"] / observer.sampled["x"]
    assert np.linalg.norm(estimate - exact) < 0.5 * np.linalg.norm(exact)  # an estimate of the same covariance
    rows = np.concatenate(
        [geometry.patches(x, np.sort(np.random.default_rng((0, run)).choice(64, per_batch, replace=False)))
         for run, x in enumerate(xs)], axis=1,
    )  # fmt: skip
    assert np.allclose(observer.hessians["x"], np.einsum("gtk,gtl->gkl", rows, rows))


def test_a_tensor_too_small_for_gptq_is_not_collected() -> None:
    observer = HessianObserver({"x": ConvGeometry((3, 3))}, batches=2)
    observer.update("x", np.ones((1, 8, 4, 4), np.float32))  # 4 positions a batch, 8 in all, K = 72
    assert "x" not in observer.hessians and observer.rows["x"] == 4
