"""GPTQ (Frantar et al., 2022): row-by-row quantization with second-order error compensation, on the ``[K, N]`` layout.

The paper's weight is ``[out, in]`` and it walks input columns; the ONNX MatMul weight is ``[K, N] = [in, out]``, so
this walks **rows** ``i`` of ``W``. With ``H = 2 X^T X / n`` and the upper Cholesky factor ``U`` of ``H^-1``
(``H^-1 = U^T U``), quantizing row ``i`` to ``q_i`` and spreading its error over the rows not yet quantized is::

    err_i = (w_i - q_i) / U[i, i]                     # [N]
    W[i+1:, :] -= outer(U[i, i+1:], err_i)            # a ROW of U

ONNX Runtime's, onnx-neural-compressor's and Quark's ports read a column ``U[i+1:, i]`` instead, which is zero for an
upper-triangular factor: they propagate nothing and return plain RTN.

The damped factorisation and the row walk run on the ``backend`` given (:mod:`onnxprec._array`): the weight and the
Hessian go there once, the levels come back as int8/uint8. A weight whose factorisation would not fit the backend's
memory limit runs in numpy.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from onnxprec._array import NUMPY, ArrayBackend, namespace
from onnxprec.quantization.algorithms.rtn import (
    QuantGrid,
    QuantizedWeight,
    as_float32_matrix,
    block_params,
    effective_block_size,
    to_blocks,
)

__all__ = ["FACTOR_MATRICES", "gptq", "hessian_from_tokens"]

logger = logging.getLogger(__name__)

_MAX_DAMP_RETRIES = 6
# K x K float64 matrices the factorisation holds at once (the Hessian, its factor, the inverse and its workspace).
FACTOR_MATRICES = 5
# K x N float32 arrays the walk holds at once (the weight, its levels, the inverse factor counts as K x K above).
_WALK_ARRAYS = 3


def hessian_from_tokens(x: ArrayLike) -> tuple[np.ndarray, int]:
    """``(X^T X, T)`` in float64 for tokens ``x`` ``[T, K]`` (what a streaming observer accumulates)."""
    tokens = np.asarray(x, dtype=np.float64)
    if tokens.ndim != 2:
        raise ValueError(f"x must be [T, K], got shape {tokens.shape}")
    return tokens.T @ tokens, int(tokens.shape[0])


def _inverse_cholesky_upper(h: np.ndarray, damp: float, backend: ArrayBackend = NUMPY) -> np.ndarray:
    """Upper-triangular ``U`` with ``(H + damp * mean(diag H) * I)^-1 = U^T U``, in float64. Overwrites ``h``.

    Instead of inverting ``H`` and factorising the inverse (two ``K^3`` steps and a third ``K x K`` matrix), this
    factorises the reversed matrix: with ``J`` the row-reversal permutation, ``J H J = L L^T`` gives ``H = R R^T`` with
    ``R = J L J`` upper-triangular, so ``H^-1 = R^-T R^-1`` and ``U = R^-1`` (upper-triangular, positive diagonal; the
    Cholesky factor is unique). Peak memory: about three ``K x K`` float64 matrices.
    If the factorisation fails (H numerically indefinite), the damping is multiplied by 10 and retried.
    ``h`` is a ``backend`` array and so is the result.
    """
    xp = backend.xp
    diagonal = xp.diag(h).copy()
    mean_diag = float(diagonal.mean())
    index = xp.arange(h.shape[0])
    for attempt in range(_MAX_DAMP_RETRIES):
        factor = damp * 10**attempt
        h[index, index] = diagonal + factor * mean_diag
        try:
            reversed_lower = backend.cholesky(h[::-1, ::-1])
        except np.linalg.LinAlgError:
            logger.warning("GPTQ: Hessian not positive definite with damping %g; retrying with %g", factor, factor * 10)
            continue
        upper = xp.linalg.inv(reversed_lower[::-1, ::-1])
        del reversed_lower
        upper[xp.tri(upper.shape[0], k=-1, dtype=bool)] = 0  # triu in place: no second K x K matrix
        if xp.isfinite(upper).all():
            return upper
    raise np.linalg.LinAlgError(f"GPTQ: Hessian not positive definite even with damping {damp * 10**_MAX_DAMP_RETRIES}")


def _host(backend: ArrayBackend, array: Any) -> np.ndarray:
    """``array`` on the host: itself when it is a numpy array, else copied from ``backend``'s device."""
    return array if isinstance(array, np.ndarray) else backend.to_host(array)


def gptq(
    w: ArrayLike,
    hessian: ArrayLike,
    n_tokens: int,
    block_size: int,
    *,
    symmetric: bool = True,
    damp: float = 0.01,
    act_order: bool = False,
    lazy_batch: int = 128,
    bits: int = 4,
    positive_scales: bool = False,
    backend: ArrayBackend = NUMPY,
    overwrite_hessian: bool = False,
    overwrite_weight: bool = False,
) -> QuantizedWeight:
    """Quantizes ``w`` ``[K, N]`` with GPTQ, given ``hessian = sum_t x_t x_t^T`` ``[K, K]`` over ``n_tokens`` tokens.

    Steps: ``H = 2 * hessian / n_tokens``; dead input channels (``H[i, i] == 0``) get ``H[i, i] = 1`` and
    ``W[i, :] = 0``; ``act_order`` permutes rows by descending ``diag(H)``; ``damp * mean(diag H)`` is added to the
    diagonal; ``U`` = upper Cholesky factor of ``H^-1``. Rows are then quantized in order (see the module docstring),
    with updates inside a lazy batch of ``lazy_batch`` rows applied at once, and the batch's accumulated errors pushed
    to the remaining rows with one GEMM, ``W[i2:] -= U[i1:i2, i2:]^T @ Err``.

    Block scales (and zero points), one per block of ``block_size`` consecutive rows of the original order:

    * without ``act_order``: computed when the walk reaches the block's first row, from the block's **current**
      (already error-compensated) weights, rows beyond the lazy batch included (their pending update is applied to
      the copy used for the statistics), exactly as RTN would on those weights;
    * with ``act_order``: the permuted walk visits a block's rows out of order, so all block scales are computed up
      front from the original weights (dead rows zeroed), like AutoGPTQ's ``static_groups``. They stay per real K
      block, so the result still fits ``DequantizeLinear(block_size)``/``MatMulNBits``.

    With ``H`` diagonal nothing is propagated and the result equals :func:`~.rtn.quantize_rtn` (with the same
    ``symmetric`` and ``positive_scales``).

    ``backend`` runs the factorisation and the walk (numpy when they would not fit its memory limit, the Hessian
    then copied to the host); ``hessian`` is a host array or one of ``backend``'s (a Gram made on the device stays
    there); dead channels and ``act_order``'s order are found from its diagonal, copied to the host.
    ``overwrite_hessian``: a float64 ``hessian`` is the factorisation's work matrix (changed; one ``K x K`` copy
    fewer). ``overwrite_weight``: a float32 ``w`` is the walk's work matrix on the host (changed; one ``K x N`` copy
    fewer).
    """
    weight, h, hx = _work_matrices(w, hessian, overwrite_weight, overwrite_hessian)
    del w, hessian  # with overwrite_weight, a caller that handed its array over leaves it to this function alone
    k, n = weight.shape
    _check_arguments(h.shape, k, n_tokens, lazy_batch)
    bs = effective_block_size(k, block_size)
    grid = QuantGrid(bits, symmetric, positive_scales)
    h *= 2.0 / n_tokens
    diagonal = _drop_dead_channels(weight, h, hx, backend)
    scales = np.empty((math.ceil(k / bs), n), dtype=np.float32)
    zero_points = None if symmetric else np.empty_like(scales)
    perm: np.ndarray | None = None
    if act_order:
        weight, h, perm = _in_act_order(weight, h, hx, diagonal, bs, grid, scales, zero_points)
    if not backend.fits(FACTOR_MATRICES * k * k * 8 + _WALK_ARRAYS * k * n * 4):
        logger.info("GPTQ: a [%d, %d] weight does not fit %r; it runs in numpy", k, n, backend)
        h = _host(backend, h)
        backend = NUMPY
    xp = backend.xp
    upper = _inverse_cholesky_upper(backend.from_host(h), damp, backend).astype(np.float32)
    del h
    weight = backend.from_host(weight)
    scales = backend.from_host(scales)
    if zero_points is not None:
        zero_points = backend.from_host(zero_points)
    levels = _walk(xp, weight, upper, scales, zero_points, grid, bs, perm, lazy_batch)
    del weight, upper
    if perm is not None:
        unpermuted = xp.empty_like(levels)
        unpermuted[backend.from_host(perm)] = levels
        levels = unpermuted
    q_out = backend.to_host(levels.astype(np.int8 if grid.levels[0] < 0 else np.uint8))
    zp_out = None if zero_points is None else backend.to_host(zero_points.astype(np.uint8))
    result = QuantizedWeight(q=q_out, scales=backend.to_host(scales), zero_points=zp_out, block_size=bs, bits=bits)
    del levels, scales, zero_points
    backend.release()
    return result


def _work_matrices(
    w: ArrayLike, hessian: ArrayLike, overwrite_weight: bool, overwrite_hessian: bool
) -> tuple[np.ndarray, Any, Any]:
    """The weight as a float32 host matrix and the Hessian as float64 where it is given (a backend's device, or the
    host), with its array namespace; each a copy unless its ``overwrite_`` flag hands the caller's array over."""
    weight = as_float32_matrix(w)
    if not overwrite_weight and np.may_share_memory(weight, np.asarray(w)):
        weight = weight.copy()
    hx = namespace(hessian)
    h = hx.asarray(hessian, dtype=np.float64) if overwrite_hessian else hx.array(hessian, dtype=np.float64)
    return weight, h, hx


def _check_arguments(h_shape: tuple[int, ...], k: int, n_tokens: int, lazy_batch: int) -> None:
    if h_shape != (k, k):
        raise ValueError(f"hessian must be [{k}, {k}] for a weight with K={k}, got {h_shape}")
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    if lazy_batch < 1:
        raise ValueError(f"lazy_batch must be positive, got {lazy_batch}")


def _drop_dead_channels(weight: np.ndarray, h: Any, hx: Any, backend: ArrayBackend) -> np.ndarray:
    """Dead input channels (``H[i, i] == 0``) get ``H[i, i] = 1`` and ``W[i, :] = 0`` (both changed in place);
    returns the diagonal of ``H`` so changed, on the host."""
    diagonal = np.array(_host(backend, hx.diag(h)))  # a copy: the dead channels' entries change below
    dead = diagonal == 0
    if dead.any():
        index = np.flatnonzero(dead)
        h[hx.asarray(index), hx.asarray(index)] = 1.0
        weight[dead, :] = 0.0
        logger.debug("GPTQ: %d dead input channels", int(dead.sum()))
        diagonal[dead] = 1.0
    return diagonal


def _in_act_order(
    weight: np.ndarray,
    h: Any,
    hx: Any,
    diagonal: np.ndarray,
    bs: int,
    grid: QuantGrid,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
) -> tuple[np.ndarray, Any, np.ndarray]:
    """``act_order``: every block's scales (and zero points) from the original weights, written into ``scales`` and
    ``zero_points``, then the weight's rows and the Hessian permuted by descending ``diag(H)``; returns the permuted
    weight and Hessian and the permutation."""
    s_all, z_all = block_params(to_blocks(weight, bs), grid)
    scales[:] = s_all
    if zero_points is not None and z_all is not None:
        zero_points[:] = z_all
    perm = np.argsort(-diagonal, kind="stable")
    on = hx.asarray(perm)
    return weight[perm], h[hx.ix_(on, on)], perm


def _walk(
    xp: Any,
    weight: Any,
    upper: Any,
    scales: Any,
    zero_points: Any | None,
    grid: QuantGrid,
    bs: int,
    perm: np.ndarray | None,
    lazy_batch: int,
) -> Any:
    """The row walk (see the module docstring) in lazy batches of ``lazy_batch`` rows; returns the levels ``[K, N]``
    (float32, on the backend). ``weight`` is the work matrix (changed); without ``perm`` each block's scales are set
    when the walk reaches its first row (:func:`_block_params_now`)."""
    k, n = weight.shape
    levels = xp.empty((k, n), dtype=np.float32)
    for i1 in range(0, k, lazy_batch):
        i2 = min(i1 + lazy_batch, k)
        batch = weight[i1:i2]  # a view: updated in place
        errors = xp.empty((i2 - i1, n), dtype=np.float32)
        u_batch = upper[i1:i2, i1:i2]
        for i in range(i2 - i1):
            row = i1 + i
            if perm is None:
                block = row // bs
                if row % bs == 0:
                    s, z = _block_params_now(weight, upper, errors[:i], row, i2, bs, grid)
                    scales[block] = s[0]
                    if zero_points is not None and z is not None:
                        zero_points[block] = z[0]
            else:
                block = int(perm[row]) // bs
            z_row = None if zero_points is None else zero_points[block]
            _quantize_row(xp, batch, i, u_batch, levels[row], errors[i], scales[block], z_row, grid.levels)
        if i2 < k:
            weight[i2:] -= upper[i1:i2, i2:].T @ errors
    return levels


def _block_params_now(
    weight: Any, upper: Any, pending: Any, row: int, i2: int, bs: int, grid: QuantGrid
) -> tuple[Any, Any]:
    """The scales (and zero points) of the block starting at ``row``, from its current weights: rows after the lazy
    batch (from ``i2``) get the batch's ``pending`` errors so far (rows ``row - len(pending)`` to ``row``) applied to
    a copy first."""
    end = min(row + bs, weight.shape[0])
    current = weight[row:end]
    if end > i2:  # rows after this lazy batch still miss the batch's updates so far
        i1 = row - pending.shape[0]
        current = current.copy()
        current[i2 - row :] -= upper[i1:row, i2:end].T @ pending
    return block_params(current[None], grid)


def _quantize_row(
    xp: Any,
    batch: Any,
    i: int,
    u_batch: Any,
    q: Any,
    err: Any,
    s_row: Any,
    z_row: Any | None,
    levels: tuple[int, int],
) -> None:
    """Quantizes row ``i`` of the lazy ``batch`` into ``q`` and spreads its error ``err`` (both made in place: on a
    device, each operation is a kernel launch, about 10 per row) over the batch's rows after it."""
    qmin, qmax = levels
    xp.divide(batch[i], s_row, out=q)
    xp.rint(q, out=q)
    if z_row is not None:
        q += z_row
    xp.clip(q, qmin, qmax, out=q)
    if z_row is not None:
        xp.subtract(q, z_row, out=err)
        err *= s_row
    else:
        xp.multiply(q, s_row, out=err)
    xp.subtract(batch[i], err, out=err)
    err /= u_batch[i, i]
    batch[i + 1 :] -= xp.outer(u_batch[i, i + 1 :], err)
