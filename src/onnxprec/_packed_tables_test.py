from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._packed_tables import mapped_for_run, packed_tables

K, N, T = 80, 96, 5  # K: one block of 64 and a shorter last one (at block 32: two and a half)


def _model(signed: bool, zero_points: bool, block: int) -> onnx.ModelProto:
    """ids -> Gather(DQ(table), axis=1) and x -> MatMul(x, DQ(table)): one 4-bit [K, N] table, blocks along K."""
    rng = np.random.default_rng(0)
    blocks = -(-K // block)
    lo, hi = (-8, 8) if signed else (0, 16)
    kind = ml_dtypes.int4 if signed else ml_dtypes.uint4
    dtype = ir.DataType.INT4 if signed else ir.DataType.UINT4
    inits = [
        ir.serde.serialize_tensor(ir.Tensor(rng.integers(lo, hi, (K, N)).astype(kind), dtype=dtype, name="q")),
        numpy_helper.from_array(rng.uniform(0.01, 0.1, (blocks, N)).astype(np.float32), "s"),
    ]
    dq_inputs = ["q", "s"]
    if zero_points:
        points = rng.integers(lo, hi, (blocks, N)).astype(kind)
        inits.append(ir.serde.serialize_tensor(ir.Tensor(points, dtype=dtype, name="z")))
        dq_inputs.append("z")
    nodes = [
        helper.make_node("DequantizeLinear", dq_inputs, ["w"], axis=0, block_size=block),
        helper.make_node("Gather", ["w", "ids"], ["rows"], axis=1),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tables",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, K])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [K, 1, T]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, N])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize(
    ("signed", "zero_points", "block"),
    [(True, False, 64), (True, False, 32), (False, True, 16), (True, True, 16), (False, False, 16)],
)
def test_packed_tables_give_the_dequantized_values(signed: bool, zero_points: bool, block: int) -> None:
    proto = _model(signed, zero_points, block)
    rng = np.random.default_rng(1)
    feeds: dict[str, np.ndarray] = {
        "ids": rng.integers(0, N, (1, T)),
        "x": rng.standard_normal((1, T, K)).astype(np.float32),
    }
    expected = _run(proto, feeds)
    model = ir.serde.deserialize_model(proto)
    assert packed_tables(model, limit=0) == 2
    ops = sorted(node.op_type for node in model.graph)
    assert ops == ["GatherBlockQuantized", "MatMulNBits"]  # the DequantizeLinear is gone with its last reader
    got = _run(ir.serde.serialize_model(model), feeds)
    np.testing.assert_array_equal(got[0], expected[0])  # the gathered values: the same products
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)  # float32 sums in another order


def test_packed_tables_leave_small_tables_and_other_readers() -> None:
    proto = _model(True, False, 64)
    model = ir.serde.deserialize_model(proto)
    assert packed_tables(model, limit=K * N * 4) == 0  # not larger than the limit: as it is
    assert [node.op_type for node in model.graph] == ["DequantizeLinear", "Gather", "MatMul"]
    proto.graph.node[2].op_type = "Add"  # a reader neither replacement takes keeps the DequantizeLinear
    proto.graph.node[2].input[:] = ["w", "w"]
    model = ir.serde.deserialize_model(proto)
    assert packed_tables(model, limit=0) == 1
    assert sorted(node.op_type for node in model.graph) == ["Add", "DequantizeLinear", "GatherBlockQuantized"]


def test_a_table_only_matmuls_read_leaves_no_float_levels_or_scales_behind() -> None:
    """Only the MatMul reads the table: its levels and scales, repacked for MatMulNBits, leave the graph; read by a
    Gather too, they stay (GatherBlockQuantized reads them as they are)."""
    proto = _model(True, True, 16)
    del proto.graph.node[1]
    del proto.graph.output[0], proto.graph.input[0]
    model = ir.serde.deserialize_model(proto)
    assert packed_tables(model, limit=0) == 1
    assert sorted(model.graph.initializers) == ["q_B", "q_zero_points_packed", "s_packed"]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, T, K)).astype(np.float32)
    np.testing.assert_allclose(_run(ir.serde.serialize_model(model), {"x": x})[0], _run(proto, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    tied = ir.serde.deserialize_model(_model(True, True, 16))
    packed_tables(tied, limit=0)
    assert {"q", "s", "z"} <= set(tied.graph.initializers)


def test_mapped_for_run_maps_the_weights_of_a_copy(tmp_path: Path) -> None:
    path = tmp_path / "tables.onnx"
    onnx.save(_model(True, False, 64), path)
    with mapped_for_run(path, limit=0) as model:
        assert sorted(node.op_type for node in model.graph) == ["GatherBlockQuantized", "MatMulNBits"]
        tensors = [value.const_value for value in model.graph.initializers.values()]
        assert tensors and all(isinstance(t, ir.ExternalTensor) for t in tensors if t is not None and t.nbytes > 1024)
        folder = next(t for t in tensors if isinstance(t, ir.ExternalTensor)).base_dir
    assert not Path(folder).exists()  # the copy goes with the block
    assert onnx.load(path).graph.node[0].op_type == "DequantizeLinear"  # the file is as it was


def test_mapped_for_run_says_when_the_copy_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxprec.errors import ValidationError

    path = tmp_path / "tables.onnx"
    onnx.save(_model(True, False, 64), path)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ir, "save", full)
    with pytest.raises(ValidationError, match="No space left on device; set TMPDIR"), mapped_for_run(path, limit=0):
        pass
