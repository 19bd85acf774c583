"""Retyping helpers: type attributes and Constant values follow the new type, clamped, names kept."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxprec.passes._retype import retarget_type_attributes, retype_initializer

_F, _F16 = ir.DataType.FLOAT, ir.DataType.FLOAT16


def test_type_attributes_and_constant_values_are_retargeted() -> None:
    cast = ir.Node("", "Cast", [None], attributes=[ir.AttrInt64("to", _F)])
    assert retarget_type_attributes(cast, _F, _F16) and cast.attributes["to"].as_int() == _F16
    assert not retarget_type_attributes(cast, _F, _F16)

    value = ir.Tensor(np.array([1e6, -1e-9], np.float32), name="fill")
    fill = ir.Node("", "ConstantOfShape", [None], attributes=[ir.AttrTensor("value", value)])
    assert retarget_type_attributes(fill, _F, _F16)
    tensor = fill.attributes["value"].as_tensor()
    assert tensor.dtype == _F16 and tensor.name == "fill"
    got = tensor.numpy()
    assert got[0] == 65504 and got[1] == 0 and np.signbit(got[1])

    scalar = ir.Node("", "Constant", [], attributes=[ir.AttrFloat32("value_float", 70000.0)])
    assert retarget_type_attributes(scalar, _F, _F16)
    assert list(scalar.attributes) == ["value"] and scalar.attributes["value"].as_tensor().numpy() == 65504
    assert not retarget_type_attributes(scalar, ir.DataType.DOUBLE, _F)

    custom = ir.Node("my.domain", "Cast", [None], attributes=[ir.AttrInt64("to", _F)])
    assert not retarget_type_attributes(custom, _F, _F16)


def test_retype_initializer_is_lazy_clamped_and_keeps_the_name() -> None:
    value = ir.Value(name="W", const_value=ir.Tensor(np.array([1e300, -2.5]), name="W"))
    retype_initializer(value, _F)
    assert value.dtype == _F and value.const_value is not None and value.const_value.name == "W"
    assert isinstance(value.const_value, ir.LazyTensor)
    np.testing.assert_array_equal(value.const_value.numpy(), [np.finfo(np.float32).max, -2.5])
    with pytest.raises(ValueError, match="not an initializer"):
        retype_initializer(ir.Value(name="X"), _F)


def test_left_out_attributes_whose_default_is_the_source_type_are_written() -> None:
    # Issue 9, cause 1: a ConstantOfShape without `value` makes a float32 zero (every inlined ONNX Attention has one).
    fill = ir.Node("", "ConstantOfShape", [None])
    assert retarget_type_attributes(fill, _F, _F16)
    tensor = fill.attributes["value"].as_tensor()
    assert tensor.dtype == _F16 and tensor.numpy().tolist() == [0.0]
    assert not retarget_type_attributes(fill, _F, _F16)  # now it has a value of the target type
    assert not retarget_type_attributes(ir.Node("", "ConstantOfShape", [None]), ir.DataType.DOUBLE, _F)
    random = ir.Node("", "RandomNormal", [], attributes=[ir.AttrInt64s("shape", [2])])
    assert retarget_type_attributes(random, _F, _F16) and random.attributes["dtype"].as_int() == _F16
    like = ir.Node("", "RandomNormalLike", [None])  # follows its input's type: nothing to write
    assert not retarget_type_attributes(like, _F, _F16) and "dtype" not in like.attributes
