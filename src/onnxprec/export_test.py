"""Tests for onnxprec.export (the PyTorch-dependent ones skip where PyTorch is not installed)."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
import pytest

from onnxprec import export
from onnxprec._testing import run


def _tiny_cnn():  # -> torch.nn.Module; torch is imported by the callers' importorskip.
    """A Conv/BatchNorm/ReLU/Linear model with dropout, so eval mode matters."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, kernel_size=3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Dropout(p=0.5),
        torch.nn.Linear(4 * 6 * 6, 3),
    )
    # Non-trivial running statistics, so that eval mode and training mode give different results.
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.train()
    return model


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    """The dims of a graph input or output: ints where static, the symbolic name where dynamic."""
    return [dim.dim_param or dim.dim_value for dim in value_info.type.tensor_type.shape.dim]


def test_export_dynamic_batch(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    model = _tiny_cnn()
    example = torch.randn(2, 1, 6, 6)
    out = export.export_torch(model, example, tmp_path / "sub" / "tiny.onnx")

    assert out == tmp_path / "sub" / "tiny.onnx"
    assert model.training, "the module's training mode must be restored"
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny.onnx"], "no temporary file left behind"
    proto = onnx.load(out)
    assert proto.opset_import[0].version == 17
    assert [i.name for i in proto.graph.input] == ["input"]
    assert [o.name for o in proto.graph.output] == ["output"]
    assert _dims(proto.graph.input[0]) == ["batch", 1, 6, 6]
    assert _dims(proto.graph.output[0]) == ["batch", 3]

    # Another batch size runs, and matches the module in eval mode.
    model.eval()
    batch5 = torch.randn(5, 1, 6, 6)
    with torch.no_grad():
        expected = model(batch5).numpy()
    got = run(out, {"input": batch5.numpy()})
    np.testing.assert_allclose(got[0], expected, atol=1e-4, rtol=1e-3)


def test_export_static_batch_and_names(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    model = _tiny_cnn().eval()
    out = export.export_torch(
        model,
        (torch.randn(1, 1, 6, 6),),
        str(tmp_path / "tiny_b1.onnx"),
        opset=17,
        input_names=["pixels"],
        output_names=["logits"],
        static_batch=1,
    )
    proto = onnx.load(out)
    assert not model.training
    assert _dims(proto.graph.input[0]) == [1, 1, 6, 6]
    assert _dims(proto.graph.output[0]) == [1, 3]
    for value in [*proto.graph.input, *proto.graph.output]:
        assert all(dim.HasField("dim_value") for dim in value.type.tensor_type.shape.dim), value.name


def test_export_multiple_inputs_and_outputs(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")

    class TwoInTwoOut(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a * b

    out = export.export_torch(TwoInTwoOut(), (torch.randn(2, 3), torch.randn(2, 3)), tmp_path / "two.onnx")
    proto = onnx.load(out)
    assert [i.name for i in proto.graph.input] == ["input_0", "input_1"]
    assert [o.name for o in proto.graph.output] == ["output_0", "output_1"]


def test_static_batch_must_match_example(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="static_batch=1 but example input 0 has shape"):
        export.export_torch(_tiny_cnn(), torch.randn(2, 1, 6, 6), tmp_path / "x.onnx", static_batch=1)
    assert not (tmp_path / "x.onnx").exists()


def test_bad_names(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="input_names has 2 names"):
        export.export_torch(_tiny_cnn(), torch.randn(2, 1, 6, 6), tmp_path / "x.onnx", input_names=["a", "b"])


@pytest.mark.filterwarnings("ignore:Converting a tensor to a Python float")
def test_hardcoded_batch_is_caught(tmp_path: pathlib.Path) -> None:
    """A module that bakes the example batch size into the graph fails the dynamic-batch check."""
    torch = pytest.importorskip("torch")

    class BatchMean(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # float() freezes the example's batch size (2) into the traced graph as a constant.
            return x.sum(dim=0) / float(x.shape[0])

    with pytest.raises(export.ExportMismatchError, match=r"batch 3, to check the dynamic batch"):
        export.export_torch(BatchMean(), torch.randn(2, 3, 4), tmp_path / "hard.onnx")
    assert not (tmp_path / "hard.onnx").exists(), "a failed export must not write the file"


def test_mismatch_reports_max_abs_diff(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    real_run = export._run_onnxruntime

    def off_by_half(session: object, names: list[str], inputs: tuple) -> list[np.ndarray]:
        return [output + 0.5 for output in real_run(session, names, inputs)]

    monkeypatch.setattr(export, "_run_onnxruntime", off_by_half)
    with pytest.raises(export.ExportMismatchError, match=r"max abs diff 0\.5"):
        export.export_torch(_tiny_cnn(), torch.randn(2, 1, 6, 6), tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


def test_missing_torch_message(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # Makes `import torch` raise ImportError.
    with pytest.raises(ImportError, match=r"export_torch needs PyTorch: pip install 'onnxprec\[torch\]'"):
        export.export_torch(object(), None, tmp_path / "x.onnx")  # type: ignore[arg-type]
