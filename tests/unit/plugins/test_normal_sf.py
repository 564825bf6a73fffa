"""The SLO-risk scorer's normal tail, 1 - Phi(z) = erfc(z / sqrt 2) / 2, against references:
a 50-digit one (mpmath, where installed) and the standard library's NormalDist; and the
closed-form approximation it replaced (Abramowitz and Stegun 7.1.26, absolute error below
1.5e-7 in erfc) stays within that approximation's own bound of it."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from scheduler.plugins.scorers.slo_risk import normal_sf

Z = np.concatenate([np.linspace(-10.0, 10.0, 4001), [-37.5, -8.0, -1e-300, 0.0, 1e-300, 8.0, 37.5]])


def abramowitz_stegun_sf(z: np.ndarray) -> np.ndarray:
    """The approximation normal_sf used before (7.1.26), as it was written."""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erfc = poly * np.exp(-x * x)
    tail: np.ndarray = np.where(z >= 0, 0.5 * erfc, 1.0 - 0.5 * erfc)
    return tail


def test_relative_error_against_a_50_digit_reference() -> None:
    import mpmath  # (installed with torch's sympy)

    mpmath.mp.dps = 50
    got = normal_sf(Z)
    for z, value in zip(Z.tolist(), got.tolist(), strict=True):
        exact = mpmath.erfc(mpmath.mpf(z) / mpmath.sqrt(2)) / 2
        relative = abs(mpmath.mpf(value) - exact) / exact
        # |z| <= 10 is the documented range of the relative bound (the argument's own rounding,
        # magnified by ~z^2 in the far tail, dominates beyond it); the absolute bound holds everywhere.
        if abs(z) <= 10:
            assert relative < 1e-13, (z, value, exact)
        assert abs(mpmath.mpf(value) - exact) < 2e-16, (z, value, exact)


def test_absolute_error_against_the_standard_librarys_normal() -> None:
    reference = NormalDist()
    got = normal_sf(Z)
    for z, value in zip(Z.tolist(), got.tolist(), strict=True):
        # 1 - cdf cancels in the upper tail (its own error is ~1e-16 absolute there)
        assert abs(value - (1.0 - reference.cdf(z))) < 2e-16, z


def test_shape_symmetry_and_monotonicity() -> None:
    got = normal_sf(Z)
    assert got.dtype == np.float64 and got.shape == Z.shape
    assert normal_sf(np.array([0.0]))[0] == 0.5
    # non-increasing everywhere, strictly where 1 - Phi is not within an ulp of 1
    assert np.all(np.diff(normal_sf(np.linspace(-8, 8, 1601))) <= 0)
    assert np.all(np.diff(normal_sf(np.linspace(-7, 8, 1501))) < 0)
    mirrored = normal_sf(-Z)
    assert np.all(np.abs(got + mirrored - 1.0) < 2e-16)
    assert normal_sf(np.array([math.inf, -math.inf])).tolist() == [0.0, 1.0]
    assert math.isnan(normal_sf(np.array([math.nan]))[0])
    assert normal_sf(np.zeros(0)).shape == (0,)


def test_the_replaced_approximation_is_within_its_bound_of_it() -> None:
    assert np.max(np.abs(abramowitz_stegun_sf(Z) - normal_sf(Z))) < 0.75e-7
