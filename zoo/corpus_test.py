"""The corpus builder: wheels' licences and members (on wheels made here), the committed manifest, and, when the
corpus is built (``python -m zoo.corpus build``), the cached models and their two disjoint splits."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec import _testing
from zoo import corpus


def _wheel(path: Path, metadata: str, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg-1.0.dist-info/METADATA", metadata)
        for name, data in files.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ("Name: a\nLicense-Expression: MIT\nLicense: Apache-2.0\n\nbody", "MIT"),
        ("Name: a\nLicense: Apache-2.0\n\nLicense: not this", "Apache-2.0"),
        ("Name: a\nClassifier: License :: OSI Approved :: MIT License\n", "MIT License"),
        ("Name: a\nLicense: " + "x" * 200 + "\nClassifier: License :: OSI Approved :: BSD License\n", "BSD License"),
        ("Name: a\n\n", "not stated in the wheel's METADATA"),
    ],
)
def test_licence_from_metadata(tmp_path: Path, metadata: str, expected: str) -> None:
    assert corpus.licence(_wheel(tmp_path / "p.whl", metadata, {})) == expected


def test_extract_takes_the_model_and_its_external_data(tmp_path: Path) -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "src" / "m.onnx"
    src.parent.mkdir()
    onnx.save_model(model, src, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    members = {
        "pkg/models/m.onnx": src.read_bytes(),
        "pkg/models/m.onnx.data": (src.parent / "m.onnx.data").read_bytes(),
    }
    wheel = _wheel(tmp_path / "p.whl", "Name: p\n", members)
    dest = tmp_path / "out" / "model.onnx"
    files = corpus.extract(wheel, "pkg/models/m.onnx", dest)
    assert [f.name for f in files] == ["model.onnx", "m.onnx.data"]
    y = _testing.run(dest, {"x": np.ones((1, 3), np.float32)})[0]
    np.testing.assert_allclose(y, np.ones((1, 3)) @ w)
    with pytest.raises(FileNotFoundError, match=r"has no pkg/other\.onnx"):
        corpus.extract(wheel, "pkg/other.onnx", dest)


def test_entries_are_well_formed() -> None:
    names = [e.name for e in corpus.ENTRIES]
    assert len(names) == len(set(names))
    assert len(names) >= 30
    assert len({e.kind for e in corpus.ENTRIES}) >= 10
    for e in corpus.ENTRIES:
        assert e.metric in corpus.BOUNDS, e.name
        assert e.member.endswith(".onnx"), e.name
        assert all(c.isdigit() or c in ".abrc" for c in e.version), e.name  # a pinned version
        for v in e.options.values():
            if isinstance(v, str) and v.startswith("@"):
                corpus.entry(v[1:])  # the model it needs is in the corpus


@pytest.mark.slow
def test_committed_manifest_lists_metadata_only() -> None:
    committed = json.loads(corpus.COMMITTED_MANIFEST.read_text())
    for name, m in committed["models"].items():
        assert "path" not in m, name
        for key in ("kind", "package", "member", "sha256", "licence", "inputs", "outputs", "metric", "bound"):
            assert key in m, (name, key)
        assert len(m["sha256"]) == 64


def _feeds(file: Path) -> dict[str, np.ndarray]:
    with np.load(file) as z:
        return {k: z[k] for k in z.files}


def _built() -> dict:
    try:
        return corpus.load_manifest()
    except FileNotFoundError:
        pytest.skip(f"the corpus is not built at {corpus.CORPUS_DIR}: run `python -m zoo.corpus build`")


@pytest.mark.slow
def test_cached_models_match_the_manifest_and_their_splits_are_disjoint() -> None:
    manifest = _built()
    ready = corpus.ready(manifest)
    assert ready, "no corpus model has inputs"
    for name in ready:
        m = manifest["models"][name]
        path = Path(m["path"])
        assert hashlib.sha256(path.read_bytes()).hexdigest() == m["sha256"], name
        digests: dict[str, set[str]] = {}
        for split in ("calib", "heldout"):
            files = sorted((path.parent / split).glob("*.npz"))
            assert len(files) == m["data"][split]["files"], (name, split)
            digests[split] = set()
            for f in files:
                main = _feeds(f)[m["inputs"][0]["name"]]
                digests[split] |= {hashlib.sha256(row.tobytes()).hexdigest() for row in main.reshape(len(main), -1)}
        assert not digests["calib"] & digests["heldout"], f"{name}: a sample is in both splits"
        outs = _testing.run(path, _feeds(sorted((path.parent / "heldout").glob("*.npz"))[0]))
        assert all(np.isfinite(o).all() for o in outs if isinstance(o, np.ndarray) and o.dtype.kind == "f"), name


@pytest.mark.slow
def test_ctc_models_read_their_heldout_inputs() -> None:
    """FP32 decodes each CTC model's held-out inputs into non-empty strings that differ from one another: a model
    fed inputs it cannot read emits the same class at every step, and every tool then keeps its strings."""
    from benchmarks.corpus_metrics import ctc_decode

    manifest = _built()
    names = [n for n in corpus.ready(manifest) if manifest["models"][n]["metric"] == "ctc"]
    assert names, "no CTC model in the corpus"
    for name in names:
        m = manifest["models"][name]
        path, opts = Path(m["path"]), m["metric_options"]
        strings = []
        for outputs in _testing.run_each(path, map(_feeds, sorted((path.parent / "heldout").glob("*.npz")))):
            strings += ctc_decode(outputs[0], opts.get("layout", "NTC"), opts.get("blank", 0))
        assert sum(bool(s) for s in strings) >= 0.9 * len(strings), name
        assert len(set(strings)) >= 0.5 * len(strings), (name, sorted(set(strings))[:5])
