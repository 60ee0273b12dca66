"""Statistics for comparing bench samples: Welch's t-test, a ratio of means with its interval, p-value corrections.

Pure functions over plain sequences of floats, with no dependency beyond the standard library. The Student t
distribution comes from the regularised incomplete beta function (a continued fraction, evaluated by the modified
Lentz method); its quantiles are found by bisection on the distribution function.

- ``welch``: two-sided Welch's t-test that two samples have the same mean (unequal variances).
- ``ratio_interval``: the ratio of two sample means with a confidence interval, by the delta method on the log of
  the ratio with Welch–Satterthwaite degrees of freedom (both means must be positive).
- ``drift_variance`` and ``ratio_test_across_runs``: the same ratio between two runs, with the drift of the box
  between the runs (estimated from configurations both runs hold unchanged) added to the launches' own noise.
- ``holm`` and ``benjamini_hochberg``: adjusted p-values for a family of tests, controlling the family-wise error
  rate and the false discovery rate respectively; a test is significant when its adjusted p-value is below alpha.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Correction = Literal["holm", "bh", "none"]


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean of at least one value."""
    return math.fsum(values) / len(values)


def variance(values: Sequence[float]) -> float:
    """The unbiased sample variance (n - 1 in the denominator) of at least two values."""
    m = mean(values)
    return math.fsum((v - m) ** 2 for v in values) / (len(values) - 1)


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction of the incomplete beta function, evaluated by the modified Lentz method.
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 <= p < 1) of Student's t with ``df`` degrees of freedom."""
    if not 0.5 <= p < 1.0:
        raise ValueError("t_quantile takes 0.5 <= p < 1")
    target = 2.0 * (1.0 - p)  # the two-sided tail mass beyond the quantile
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def _satterthwaite(sa: float, na: int, sb: float, nb: int) -> float:
    # Welch–Satterthwaite degrees of freedom of a sum of two scaled variances sa, sb (each already divided by n).
    return (sa + sb) ** 2 / ((sa**2 / (na - 1) if sa else 0.0) + (sb**2 / (nb - 1) if sb else 0.0))


@dataclass(frozen=True)
class Welch:
    """Welch's t-test of two samples: the statistic, its degrees of freedom, and the two-sided p-value."""

    t: float
    df: float
    p: float


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's t-test that ``a`` and ``b`` have the same mean (each needs two values).

    With no spread on either side the test degenerates: equal means give p = 1, different means p = 0.
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least two values on each side")
    ma, mb = mean(a), mean(b)
    sa, sb = variance(a) / len(a), variance(b) / len(b)
    if sa + sb == 0.0:
        return Welch(t=0.0 if ma == mb else math.copysign(math.inf, ma - mb), df=math.inf, p=1.0 if ma == mb else 0.0)
    t = (ma - mb) / math.sqrt(sa + sb)
    df = _satterthwaite(sa, len(a), sb, len(b))
    return Welch(t=t, df=df, p=t_two_sided_p(t, df))


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that ``a`` and ``b`` have the same mean (each needs two values)."""
    return welch(a, b).p


@dataclass(frozen=True)
class RatioInterval:
    """mean(a) / mean(b) and its confidence interval ``[low, high]`` at ``level``."""

    ratio: float
    low: float
    high: float
    level: float


def ratio_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> RatioInterval | None:
    """The ratio of the means of ``a`` and ``b`` with a ``level`` confidence interval, or None when it has none.

    The interval is exp(log r ± t·se) with se² = var(a)/(n_a·mean(a)²) + var(b)/(n_b·mean(b)²) (the delta method
    on log r) and t the Student quantile at the Welch–Satterthwaite degrees of freedom. It needs two values on each
    side and positive means.
    """
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = mean(a), mean(b)
    if ma <= 0.0 or mb <= 0.0:
        return None
    ratio = ma / mb
    sa = variance(a) / (len(a) * ma * ma)
    sb = variance(b) / (len(b) * mb * mb)
    if sa + sb == 0.0:
        return RatioInterval(ratio=ratio, low=ratio, high=ratio, level=level)
    half = t_quantile(0.5 + level / 2.0, _satterthwaite(sa, len(a), sb, len(b))) * math.sqrt(sa + sb)
    return RatioInterval(ratio=ratio, low=ratio * math.exp(-half), high=ratio * math.exp(half), level=level)


def _log_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float] | None:
    """log(mean(a) / mean(b)), its delta-method variance and Welch–Satterthwaite df; None without two positive means
    or two values a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = mean(a), mean(b)
    if ma <= 0.0 or mb <= 0.0:
        return None
    sa = variance(a) / (len(a) * ma * ma)
    sb = variance(b) / (len(b) * mb * mb)
    df = _satterthwaite(sa, len(a), sb, len(b)) if sa + sb > 0.0 else math.inf
    return math.log(ma / mb), sa + sb, df


def drift_variance(controls: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[float, int]:
    """The between-run variance of a log ratio, estimated from control pairs, and how many pairs it rests on.

    A control pair is the same configuration in two runs (same spec, same environment): its log ratio is drift of
    the box between the runs plus launch noise. Drift is what is left once the noise each side's launches show is
    taken out, ``mean(d² - se²)`` over the pairs, floored at zero (method of moments).
    """
    parts = [lr for a, b in controls if (lr := _log_ratio(a, b)) is not None]
    if not parts:
        return 0.0, 0
    return max(0.0, mean([d * d - se2 for d, se2, _ in parts])), len(parts)


@dataclass(frozen=True)
class DriftTest:
    """A ratio test between two runs with their drift counted in: p-value, interval and the drift's share."""

    p: float
    interval: RatioInterval
    #: The between-run standard deviation of the log ratio that was added to the launches' own noise.
    drift_sd: float


def ratio_test_across_runs(
    a: Sequence[float], b: Sequence[float], drift: float, pairs: int, level: float = 0.95
) -> DriftTest | None:
    """Test mean(a)/mean(b) = 1 where ``a`` and ``b`` come from different runs whose drift is ``drift``.

    On the log scale: t = log r / sqrt(se² + drift), with Welch–Satterthwaite degrees of freedom extended by the
    ``pairs`` the drift was estimated from (few pairs, few degrees of freedom: a wide interval). None when the
    samples cannot be tested on the log scale (fewer than two values, a non-positive mean).
    """
    lr = _log_ratio(a, b)
    if lr is None:
        return None
    d, se2, df = lr
    total = se2 + drift
    ratio = math.exp(d)
    if total == 0.0:
        return DriftTest(p=1.0 if d == 0.0 else 0.0, interval=RatioInterval(ratio, ratio, ratio, level), drift_sd=0.0)
    if drift > 0.0:
        df = total**2 / ((se2**2 / df if math.isfinite(df) and se2 else 0.0) + drift**2 / max(1, pairs))
    df = min(df, 1e6)
    half = t_quantile(0.5 + level / 2.0, df) * math.sqrt(total)
    return DriftTest(
        p=t_two_sided_p(d / math.sqrt(total), df),
        interval=RatioInterval(ratio=ratio, low=ratio * math.exp(-half), high=ratio * math.exp(half), level=level),
        drift_sd=math.sqrt(drift),
    )


def mean_interval(values: Sequence[float], level: float = 0.95) -> float | None:
    """Half the width of the t-based ``level`` confidence interval of the mean (None with fewer than two values)."""
    if len(values) < 2:
        return None
    return t_quantile(0.5 + level / 2.0, len(values) - 1) * math.sqrt(variance(values) / len(values))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate control), in the order given."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg step-up adjusted p-values (false discovery rate control), in the order given."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i], reverse=True)
    adjusted = [0.0] * m
    running = 1.0
    for k, i in enumerate(order):
        rank = m - k  # 1-based rank of p_values[i] in ascending order
        running = min(running, m * p_values[i] / rank)
        adjusted[i] = running
    return adjusted


def adjust(p_values: Sequence[float], correction: Correction) -> list[float]:
    """``p_values`` adjusted for multiple comparisons by ``correction`` (``none`` returns them unchanged)."""
    if correction == "holm":
        return holm(p_values)
    if correction == "bh":
        return benjamini_hochberg(p_values)
    return list(p_values)
