from __future__ import annotations

import subprocess
import sys

import pytest

from onnxprec._exports import lazy_exports


def test_names_come_from_their_homes_and_others_are_attribute_errors() -> None:
    getattr_, dir_ = lazy_exports("pkg", ["sqrt", "dumps"], "math", {"dumps": "json"})
    import json
    import math

    assert getattr_("sqrt") is math.sqrt and getattr_("dumps") is json.dumps
    assert dir_() == ["dumps", "sqrt"]
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getattr_("loads")


def test_a_name_without_a_home_is_refused() -> None:
    with pytest.raises(ValueError, match="pkg: no home module for sqrt"):
        lazy_exports("pkg", ["sqrt", "dumps"], homes={"dumps": "json"})


@pytest.mark.slow
def test_importing_a_tool_package_loads_none_of_its_implementation() -> None:
    code = (
        "import sys, onnxprec.quantization.int8 as q, onnxprec.evaluate as e\n"
        "assert 'onnxprec.quantization.int8._api' not in sys.modules\n"
        "assert 'onnxprec.evaluate._generate' not in sys.modules\n"
        "assert e.generate_models.__module__ == 'onnxprec.evaluate._generate'\n"
        "assert q.Int8Options.__module__ == 'onnxprec.quantization.int8._options'\n"
        "assert 'quantize_static' in dir(q)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
