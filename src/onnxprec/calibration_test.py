"""Calibration sources, their validation, realistic random data, and streaming reference statistics."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxprec import calibration
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.calibration_data import CalibrationData
from onnxprec.errors import CalibrationDataError, InvalidArgumentError
from onnxprec.observers import RangeObserver
from onnxprec.reference import run_reference


def _model(batch: int | str = 2) -> ir.Model:
    nodes = [helper.make_node("Relu", ["X"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["Y"], name="neg")]
    proto = make_model(nodes, [tensor_info("X", F, [batch, 3])], [tensor_info("Y", F, [batch, 3])])
    return ir.serde.deserialize_model(proto)


def test_npz_is_split_along_static_batch(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    np.savez(path, X=np.arange(18, dtype=np.float32).reshape(6, 3))
    batches = CalibrationData(path, _model(2))
    assert len(batches) == 3 and all(b["X"].shape == (2, 3) for b in batches)


def test_npz_folder_and_empty_folder(tmp_path: Path) -> None:
    for i in range(2):
        np.savez(tmp_path / f"b{i}.npz", X=np.full((2, 3), i, np.float32))
    assert len(CalibrationData(tmp_path, _model())) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CalibrationDataError, match="No NPZ files found"):
        CalibrationData(empty, _model())


def test_polygraphy_json(tmp_path: Path) -> None:
    def encode(array: np.ndarray) -> dict:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}

    data = [{"X": encode(np.ones((2, 3), np.float32))}, {"X": encode(np.zeros((2, 3), np.float32))}]
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(data))
    batches = CalibrationData(path, _model())
    assert len(batches) == 2 and batches[0]["X"].sum() == 6
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationDataError, match="Invalid input file"):
        CalibrationData(bad, _model())


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"Z": np.ones((2, 3), np.float32)}, "do not match"),
        ({"X": np.ones((2, 3), np.float64)}, "dtype float64"),
        ({"X": np.ones((2, 4), np.float32)}, "size 4 on axis 1"),
        ({"X": np.ones((2, 3, 1), np.float32)}, "rank 3"),
    ],
)
def test_mismatched_calibration_data(feeds: dict, message: str) -> None:
    with pytest.raises(CalibrationDataError, match=message):
        CalibrationData(feeds, _model())


def test_unsupported_file_type(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("1 2 3")
    with pytest.raises(CalibrationDataError, match="supported input types"):
        CalibrationData(path, _model())


def test_random_feeds_are_realistic() -> None:
    table = np.zeros((30000, 8), np.float32)
    nodes = [
        helper.make_node("Gather", ["T", "input_ids"], ["g"], name="embed"),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=F),
        helper.make_node("Unsqueeze", ["m", "ax"], ["mu"]),
        helper.make_node("Mul", ["g", "mu"], ["Y"]),
    ]
    proto = make_model(
        nodes,
        [
            tensor_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            tensor_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [tensor_info("Y", F, None)],
        {"T": table, "ax": np.array([2], np.int64)},
    )
    feeds = calibration.random_feeds(ir.serde.deserialize_model(proto))
    assert feeds["input_ids"].shape == (1, 128)
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 30000
    assert feeds["input_ids"].max() > 1000  # spread over the table, not {-1, 0, 1}
    mask = feeds["attention_mask"]  # ones with padding at the end of the row: the masked path gets measured
    assert set(np.unique(mask)) == {0, 1} and mask[0, 0] == 1 and mask[0, -1] == 0
    override = calibration.random_feeds(
        ir.serde.deserialize_model(proto), input_shapes="input_ids:2x7,attention_mask:2x7"
    )
    assert override["input_ids"].shape == (2, 7)


def test_random_image_dims_and_invalid_shapes_text() -> None:
    proto = make_model(
        [helper.make_node("Relu", ["img"], ["Y"])],
        [tensor_info("img", F, ["N", 3, "H", "W"])],
        [tensor_info("Y", F, None)],
    )
    feeds = calibration.random_feeds(ir.serde.deserialize_model(proto))
    assert feeds["img"].shape == (1, 3, 224, 224)
    with pytest.raises(InvalidArgumentError, match="name:DIMxDIM"):
        calibration.parse_input_shapes("img=1x3")


def _image_model(first: str = "Relu", layout: list[int | str] | None = None) -> ir.Model:
    nodes = [
        helper.make_node(first, ["img", "c"], ["Y"]) if first != "Relu" else helper.make_node("Relu", ["img"], ["Y"])
    ]
    inits = {"c": np.array(127.5, np.float32)} if first != "Relu" else {}
    inputs = [tensor_info("img", F, layout or ["N", 3, "H", "W"])]
    return ir.serde.deserialize_model(make_model(nodes, inputs, [tensor_info("Y", F, None)], inits))


def test_synthetic_images_are_smooth_with_edges_not_noise() -> None:
    images = calibration.synthetic_images(3, 64, 80, 3, np.random.default_rng(0))
    assert images.shape == (3, 64, 80, 3) and images.min() >= 0.0 and images.max() <= 1.0
    # neighbouring pixels agree (photos: smooth regions), unlike noise; some neighbours differ a lot (edges)
    step = np.abs(np.diff(images, axis=2))
    assert np.corrcoef(images[:, :, :-1].ravel(), images[:, :, 1:].ravel())[0, 1] > 0.8
    assert step.max() > 0.5 and images.std() > 0.1


def test_random_images_are_normalized_as_the_model_expects() -> None:
    """An NCHW or NHWC image input the model normalizes itself (a Sub of 127.5) gets pixels in [0, 255]; one it
    does not normalize gets them standardized as ImageNet's preprocessing does; a 5-channel input gets noise."""
    raw = calibration.random_feeds(_image_model("Sub"))["img"]
    assert raw.shape == (1, 3, 224, 224) and raw.min() >= 0 and raw.max() <= 255 and raw.max() > 100
    standardized = calibration.random_feeds(_image_model())["img"]
    assert standardized.min() >= -0.45 / 0.225 - 1e-5 and standardized.max() <= 0.55 / 0.225 + 1e-5
    nhwc = calibration.random_feeds(_image_model(layout=["N", 32, 32, 1]))["img"]
    assert calibration.image_channel_axis(nhwc.shape) == 3 and nhwc.min() >= -0.45 / 0.225 - 1e-5
    noise = calibration.random_feeds(_image_model(), images=False)["img"]
    assert noise.min() < -3 and noise.max() > 3  # standard normal over 150k values
    assert calibration.image_channel_axis((1, 5, 32, 32)) is None


def test_random_calibration_of_an_image_model_holds_synthetic_images_and_noise() -> None:
    """Either kind alone leaves ranges that real images exceed: random image data is one batch of each."""
    batches = list(CalibrationData(None, _image_model()))
    assert len(batches) == 2
    assert batches[0]["img"].max() <= 0.55 / 0.225 + 1e-5 and batches[1]["img"].max() > 3
    relu = make_model(
        [helper.make_node("Relu", ["X"], ["Y"])], [tensor_info("X", F, ["N", 8])], [tensor_info("Y", F, None)]
    )
    assert len(list(CalibrationData(None, ir.serde.deserialize_model(relu)))) == 1


def test_random_ids_of_a_one_hot_input_cover_its_classes() -> None:
    """Bytes one-hot encoded by an Equal with the constant ids 0..256 (magika, a JAX export) get ids 0..256, not
    {0, 1}; so do ids through OneHot with a constant depth."""
    nodes = [
        helper.make_node("Unsqueeze", ["bytes", "ax"], ["u"]),
        helper.make_node("Equal", ["u", "ids"], ["eq"]),
        helper.make_node("Cast", ["eq"], ["Y"], to=F),
        helper.make_node("OneHot", ["labels", "depth", "values"], ["Z"]),
    ]
    inits = {"ax": np.array([2], np.int64), "ids": np.arange(257, dtype=np.int32).reshape(1, 1, 257),
             "depth": np.array(10, np.int64), "values": np.array([0.0, 1.0], np.float32)}  # fmt: skip
    inputs = [tensor_info("bytes", TensorProto.INT32, ["N", 2048]), tensor_info("labels", TensorProto.INT64, ["N", 64])]
    proto = make_model(nodes, inputs, [tensor_info("Y", F, None), tensor_info("Z", F, None)], inits)
    feeds = calibration.random_feeds(ir.serde.deserialize_model(proto))
    assert feeds["bytes"].min() >= 0 and feeds["bytes"].max() <= 256 and feeds["bytes"].max() > 200
    assert 2 <= feeds["labels"].max() < 10 and feeds["labels"].min() >= 0


def test_multi_batch_statistics_are_exact_and_chunking_does_not_change_them() -> None:
    model = _model(2)
    batches = [
        {"X": np.array([[1, -2, 3], [0, 0, 0]], np.float32)},
        {"X": np.array([[-7, 5, 0.5], [1, 1, 1]], np.float32)},
    ]
    one = run_reference(model, batches, observers=[RangeObserver()])
    tiny = run_reference(model, batches, observers=[RangeObserver()], budget_bytes=1)  # one tensor per chunk
    assert one.stats is not None and tiny.stats is not None
    r = one.stats["r"]
    assert (r.min, r.max, r.absmax, r.shape, r.batches) == (0.0, 5.0, 5.0, (2, 3), 2)
    y = one.stats["Y"]
    assert (y.min, y.max, y.absmax) == (-5.0, 0.0, 5.0)
    for name in ("r", "Y", "X"):
        assert (tiny.stats[name].absmax, tiny.stats[name].min) == (one.stats[name].absmax, one.stats[name].min)
    np.testing.assert_array_equal(one.first_outputs["Y"], -np.maximum(batches[0]["X"], 0))


def test_random_data_retries_other_sizes(tmp_path: Path) -> None:
    """A model that cannot run with sequence 128 (a fixed 64-long table added to it) runs after a retry."""
    from onnxprec.autocast import convert_to_mixed_precision

    nodes = [helper.make_node("Add", ["x", "P"], ["Y"], name="add_pos")]
    proto = make_model(
        nodes,
        [tensor_info("x", F, ["batch", "seq", 4])],
        [tensor_info("Y", F, None)],
        {"P": np.zeros((64, 4), np.float32)},
    )
    out = convert_to_mixed_precision(proto)
    onnx.checker.check_model(out)


def test_inputs_without_a_synthetic_form_are_the_non_images() -> None:
    """Images (NCHW or NHWC, 1 or 3 channels, dynamic sizes too) have synthetic random data; audio, features, ids
    and bytes do not; masks, positions, scalars and bools are settings."""
    i64, i32, b = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
    inputs = [
        ("photo", F, ["N", 3, "H", "W"]), ("nhwc", F, ["N", 224, 224, 3]), ("gray", F, [1, 1, 64, "W"]),
        ("audio", F, ["N", "samples"]), ("mel", F, [1, 80, "T"]), ("state", F, [2, "N", 128]),
        ("feature", F, [1, 32, "H", "W"]), ("input_ids", i64, ["N", "T"]), ("bytes", i32, ["N", 2048]),
        ("attention_mask", i64, ["N", "T"]), ("position_ids", i64, ["N", "T"]), ("sr", i64, []), ("flag", b, [1]),
    ]  # fmt: skip
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name, _, _ in inputs]
    model = make_model(nodes, [tensor_info(n, t, d) for n, t, d in inputs],
                       [tensor_info(f"{n}_out", t, d) for n, t, d in inputs])  # fmt: skip
    specs = calibration.input_specs(ir.serde.deserialize_model(model))
    unlike = [spec.name for spec in calibration.inputs_without_synthetic_form(specs)]
    assert unlike == ["audio", "mel", "state", "feature", "input_ids", "bytes"]


def test_few_runs_of_many_samples_are_split_to_hold_out_a_quarter() -> None:
    """2 runs of 8 samples: 8 runs of 2, 6 calibrate and 2 check; a static batch axis is never split."""
    rng = np.random.default_rng(0)
    batches = [{"X": rng.standard_normal((8, 3)).astype(np.float32)} for _ in range(2)]
    data = CalibrationData(batches, _model("N"))
    calibrate, rest = data.held_out()
    assert rest is not None and (len(calibrate), len(rest)) == (6, 2)
    assert [b["X"].shape for b in rest] == [(2, 3), (2, 3)]
    np.testing.assert_array_equal(np.concatenate([b["X"] for b in rest]), batches[1]["X"][4:])
    static = CalibrationData([{"X": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(4)], _model(2))
    assert static.held_out()[1] is None  # 8 samples, but the model's batch is 2
