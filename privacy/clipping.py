"""Clipping: bound what one tenant's upload can be, so noise can be calibrated to it.

Three clips, all pure and returning new arrays:

* :func:`clip_l2` scales the array so its Frobenius (L2) norm is at most C (Felb Sec. 3.3,
  "we clip all V_i with clipping threshold theta"; Abadi et al. 2016 per-example clipping);
* :func:`clip_l1` scales it so its L1 norm is at most C (the norm the Laplace mechanism
  needs);
* :func:`clip_value` clips every entry to [-delta, delta] (RFRec eq. 9, ``Clip(V, delta)``).

:func:`clip_arrays` clips several arrays of one upload *jointly*: the norm of their
concatenation is bounded by C (an ADMM upload has two arrays, W_i and Y_i; they are scaled
by the same factor, so their ratio survives). A zero or tiny norm never divides: the factor
is ``min(1, C / norm)`` evaluated as ``C / max(norm, C)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np

Norm = Literal["l2", "l1", "value"]
NORMS: tuple[str, ...] = ("l2", "l1", "value")


def _check_bound(bound: float) -> float:
    if not np.isfinite(bound) or bound <= 0:
        raise ValueError(f"clip bound must be a positive finite number, got {bound!r}")
    return float(bound)


def _scale(norm: float, bound: float) -> float:
    """min(1, bound / norm) without dividing by zero (norm 0 -> factor 1)."""
    return bound / max(norm, bound)


def clip_l2(x: np.ndarray, bound: float) -> np.ndarray:
    """Scale ``x`` so that ||x||_F <= bound; unchanged when already inside the ball."""
    bound = _check_bound(bound)
    return x * _scale(float(np.linalg.norm(x.ravel())), bound)


def clip_l1(x: np.ndarray, bound: float) -> np.ndarray:
    """Scale ``x`` so that sum |x| <= bound; unchanged when already inside the ball."""
    bound = _check_bound(bound)
    return x * _scale(float(np.abs(x).sum()), bound)


def clip_value(x: np.ndarray, bound: float) -> np.ndarray:
    """Element-wise clip to [-bound, bound]: ``Clip(V, delta)`` of RFRec eq. (9)."""
    bound = _check_bound(bound)
    return np.clip(x, -bound, bound)


def joint_norm(arrays: Mapping[str, np.ndarray], norm: Norm) -> float:
    """The L2 / L1 norm of the concatenation of ``arrays`` (max |entry| for "value")."""
    flat = [np.ravel(a) for a in arrays.values()]
    if not flat:
        return 0.0
    cat = np.concatenate(flat)
    if norm == "l2":
        return float(np.linalg.norm(cat))
    if norm == "l1":
        return float(np.abs(cat).sum())
    if norm == "value":
        return float(np.abs(cat).max(initial=0.0))
    raise ValueError(f"unknown norm {norm!r}; expected one of {', '.join(NORMS)}")


def clip_arrays(arrays: Mapping[str, np.ndarray], bound: float, norm: Norm
                ) -> dict[str, np.ndarray]:
    """Clip the arrays of one upload jointly (the concatenation's norm is at most ``bound``).

    Parameters
    ----------
    arrays : mapping name -> array
        The array fields of an upload (``Message.arrays()``); not modified.
    bound : float
        C for "l2" and "l1" (bound on the norm of the concatenation), delta for "value".
    norm : {"l2", "l1", "value"}

    Returns
    -------
    dict name -> clipped float64 array of the same shape.
    """
    bound = _check_bound(bound)
    as_float = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    if norm == "value":
        return {k: clip_value(v, bound) for k, v in as_float.items()}
    factor = _scale(joint_norm(as_float, norm), bound)
    return {k: v * factor for k, v in as_float.items()}
