"""The APIs of dump and compare agree with their options (names, defaults, docs), and bad values fail early."""

from __future__ import annotations

import math

import pytest

from onnxprec._options import signature_mismatches
from onnxprec.debug import CompareOptions, DumpOptions, compare_models, dump_model
from onnxprec.errors import InvalidArgumentError


def test_api_signatures_match_the_options() -> None:
    assert signature_mismatches(dump_model, DumpOptions, skip=("model",)) == []
    assert signature_mismatches(compare_models, CompareOptions, skip=("reference", "candidate")) == []


@pytest.mark.parametrize("kwargs", [{"rtol": -1.0}, {"atol": math.nan}, {"budget_bytes": 0}])
def test_bad_tolerances_and_budgets(kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        CompareOptions(**kwargs)


def test_quark_defaults() -> None:
    options = DumpOptions()
    assert (options.dump_data_reader, options.dump_float, options.output_dir) == (None, False, "./dump_results")
    assert options.random_data_reader_input_shape is None
