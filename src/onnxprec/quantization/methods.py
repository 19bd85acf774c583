"""Calibration methods on one input group: what each method needs, and the per-weight recipes it decides.

A *recipe* says how one ``[K, N]`` weight becomes its quantized form: plain RTN, RTN after AWQ scaling of its rows,
RTN with per-block clip ratios (weight-MSE search, or AWQ-clip's output-aware search), or a GPTQ result computed
from the group's Hessian. Recipes are small (a ``[K]`` scale vector, ``[n_blocks, N]`` ratios, or a packed GPTQ
result at half a byte per weight), so the final quantization can run while the model is written.

Methods (ModelOpt's names first; ``rtn_dq``, ``rtn_trt``, ``rtn_trt_dq`` and ``awq_clip_trt`` are aliases):

=============  =============================================================  ====================
method         what                                                           statistics
=============  =============================================================  ====================
``rtn``        round to nearest, no data                                      none
``rtn_clip``   RTN with a per-block weight-MSE clip search, no data           none
``kquant``     llama.cpp's k-quant: weighted least-squares scale search       none
``hqq``        half-quadratic (lp) fit of scales and zero points              none
``awq_lite``   AWQ scale search (joint over layers sharing an input)          mean ``|x|``, tokens
``awq_clip``   AWQ-clip: per-(block, column) output-aware clip ratios         tokens
``awq_full``   ``awq_lite`` scales, then ``awq_clip`` on the scaled weights   mean ``|x|``, tokens
``gptq``       GPTQ with error propagation (damped Hessian ``XᵀX``)           ``XᵀX``
``awq_gptq``   ``awq_lite`` scales, then GPTQ on the scaled weights           all three
=============  =============================================================  ====================

How the methods compare on a real LLM is measured in BENCHMARKS.md and experiments/design_notes.md ("INT4 methods").
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from onnxprec._array import NUMPY, ArrayBackend, namespace
from onnxprec._report import add_seconds, timed
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization.algorithms import awq_clip, awq_lite, gptq, quantize_rtn
from onnxprec.quantization.algorithms.awq import SEARCH_COLUMNS
from onnxprec.quantization.algorithms.rtn import QuantGrid, QuantizedWeight, level_range
from onnxprec.quantization.algorithms.search import SEARCHES
from onnxprec.quantization.packing import pack_nibbles, unpack_nibbles

if TYPE_CHECKING:
    from onnxprec.quantization.select import WeightGroup

WIDE_BYTES = 64 << 20
"""Float32 bytes above which one weight that GPTQ quantizes without AWQ scales is quantized a range of columns of
about this size at a time (:func:`decide_targets`)."""

__all__ = [
    "ALIASES",
    "METHODS",
    "CompactWeight",
    "GroupDecision",
    "GroupStats",
    "MethodSpec",
    "QuantConfig",
    "Recipe",
    "Spill",
    "SpilledWeight",
    "decide_group",
    "decide_targets",
    "method_spec",
    "read_for",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MethodSpec:
    """What a method does and which activation statistics it needs."""

    awq_scales: bool = False
    clip: str | None = None
    """``"mse"`` (weight MSE, no data), ``"output"`` (AWQ-clip on calibration tokens) or None."""
    gptq: bool = False
    search: str | None = None
    """``"kquant"`` or ``"hqq"``: block parameters from that calibration-free search."""

    @property
    def needs_absmean(self) -> bool:
        return self.awq_scales

    @property
    def needs_sample(self) -> bool:
        return self.awq_scales or self.clip == "output"

    @property
    def needs_gram(self) -> bool:
        return self.gptq

    @property
    def needs_data(self) -> bool:
        return self.needs_absmean or self.needs_sample or self.needs_gram


METHODS: dict[str, MethodSpec] = {
    "rtn": MethodSpec(),
    "rtn_clip": MethodSpec(clip="mse"),
    "kquant": MethodSpec(search="kquant"),
    "hqq": MethodSpec(search="hqq"),
    "awq_lite": MethodSpec(awq_scales=True),
    "awq_clip": MethodSpec(clip="output"),
    "awq_full": MethodSpec(awq_scales=True, clip="output"),
    "gptq": MethodSpec(gptq=True),
    "awq_gptq": MethodSpec(awq_scales=True, gptq=True),
}
ALIASES = {"rtn_dq": "rtn", "rtn_trt": "rtn", "rtn_trt_dq": "rtn", "awq_clip_trt": "awq_clip"}


def method_spec(name: str) -> tuple[str, MethodSpec]:
    """The canonical name and spec of a method (aliases resolved); unknown names raise a clear error."""
    canonical = ALIASES.get(name, name)
    if canonical not in METHODS:
        raise InvalidArgumentError(
            f"Unknown calibration_method '{name}': use one of {', '.join(METHODS)} "
            f"(aliases: {', '.join(f'{a}={c}' for a, c in ALIASES.items())})."
        )
    return canonical, METHODS[canonical]


@dataclass(frozen=True)
class QuantConfig:
    """Settings shared by every weight of a run."""

    block_size: int = 128
    symmetric: bool = True
    positive_scales: bool = False
    """Symmetric scales always positive (TensorRT); by default a block may get a signed scale."""
    alpha_grid: tuple[float, ...] = tuple(i / 10 for i in range(11))
    clip_ratios: tuple[float, ...] = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))
    clip_chunk_columns: int = 1024
    gptq_damp: float = 0.1
    gptq_act_order: bool = False
    backend: ArrayBackend = NUMPY
    """Where RTN, its searches, GPTQ and the output errors compute (:func:`onnxprec._array.backend`)."""

    @property
    def grid(self) -> QuantGrid:
        """The INT4 grid of every weight of the run."""
        return QuantGrid(4, self.symmetric, self.positive_scales)


@dataclass
class CompactWeight:
    """A :class:`QuantizedWeight` held at half a byte per 4-bit level (GPTQ results wait for the save in this form)."""

    levels: np.ndarray
    """4 bits: uint8 nibbles of the unsigned levels (``q + 8`` when symmetric), two per byte; 8 bits: q as is."""
    shape: tuple[int, int]
    scales: np.ndarray
    zero_points: np.ndarray | None
    block_size: int
    bits: int

    @classmethod
    def of(cls, qw: QuantizedWeight) -> CompactWeight:
        if qw.bits != 4:
            return cls(qw.q, qw.shape, qw.scales, qw.zero_points, qw.block_size, qw.bits)
        offset = -level_range(4, True)[0] if qw.symmetric else 0
        flat = (qw.q.astype(np.int16) + offset).astype(np.uint8).reshape(-1)
        if flat.size % 2:
            flat = np.concatenate([flat, np.zeros(1, np.uint8)])
        return cls(pack_nibbles(flat), qw.shape, qw.scales, qw.zero_points, qw.block_size, 4)

    def expand(self) -> QuantizedWeight:
        k, n = self.shape
        if self.bits != 4:
            q = self.levels
        else:
            unsigned = unpack_nibbles(self.levels)[: k * n].reshape(k, n)
            q = (unsigned.astype(np.int16) - 8).astype(np.int8) if self.zero_points is None else unsigned
        return QuantizedWeight(q, self.scales, self.zero_points, self.block_size, self.bits)

    def sliceable(self) -> bool:
        """Whether :meth:`columns` takes any range of even bounds (4-bit levels pack whole rows when N is even)."""
        return self.bits != 4 or self.shape[1] % 2 == 0

    def columns(self, columns: slice) -> QuantizedWeight:
        """Those columns (bounds even for 4 bits, :meth:`sliceable`) of :meth:`expand`, expanding only them."""
        k, n = self.shape
        start, stop, _ = columns.indices(n)
        zero_points = None if self.zero_points is None else self.zero_points[:, start:stop]
        if self.bits != 4:
            q = self.levels[:, start:stop]
        else:
            unsigned = unpack_nibbles(self.levels.reshape(k, n // 2)[:, start // 2 : (stop + 1) // 2])[
                :, : stop - start
            ]
            q = (unsigned.astype(np.int16) - 8).astype(np.int8) if self.zero_points is None else unsigned
        return QuantizedWeight(q, self.scales[:, start:stop], zero_points, self.block_size, self.bits)

    @property
    def nbytes(self) -> int:
        zp = 0 if self.zero_points is None else self.zero_points.nbytes
        return int(self.levels.nbytes + self.scales.nbytes + zp)

    def spill(self, to: Spill) -> SpilledWeight:
        """This weight written to ``to``'s file (its arrays then dropped by the caller)."""
        arrays = (self.levels, self.scales, self.zero_points)
        layout = tuple(None if a is None else (a.dtype, a.shape) for a in arrays)
        return SpilledWeight(to, to.write([a for a in arrays if a is not None]), layout, self.shape,
                             self.block_size, self.bits)  # fmt: skip


class Spill:
    """One temporary file that :class:`CompactWeight` results are appended to as they are made (the GPTQ results of
    a large model wait for the save on disk, not in memory); the file goes when the last weight in it is collected."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="onnxprec-results-")
        self.path = Path(self._folder.name) / "results.bin"
        self.path.touch()

    def write(self, arrays: Sequence[np.ndarray]) -> int:
        """Appends ``arrays`` (C order); returns the offset of the first."""
        with self.path.open("ab") as stream:
            offset = stream.tell()
            for array in arrays:
                np.ascontiguousarray(array).tofile(stream)
        return offset


@dataclass
class SpilledWeight:
    """A :class:`CompactWeight` in a :class:`Spill` file: :meth:`expand` reads it back (a copy, no mapping kept)."""

    spill: Spill
    offset: int
    layout: tuple[tuple[np.dtype, tuple[int, ...]] | None, ...]
    """(dtype, shape) of the levels, the scales and the zero points (None: none)."""
    shape: tuple[int, int]
    block_size: int
    bits: int

    def expand(self) -> QuantizedWeight:
        return self.compact().expand()

    def sliceable(self) -> bool:
        return self.bits != 4 or self.shape[1] % 2 == 0

    def columns(self, columns: slice) -> QuantizedWeight:
        return self.compact().columns(columns)

    def compact(self) -> CompactWeight:
        """The weight read back from the file."""
        arrays: list[np.ndarray | None] = []
        offset = self.offset
        for part in self.layout:
            if part is None:
                arrays.append(None)
                continue
            dtype, shape = part
            count = math.prod(shape)
            arrays.append(np.fromfile(self.spill.path, dtype, count, offset=offset).reshape(shape))
            offset += count * dtype.itemsize
        levels, scales, zero_points = arrays
        assert levels is not None and scales is not None
        return CompactWeight(levels, self.shape, scales, zero_points, self.block_size, self.bits)


@dataclass
class Recipe:
    """How one weight ``W`` ``[K, N]`` is quantized; :meth:`quantize` applies it."""

    method: str
    bits: int = 4
    block_size: int = 128
    symmetric: bool = True
    positive_scales: bool = False
    awq_scales: np.ndarray | None = None
    """``[K]``: the rows of ``W`` are multiplied by these before quantization (the input is divided by them)."""
    clip_ratios: np.ndarray | None = None
    """``[n_blocks, N]`` shrink ratios of the block ranges (AWQ-clip)."""
    clip_search: bool = False
    """Per-block weight-MSE clip search (``rtn_clip``)."""
    search: str | None = None
    """Calibration-free parameter search: ``"kquant"`` or ``"hqq"``."""
    result: CompactWeight | SpilledWeight | None = None
    """A result computed during calibration (GPTQ), in memory or spilled to a file."""
    info: dict[str, object] = field(default_factory=dict)
    """Report entries decided with the recipe (alpha, errors on calibration data...)."""
    backend: ArrayBackend = field(default=NUMPY, repr=False)
    """Where :meth:`quantize` computes."""

    def quantize(self, w: np.ndarray, columns: slice | None = None) -> QuantizedWeight:
        """The quantized form of ``w`` (the weight in the AWQ-scaled basis when ``awq_scales`` is set); ``columns``:
        ``w`` is those columns of the weight (every per-column setting is sliced to them; not with a ``result``)."""
        if self.result is not None:
            if columns is None:
                return self.result.expand()
            if not self.result.sliceable():
                raise ValueError("this computed result (4-bit levels, N odd) quantizes the whole weight")
            return self.result.columns(columns)
        scaled = w if self.awq_scales is None else w * self.awq_scales[:, None]
        ratios = self.clip_ratios
        if columns is not None and ratios is not None and np.ndim(ratios) == 2:
            ratios = ratios[:, columns]
        return quantize_rtn(
            scaled,
            self.block_size,
            symmetric=self.symmetric,
            clip_search=self.clip_search,
            clip_ratios=ratios,
            bits=self.bits,
            positive_scales=self.positive_scales,
            search=None if self.search is None else SEARCHES[self.search],
            backend=self.backend,
        )

    def dequantized(self, qw: QuantizedWeight) -> np.ndarray:
        """``qw`` dequantized in the original basis of ``W`` (AWQ scales undone)."""
        dq = qw.dequantize()
        return dq if self.awq_scales is None else dq / self.awq_scales[:, None]


@dataclass
class GroupStats:
    """Activation statistics of one input group (what its method needs; the rest is None)."""

    absmean: np.ndarray | None = None
    """``[K]`` mean ``|x|`` per input channel."""
    sample: np.ndarray | None = None
    """``[T, K]`` sampled tokens (float16 or float32 as stored; :meth:`tokens_f32` for the math)."""
    gram: np.ndarray | None = None
    """``[K, K]`` float64 ``XᵀX`` over every token (on the host, or on the device of the run's backend when it was made
    there: :class:`~onnxprec.quantization.activation_stats.Float32GramObserver`)."""
    tokens: int = 0

    def tokens_f32(self) -> np.ndarray | None:
        """The token sample as float32 (a copy when it is stored in float16)."""
        return None if self.sample is None else self.sample.astype(np.float32, copy=False)


@dataclass
class GroupDecision:
    """What :func:`decide_group` decided for the weights of one input group."""

    recipes: list[Recipe]
    scales: np.ndarray | None = None
    """The group's AWQ scales ``[K]`` (the input must be divided by them), or None."""
    alpha: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the parts that ran: ``awq`` (the scale search), ``gptq``, ``output errors``."""


def _relative(num: float, den: float) -> float:
    if den <= 0:
        return 0.0 if num <= 0 else math.inf
    return math.sqrt(max(num, 0.0) / den)


def _output_error(w: np.ndarray, dq: np.ndarray, stats: GroupStats, backend: ArrayBackend = NUMPY) -> float | None:
    """``||X (W - Wq)|| / ||X W||`` on the calibration tokens (the Gram when there is one, on ``backend``, else the
    sample)."""
    diff = w - dq
    if stats.gram is not None:
        xp = backend.xp
        gram = backend.from_host(stats.gram.astype(np.float32))
        diff, w = backend.from_host(diff), backend.from_host(w)
        num = float(xp.einsum("kn,kn->", gram @ diff, diff, dtype=np.float64))
        den = float(xp.einsum("kn,kn->", gram @ w, w, dtype=np.float64))
        del gram, diff, w
        backend.release()
        return _relative(num, den)
    if stats.sample is not None and stats.sample.shape[0]:
        x = stats.tokens_f32()
        assert x is not None
        num = float(np.square(x @ diff, dtype=np.float64).sum())
        den = float(np.square(x @ w, dtype=np.float64).sum())
        return _relative(num, den)
    return None


def _error_stride(n: int) -> int:
    """The step between the columns of an ``N``-column weight its output error is measured on (1: all of them):
    at most :data:`~onnxprec.quantization.algorithms.awq.SEARCH_COLUMNS` columns."""
    return 1 if n <= SEARCH_COLUMNS else -(-n // SEARCH_COLUMNS)


def read_for(targets: Sequence[WeightGroup], method: str, awq_allowed: bool) -> list[np.ndarray]:
    """The float32 weights :func:`decide_group` needs of ``targets``: whole, or for a method whose recipes are made
    without the weight (no AWQ search, no GPTQ, no output clip) only the columns of their output error (every
    :func:`_error_stride`-th): each column is quantized on its own, so the error on those alone is the same, and a
    262k-column LLM head is never read whole."""
    spec = METHODS[method]
    if (spec.awq_scales and awq_allowed) or spec.gptq or spec.clip == "output":
        return [target.read() for target in targets]
    return [target.read_every(_error_stride(target.n)) for target in targets]


def _error_columns(
    w: np.ndarray, recipe: Recipe, computed: QuantizedWeight | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The columns of ``w`` the reported output error is measured on, and their quantized values in the original
    basis: every ``ceil(N / SEARCH_COLUMNS)``-th column (all of them when ``N <= SEARCH_COLUMNS``), the subset AWQ-lite
    scores its candidates on. Each column is quantized as in the whole weight, so the error is the whole weight's
    on those columns, at a fraction of the cost of quantizing and measuring every column of a wide weight.
    ``computed``: the recipe's result as computed (GPTQ), whose columns are dequantized alone (the same values as
    those columns of the whole weight dequantized: each value depends on its own column only)."""
    n = w.shape[1]
    if n <= SEARCH_COLUMNS:
        return w, recipe.dequantized(computed if computed is not None else recipe.quantize(w))
    columns = slice(None, None, _error_stride(n))
    part = np.ascontiguousarray(w[:, columns])
    if recipe.result is not None:  # computed whole (GPTQ)
        qw = computed if computed is not None else recipe.quantize(w)
        zero_points = None if qw.zero_points is None else qw.zero_points[:, columns]
        picked = QuantizedWeight(qw.q[:, columns], qw.scales[:, columns], zero_points, qw.block_size, qw.bits)
        return part, np.ascontiguousarray(recipe.dequantized(picked))
    return part, recipe.dequantized(recipe.quantize(part, columns))


def _gptq_by_block_size(
    weights: Sequence[np.ndarray],
    stats: GroupStats,
    scales: np.ndarray | None,
    config: QuantConfig,
    block_sizes: Sequence[int],
) -> list[QuantizedWeight]:
    """:func:`_gptq_jointly` on the weights of each block size (one factorisation per block size)."""
    results: list[QuantizedWeight | None] = [None] * len(weights)
    for block in dict.fromkeys(block_sizes):
        indices = [i for i, b in enumerate(block_sizes) if b == block]
        joint = _gptq_jointly([weights[i] for i in indices], stats, scales, replace(config, block_size=block))
        for i, result in zip(indices, joint):
            results[i] = result
    return [r for r in results if r is not None]


def _scaled_gram(gram: np.ndarray, scales: np.ndarray, rows: int = 512) -> np.ndarray:
    """``gram / np.outer(scales, scales)``, the same values, made a few rows at a time: a ``[K, K]`` float64 Gram is
    1.6 GB at K = 14336, and the outer product would be another. Made where ``gram`` is (a device's Gram there)."""
    xp = namespace(gram)
    scales = xp.asarray(scales)
    result = xp.empty(gram.shape, np.result_type(gram.dtype, scales.dtype))
    for start in range(0, gram.shape[0], rows):
        part = slice(start, start + rows)
        xp.divide(gram[part], xp.outer(scales[part], scales), out=result[part])
    return result


def _gptq_jointly(
    weights: Sequence[np.ndarray], stats: GroupStats, scales: np.ndarray | None, config: QuantConfig
) -> list[QuantizedWeight]:
    """GPTQ of the group's weights side by side: one Hessian factorisation for all of them.

    GPTQ treats output columns independently given the Hessian (each column's errors propagate down its own
    rows, block scales are per column), so quantizing ``[W_1 | W_2 | ...]`` at once equals quantizing each.
    With AWQ scales, the weights are ``diag(s) W`` and the Hessian that of ``x / s``: ``diag(1/s) H diag(1/s)``.
    """
    assert stats.gram is not None
    hessian = stats.gram
    if scales is not None:  # built a few rows at a time, then handed over to GPTQ as its work matrix
        hessian = _scaled_gram(stats.gram, scales)
    # The joint weight is made in the call and handed over (GPTQ changes it, no copy): only GPTQ holds it, and on a
    # device it is freed on the host once it is there.
    joint = gptq(
        np.concatenate([w if scales is None else w * scales[:, None] for w in weights], axis=1), hessian,
        max(stats.tokens, 1), config.block_size, symmetric=config.symmetric, damp=config.gptq_damp,
        act_order=config.gptq_act_order, positive_scales=config.positive_scales, backend=config.backend,
        overwrite_hessian=scales is not None, overwrite_weight=True,
    )  # fmt: skip
    del hessian
    results = []
    start = 0
    for w in weights:
        cols = slice(start, start + w.shape[1])
        zero_points = None if joint.zero_points is None else joint.zero_points[:, cols].copy()
        results.append(
            QuantizedWeight(joint.q[:, cols].copy(), joint.scales[:, cols].copy(), zero_points, joint.block_size)
        )
        start += w.shape[1]
    return results


def decide_group(
    weights: Sequence[np.ndarray],
    stats: GroupStats,
    method: str,
    config: QuantConfig,
    *,
    awq_allowed: bool = True,
    block_sizes: Sequence[int] | None = None,
) -> GroupDecision:
    """Recipes for the float32 ``[K, N_j]`` weights that read one input, from that input's statistics.

    Args:
        weights: The weights of the group (Gemm ``transB`` weights already transposed).
        stats: The group's statistics (those ``method`` needs).
        method: A canonical method name (see :data:`METHODS`).
        config: Block size, symmetry and search grids.
        awq_allowed: False when a weight is shared with another group (one scale vector cannot serve two inputs).
        block_sizes: Each weight's block size (a size budget's choice); default ``config.block_size`` for all.
            The AWQ search scores its scales at the smallest.
    """
    spec = METHODS[method]
    blocks = list(block_sizes) if block_sizes is not None else [config.block_size] * len(weights)
    grid = config.grid
    scales: np.ndarray | None = None
    alpha: float | None = None
    seconds: dict[str, float] = {}
    if spec.awq_scales and awq_allowed:
        sample = stats.tokens_f32()
        assert stats.absmean is not None and sample is not None
        with timed() as searching:
            result = awq_lite(
                weights, stats.absmean, sample, min(blocks), grid, alpha_grid=config.alpha_grid, backend=config.backend
            )
        seconds["awq"] = searching.seconds
        del sample
        if result.alpha is not None:
            scales, alpha = result.scales, result.alpha
    gptq_results = None
    if spec.gptq:
        with timed() as solving:
            gptq_results = _gptq_by_block_size(weights, stats, scales, config, blocks)
        seconds["gptq"] = solving.seconds
    recipes = []
    for index, w in enumerate(weights):
        computed = None if gptq_results is None else gptq_results[index]
        recipe = _recipe(w, stats, method, config, blocks[index], scales, alpha, computed)
        with timed() as measuring:
            error = _output_error(*_error_columns(w, recipe, computed), stats, config.backend)
        add_seconds(seconds, "output errors", measuring.seconds)
        if error is not None:
            recipe.info["output_rel_error"] = error
        recipes.append(recipe)
    return GroupDecision(recipes, scales, alpha, seconds)


def _recipe(
    w: np.ndarray,
    stats: GroupStats,
    method: str,
    config: QuantConfig,
    block_size: int,
    scales: np.ndarray | None,
    alpha: float | None,
    computed: QuantizedWeight | None,
) -> Recipe:
    """The recipe of one weight of a group: its GPTQ result (``computed``), else its clip ratios or clip search, after
    the group's AWQ ``scales`` (found at ``alpha``) when there are any."""
    grid = config.grid
    spec = METHODS[method]
    recipe = Recipe(
        method,
        bits=grid.bits,
        block_size=block_size,
        symmetric=grid.symmetric,
        positive_scales=grid.positive_scales,
        awq_scales=scales,
        backend=config.backend,
    )
    if computed is not None:
        recipe.result = CompactWeight.of(computed)
    elif spec.clip == "output":
        scaled = w if scales is None else w * scales[:, None]
        x = stats.tokens_f32()
        assert x is not None
        x = x if scales is None else x / scales[None, :]
        recipe.clip_ratios = awq_clip(
            scaled, x, block_size, grid, ratios=config.clip_ratios, chunk_columns=config.clip_chunk_columns
        )
        recipe.info["clip_ratio_mean"] = float(recipe.clip_ratios.mean())
    elif spec.clip == "mse":
        recipe.clip_search = True
    if alpha is not None:
        recipe.info["awq_alpha"] = alpha
    return recipe


def decide_targets(
    targets: Sequence[WeightGroup],
    stats: GroupStats,
    method: str,
    config: QuantConfig,
    *,
    awq_allowed: bool = True,
    block_sizes: Sequence[int],
) -> GroupDecision:
    """:func:`decide_group` on the weights of ``targets``, read as it needs them (:func:`read_for`). A group of one
    weight of over :data:`WIDE_BYTES` that GPTQ quantizes without AWQ scales (a tied LLM head) is quantized a range
    of columns at a time instead: GPTQ treats output columns independently given the Hessian, so the levels are
    those of the whole weight, and neither it nor GPTQ's ``[K, N]`` work arrays are ever all in memory."""
    spec = METHODS[method]
    (target, *others) = targets
    wide = target.k * target.n * 4 > WIDE_BYTES and target.n % 2 == 0
    if spec.gptq and not (spec.awq_scales and awq_allowed) and not others and wide:
        return _gptq_in_ranges(target, stats, method, config, block_sizes[0])
    if spec.clip == "output" and not spec.gptq and not (spec.awq_scales and awq_allowed) and not others and wide:
        return _clip_in_ranges(target, stats, method, config, block_sizes[0])
    weights = read_for(targets, method, awq_allowed)
    return decide_group(weights, stats, method, config, awq_allowed=awq_allowed, block_sizes=block_sizes)


def _column_ranges(target: WeightGroup, stride: int) -> Iterator[tuple[int, np.ndarray, slice]]:
    """``target``'s float32 columns read an even number at a time (:data:`WIDE_BYTES` of them): each range's first
    column, its columns, and the slice of them that are every ``stride``-th column of the whole weight."""
    step = max(2, WIDE_BYTES // (4 * target.k) // 2 * 2)
    for start in range(0, target.n, step):
        yield start, target.read(slice(start, min(target.n, start + step))), slice((-start) % stride, None, stride)


def _clip_in_ranges(
    target: WeightGroup, stats: GroupStats, method: str, config: QuantConfig, block_size: int
) -> GroupDecision:
    """AWQ-clip's ratios of ``target`` (no AWQ scales) a range of columns at a time: each column's ratios depend on
    its own values and the group's tokens only, so they are those of the whole weight, which is never all read. The
    output error on the columns :func:`_error_columns` measures (every :func:`_error_stride`-th)."""
    x = stats.tokens_f32()
    assert x is not None
    stride = _error_stride(target.n)
    ratios, picked, seconds = [], [], {"clip": 0.0}
    for _, w, local in _column_ranges(target, stride):
        with timed() as searching:
            ratios.append(awq_clip(w, x, block_size, config.grid, ratios=config.clip_ratios,
                                   chunk_columns=config.clip_chunk_columns))  # fmt: skip
        seconds["clip"] += searching.seconds
        picked.append(np.array(w[:, local]))
        del w
    grid = config.grid
    recipe = Recipe(method, bits=grid.bits, block_size=block_size, symmetric=grid.symmetric,
                    positive_scales=grid.positive_scales, backend=config.backend)  # fmt: skip
    recipe.clip_ratios = np.concatenate(ratios, axis=1)
    recipe.info["clip_ratio_mean"] = float(recipe.clip_ratios.mean())
    part = np.ascontiguousarray(np.concatenate(picked, axis=1))
    columns = slice(None, None, stride)
    with timed() as measuring:
        error = _output_error(part, recipe.dequantized(recipe.quantize(part, columns)), stats, config.backend)
    seconds["output errors"] = measuring.seconds
    if error is not None:
        recipe.info["output_rel_error"] = error
    return GroupDecision([recipe], None, None, seconds)


def _gptq_in_ranges(
    target: WeightGroup, stats: GroupStats, method: str, config: QuantConfig, block_size: int
) -> GroupDecision:
    """GPTQ of ``target`` (no AWQ scales) an even number of columns at a time, its 4-bit levels (``config.grid``
    is 4 bits) packed as they come; the output error on the columns :func:`_error_columns` measures (every
    :func:`_error_stride`-th)."""
    k, n = target.k, target.n
    grid, seconds = config.grid, {"gptq": 0.0}
    assert grid.bits == 4
    stride = _error_stride(n)
    levels = np.empty((k, n // 2), np.uint8)
    scales: list[np.ndarray] = []
    zero_points: list[np.ndarray] = []
    picked = []  # per range: (the error's float columns, their levels, scales, zero points)
    qw = None
    for start, w, local in _column_ranges(target, stride):
        stop = start + w.shape[1]
        with timed() as solving:
            (qw,) = _gptq_by_block_size([w], stats, None, config, [block_size])
        seconds["gptq"] += solving.seconds
        offset = -level_range(4, True)[0] if qw.symmetric else 0
        levels[:, start // 2 : stop // 2] = pack_nibbles((qw.q.astype(np.int16) + offset).astype(np.uint8))
        scales.append(qw.scales)
        if qw.zero_points is not None:
            zero_points.append(qw.zero_points)
        zp = None if qw.zero_points is None else qw.zero_points[:, local]
        picked.append((w[:, local], qw.q[:, local], qw.scales[:, local], zp))
        del w
    assert qw is not None
    joined = np.concatenate(zero_points, axis=1) if zero_points else None
    recipe = Recipe(method, bits=grid.bits, block_size=block_size, symmetric=grid.symmetric,
                    positive_scales=grid.positive_scales, backend=config.backend)  # fmt: skip
    recipe.result = CompactWeight(levels, (k, n), np.concatenate(scales, axis=1), joined, qw.block_size, grid.bits)
    columns = [np.concatenate(parts, axis=1) if parts[0] is not None else None for parts in zip(*picked)]
    part, q, s, z = columns
    assert part is not None and q is not None and s is not None
    dq = np.ascontiguousarray(recipe.dequantized(QuantizedWeight(q, s, z, qw.block_size, grid.bits)))
    with timed() as measuring:
        error = _output_error(np.ascontiguousarray(part), dq, stats, config.backend)
    seconds["output errors"] = measuring.seconds
    if error is not None:
        recipe.info["output_rel_error"] = error
    return GroupDecision([recipe], None, None, seconds)
