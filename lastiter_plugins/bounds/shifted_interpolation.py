r"""Bok, Su & Altschuler, "Shifted Interpolation for Differential Privacy"
(ICML 2024, arXiv 2403.00278), section 4: Gaussian-DP of the last iterate of
noisy (cyclic) gradient descent.

Everything here is in units of the per-step noise std
:math:`\sigma_p = \eta z C / b`. Our mapping (derivation in
docs/derivations/shifted-interpolation.md#si-notation):

* ``step_mu`` :math:`s = 2/z`: replace-one changes the clipped-gradient sum by
  at most 2C, so one use of the differing example moves the update by at most
  :math:`2\eta C/b = s\,\sigma_p`;
* ``contraction`` :math:`c = \max(|1-\eta\lambda r/b|, |1-\eta M r/b|)`, the
  Lipschitz constant of the (unclipped) gradient step on a batch of r examples,
  maximised over the batch sizes that occur (a short last batch contracts
  less); :math:`c \le 1` needs :math:`\eta \le 2/M`, :math:`c < 1` also
  :math:`\lambda > 0`. Only valid when clipping is never active;
* ``diameter_ratio`` :math:`\tilde D = D/\sigma_p = Db/(\eta z C)` when every
  iterate is projected onto a closed convex set of diameter D (else None).

All bounds are instances of one schedule theorem (draft, Theorem A; the
paper's shifted interpolation in f-DP form): for shifts
:math:`a_t \ge 0` with :math:`z_{t+1} = c z_t + s_t - a_t \ge 0`,
:math:`z_T = 0`, the last iterates satisfy
:math:`T(X_T, X'_T) \ge G_\mu` with :math:`\mu^2 = \sum_t a_t^2`. Every
schedule gives a valid bound, so a minimum over schedules evaluated at any
subset of candidates is valid (never below the true minimum's validity).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypedDict

import numpy as np

from lastiter_plugins.bounds import shift_schedules
from lastiter_plugins.bounds._common import batch_sizes, step_contraction
from lastiter_plugins.bounds._glue import given
from lastiter_plugins.config import LossAssumptions, TrainingConfig
from lastiter_plugins.profiles import GaussianMixtureProfile

_MIN_CONTRACTION = 1e-12  # c is raised to this: a c-Lipschitz map is c'-Lipschitz for c' >= c (sound)


def replace_one_step_mu(noise_multiplier: float) -> float:
    r"""Per-step GDP parameter :math:`s = 2/z` under replace-one (the clipped sum moves by <= 2C,
    the noise std on the sum is zC)."""
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0. Found {noise_multiplier}.")
    return 2.0 / noise_multiplier


def diameter_in_noise_units(
    diameter: float | None, *, batch_size: int, learning_rate: float, noise_multiplier: float, clip_norm: float
) -> float | None:
    r""":math:`\tilde D = D / \sigma_p = D b / (\eta z C)` (None without a projection)."""
    if diameter is None:
        return None
    # divided one factor at a time: Python floats round an overflow to inf and an underflow to 0, never raise
    return float(diameter) * batch_size / learning_rate / noise_multiplier / clip_norm


def worst_batch_contraction(
    *, learning_rate: float, strong_convexity: float, smoothness: float, dataset_size: int, batch_size: int
) -> float:
    r"""Lipschitz constant valid for every step of a pass: the maximum over the batch
    sizes r that occur (b, and a short last batch) of
    :math:`\max(|1-\eta\lambda r/b|, |1-\eta M r/b|)` (Hardt, Recht & Singer 2016,
    arXiv 1509.01240, Lemma 3.7, for the batch objective, (r lam/b)-strongly convex
    and (r M/b)-smooth). A c_r-Lipschitz map is c-Lipschitz for c >= c_r, so using
    the weakest factor at every step is sound. Unclipped gradients only."""
    sizes = {batch_size, batch_sizes(dataset_size, batch_size)[1]}
    return max(
        step_contraction(learning_rate * strong_convexity * r / batch_size, learning_rate * smoothness * r / batch_size)
        for r in sizes
    )


def _check(step_mu: float, contraction: float, diameter_ratio: float | None) -> float:
    if not step_mu >= 0:
        raise ValueError(f"step_mu must be >= 0. Found {step_mu}.")
    if not 0.0 <= contraction <= 1.0:
        raise ValueError(
            f"contraction must be in [0, 1] (eta <= 2/M) for the shifted-interpolation bounds. Found {contraction}."
        )
    if diameter_ratio is not None and not diameter_ratio >= 0:
        raise ValueError(f"diameter_ratio must be >= 0 or None. Found {diameter_ratio}.")
    return max(float(contraction), _MIN_CONTRACTION)


def _usable_ratio(diameter_ratio: float | None) -> float | None:
    """The diameter ratio the restart schedules use: None without a projection, and also where it
    overflowed (inf) or underflowed (0): the restarts are extra candidates of a minimum, so leaving
    them out can only raise the bound."""
    if diameter_ratio is None or not 0.0 < diameter_ratio < math.inf:
        return None
    return float(diameter_ratio)


def _geometric_ratio(log_c: float, steps: np.ndarray | float) -> np.ndarray:
    r""":math:`\sum_{u<B} c^u = (1-c^{B})/(1-c)` from :math:`\log c` (B >= 0; B at c = 1)."""
    steps = np.asarray(steps, dtype=float)
    if log_c == 0.0:
        return steps
    return np.expm1(steps * log_c) / math.expm1(log_c)


def _window_cost(log_c: float, removed: np.ndarray, steps: np.ndarray | float) -> np.ndarray:
    r"""Minimal :math:`\sum a_t^2` to remove ``removed`` (measured at the window's
    end) over ``steps`` noise steps: :math:`R^2 (1-c^2)/(1-c^{2m})` (c = 1: R^2/m)."""
    steps = np.asarray(steps, dtype=float)
    with np.errstate(over="ignore"):  # removed^2 overflows: the cost is inf (the divisor is >= 1)
        return np.asarray(removed, dtype=float) ** 2 / _geometric_ratio(2.0 * log_c, steps)


def _times_exp(log_a: float | np.ndarray, log_b: float | np.ndarray) -> np.ndarray:
    """exp(log_a + log_b): a product formed in log space (a factor may underflow where another
    overflows); inf where it overflows."""
    with np.errstate(over="ignore"):
        return np.exp(np.asarray(log_a, dtype=float) + log_b)


def full_batch_mu(*, step_mu: float, contraction: float, steps: int, diameter_ratio: float | None = None) -> float:
    r"""mu-GDP of the last iterate of full-batch noisy gradient descent.

    Bok, Su & Altschuler 2024 (arXiv 2403.00278), section 4, NoisyGD, strongly
    convex (c < 1) and convex (c = 1); exact for strongly convex full-batch
    descent (it equals the linear-Gaussian value, pinned by the G2 test):

    .. math:: \mu^2 = s^2\,\frac{1+c}{1-c}\cdot\frac{1-c^T}{1+c^T}\quad(c = 1:\ s^2 T).

    With a projection onto a set of diameter D (``diameter_ratio``
    :math:`\tilde D`), also the restarts at :math:`\tau = T - m`:
    :math:`\mu^2 \le (c^m\tilde D + s\frac{1-c^m}{1-c})^2\frac{1-c^2}{1-c^{2m}}`
    (:math:`c=1`: :math:`(\tilde D + ms)^2/m`), minimised over m; the paper's
    constrained convex NoisyGD bound is a relaxation of this at
    :math:`m = \lceil \tilde D/s\rceil`.

    Assumptions: b = n; every f_i convex (lam-strongly convex for c < 1) and
    M-smooth, eta <= 2/M (c = max(|1 - eta lam|, |1 - eta M|)); clipping never
    active; replace-one neighbours.

    Args:
      step_mu: s = 2/z.
      contraction: c in [0, 1].
      steps: T >= 0.
      diameter_ratio: D / sigma_p, or None (no projection).

    Returns:
      mu (0 for T = 0).
    """
    c = _check(step_mu, contraction, diameter_ratio)
    if steps < 0:
        raise ValueError(f"steps must be >= 0. Found {steps}.")
    if steps == 0 or step_mu == 0.0:
        return 0.0
    if math.isinf(step_mu):
        return math.inf
    log_c = math.log(c)
    with np.errstate(over="ignore"):  # s * (a sum >= 1) overflows: the cost is inf
        best = float(_window_cost(log_c, step_mu * _geometric_ratio(log_c, steps), steps))
    d = _usable_ratio(diameter_ratio)
    if d is not None and steps > 1:
        log_d = math.log(d)

        def cost(m: np.ndarray) -> np.ndarray:
            m = np.asarray(m, dtype=float)
            with np.errstate(over="ignore"):
                removed = _times_exp(m * log_c, log_d) + step_mu * _geometric_ratio(log_c, m)
            return _window_cost(log_c, removed, m)

        best = min(best, _integer_min(cost, 1, steps - 1))
    return math.sqrt(best)


def _integer_min(fun, lo: int, hi: int) -> float:
    r"""Minimum of ``fun`` over integers in [lo, hi] found by a golden/ternary search
    plus the end points and a dense sample. Every evaluated point is a valid bound,
    so the result is an upper bound on the true minimum, never below it."""
    if hi < lo:
        return math.inf
    if hi - lo <= 64:
        return float(np.min(fun(np.arange(lo, hi + 1))))
    sample = np.unique(np.round(np.geomspace(lo, hi, 65)).astype(np.int64))
    values = fun(sample)
    k = int(np.argmin(values))
    best = float(values[k])
    a = int(sample[max(k - 1, 0)])
    b = int(sample[min(k + 1, sample.size - 1)])
    while b - a > 64:
        m1 = a + (b - a) // 3
        m2 = b - (b - a) // 3
        f1, f2 = fun(np.array([m1, m2]))
        best = min(best, float(f1), float(f2))
        if f1 <= f2:
            b = m2
        else:
            a = m1
    return min(best, float(np.min(fun(np.arange(a, b + 1)))))


def _position_layout(steps_per_epoch: int, steps: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uses N_j and steps after the last use r_j of each batch position j (r_j = -1 if unused)."""
    full, rest = divmod(steps, steps_per_epoch)
    uses = full + (positions < rest)
    last = positions + (uses - 1) * steps_per_epoch
    after = np.where(uses > 0, steps - 1 - last, -1)
    return uses.astype(np.int64), after.astype(np.int64)


def _schedule_mus(
    step_mu: float, c: float, steps_per_epoch: int, uses: np.ndarray, gaps, after: np.ndarray, d: float | None
) -> np.ndarray:
    """mu of schedules of ``uses`` uses: all but the last spaced by l, the last ``gaps`` steps later and
    ``after`` steps before the end (the engine of docs/derivations/schedule-mixtures.md#schedule-mixtures); 0 where
    unused."""
    mus = np.zeros(np.shape(uses))
    used = uses > 0
    if not used.any() or step_mu == 0.0:
        return mus
    if math.isinf(step_mu):
        mus[used] = math.inf
        return mus
    mu2 = shift_schedules.spaced_uses_mu2(
        step_mu=step_mu,
        log_contraction=math.log(c),
        spacing=steps_per_epoch,
        uses=uses[used],
        gap=np.broadcast_to(gaps, np.shape(uses))[used],
        after=after[used],
        diameter_ratio=_usable_ratio(d),
    )
    mus[used] = np.sqrt(mu2)
    return mus


def cyclic_position_mus(
    *,
    step_mu: float,
    contraction: float,
    steps_per_epoch: int,
    steps: int,
    diameter_ratio: float | None = None,
    positions: np.ndarray | None = None,
) -> np.ndarray:
    r"""mu-GDP of the last iterate for each batch position j of the differing example,
    fixed batches in a fixed order (cyclic), l batches per pass, T steps.

    Bok, Su & Altschuler 2024 (arXiv 2403.00278), section 4, NoisyCGD
    (strongly convex c < 1, convex c = 1), refined per position: the exact optimum of
    the shift allocation for the position's N_j uses, the last r_j steps before the end
    (docs/derivations/schedule-mixtures.md#sm-spaced-uses). It is never above the closed form

    .. math:: \mu_j^2 \le s^2\Big[\theta_c(r_j+1) + \frac{c^{2l-2}(1-c^2)}{(1-c^l)^2}
       \cdot\frac{1-c^{l(N_j-1)}}{1+c^{l(N_j-1)}}\Big],

    :math:`\theta_c(m) = c^{2(m-1)}/\sum_{u<m}c^{2u}` (one feasible allocation), and
    equal to it at the worst position. With a projection (``diameter_ratio``), the
    minimum with the restart schedules (docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum). Unused positions
    (T < l) get 0.

    Assumptions: each f_i convex (lam-strongly convex for c < 1) and M-smooth,
    c the worst gradient-step Lipschitz constant over the batch sizes, c <= 1;
    clipping never active; replace-one neighbours; every batch normalised by b.

    Args:
      step_mu: s = 2/z.
      contraction: c in [0, 1].
      steps_per_epoch: l >= 1.
      steps: T >= 0.
      diameter_ratio: D / sigma_p, or None.
      positions: batch indices j (default: all 0..l-1).

    Returns:
      mu_j for each requested position. O(l) time (with a projection, times the restarts tried:
      docs/derivations/schedule-mixtures.md#sm-spaced-uses).
    """
    c = _check(step_mu, contraction, diameter_ratio)
    if steps_per_epoch < 1 or steps < 0:
        raise ValueError(f"steps_per_epoch must be >= 1 and steps >= 0. Found {steps_per_epoch}, {steps}.")
    pos = np.arange(steps_per_epoch) if positions is None else np.asarray(positions, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= steps_per_epoch):
        raise ValueError(f"positions must be in [0, {steps_per_epoch}).")
    uses, after = _position_layout(steps_per_epoch, steps, pos)
    return _schedule_mus(step_mu, c, steps_per_epoch, uses, steps_per_epoch, after, diameter_ratio)


def cyclic_mu(
    *, step_mu: float, contraction: float, steps_per_epoch: int, steps: int, diameter_ratio: float | None = None
) -> float:
    r"""mu-GDP of the last iterate, cyclic batches, worst position of the differing example.

    Bok, Su & Altschuler 2024 (arXiv 2403.00278), section 4, NoisyCGD; without
    a projection it is their formula with E = ceil(T/l) passes:

    .. math:: \mu^2 = s^2\Big[1 + \frac{c^{2l-2}(1-c^2)}{(1-c^l)^2}
       \cdot\frac{1-c^{l(E-1)}}{1+c^{l(E-1)}}\Big].

    A partial last pass is covered (draft section 3: the maximum over positions
    is at the smallest r_j in each group of equal N_j, i.e. j = (T mod l) - 1
    and j = l - 1), so this is O(1) in T and l. Assumptions as
    :func:`cyclic_position_mus`.
    """
    rest = steps % steps_per_epoch if steps_per_epoch >= 1 else 0
    candidates = sorted({steps_per_epoch - 1, (rest - 1) % max(steps_per_epoch, 1)})
    mus = cyclic_position_mus(
        step_mu=step_mu,
        contraction=contraction,
        steps_per_epoch=steps_per_epoch,
        steps=steps,
        diameter_ratio=diameter_ratio,
        positions=np.array(candidates),
    )
    return float(mus.max())


def batch_position_weights(dataset_size: int, batch_size: int) -> np.ndarray:
    r"""Probability |B_j|/n that a uniformly random permutation puts a given example
    in batch j (the last batch may be short)."""
    if dataset_size < 1 or batch_size < 1:
        raise ValueError(f"dataset_size and batch_size must be >= 1. Found {dataset_size}, {batch_size}.")
    batches, last = batch_sizes(dataset_size, batch_size)
    sizes = np.full(batches, float(batch_size))
    sizes[-1] = last
    return sizes / dataset_size


#: Batch positions kept one by one in the shuffle-once mixture (per group of equal use counts); beyond,
#: positions are grouped into blocks whose (r + 1) grows by at most _BLOCK_GROWTH.
EXACT_POSITIONS = 4096
_BLOCK_GROWTH = 1.0 + 1.0 / 64.0


def _block_starts(first: int, last: int) -> np.ndarray:
    """Starts of consecutive blocks covering the integers first..last: the first EXACT_POSITIONS one by
    one, then blocks [r0, r1] with r1 + 1 <= (r0 + 1) * _BLOCK_GROWTH. O(EXACT_POSITIONS + log(last))."""
    exact_end = min(last, first + EXACT_POSITIONS - 1)
    starts = list(range(first, exact_end + 1))
    r = exact_end + 1
    while r <= last:
        starts.append(r)
        r = max(r + 1, math.floor((r + 1) * _BLOCK_GROWTH))
    return np.array(starts, dtype=np.int64)


def shuffle_once_profile(
    *,
    step_mu: float,
    contraction: float,
    dataset_size: int,
    batch_size: int,
    steps: int,
    diameter_ratio: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Privacy profile of the last iterate under shuffle-once (one secret uniformly
    random permutation, then a fixed order for every pass): the mixture
    :math:`\delta(\varepsilon) \le \sum_j \frac{|B_j|}{n}\,\delta_{\mu_j}(\varepsilon)`.

    Beyond Bok, Su & Altschuler 2024 (arXiv 2403.00278): given the permutation
    the run is cyclic with the differing example in batch j (same j for both
    datasets under replace-one; the batch sizes and c do not depend on the
    permutation), so each conditional pair is :math:`\mu_j`-GDP by
    :func:`cyclic_position_mus`; the released laws are mixtures with the same
    weights, and the hockey-stick divergence is jointly convex (draft section 4;
    as Ye & Shokri 2022, arXiv 2203.05363, Thm 4.2, average positions in Renyi form).

    Bounded memory for any number of batches l = ceil(n/b) (l can be 1e9).
    Position j is used :math:`N_j` times, the last use :math:`r_j` steps before the
    end: with T = E l + k (0 <= k < l), the positions j < k have :math:`N_j = E + 1`
    and :math:`r_j = k - 1 - j` (r over 0..k-1), the others :math:`N_j = E` and
    :math:`r_j = l + k - 1 - j` (r over k..l-1; the short last batch, j = l - 1, has
    r = k, the first of its group). Within a group :math:`\mu_j` depends on
    :math:`r_j` only and is non-increasing in it (docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum, Lemma
    2:
    a smaller r_j moves every use later). Blocks of
    consecutive r (:func:`_block_starts`) are therefore given their largest
    :math:`\mu`, the one at their smallest r, with the block's total weight. This
    can only raise the mixture profile: :math:`\delta_\mu(\varepsilon)` is
    increasing in :math:`\mu` for every :math:`\varepsilon` (Dong, Roth & Su 2019,
    arXiv 1905.02383: :math:`G_\mu` decreases in :math:`\mu`), so
    :math:`\sum_{j\in B} w_j\delta_{\mu_j} \le (\sum_{j\in B} w_j)\,\delta_{\max_B\mu_j}`,
    and likewise the Renyi mixture, :math:`e^{(\alpha-1)\alpha\mu^2/2}` being
    increasing in :math:`\mu`. With l <= EXACT_POSITIONS no position is grouped.

    Returns:
      (weights, mus): for l <= EXACT_POSITIONS one component per batch position j
      (in order); otherwise one per block, O(EXACT_POSITIONS + log l) of them.
    """
    per_epoch, short = batch_sizes(dataset_size, batch_size)  # short: examples in the last batch
    if per_epoch <= EXACT_POSITIONS:
        weights = batch_position_weights(dataset_size, batch_size)
        mus = cyclic_position_mus(
            step_mu=step_mu,
            contraction=contraction,
            steps_per_epoch=weights.size,
            steps=steps,
            diameter_ratio=diameter_ratio,
        )
        return weights, mus
    c = _check(step_mu, contraction, diameter_ratio)
    if steps < 0:
        raise ValueError(f"steps must be >= 0. Found {steps}.")
    full, rest = divmod(steps, per_epoch)
    groups = [(full + 1, 0, rest - 1)] if rest > 0 else []
    groups.append((full, rest, per_epoch - 1))
    weight_parts: list[np.ndarray] = []
    use_parts: list[np.ndarray] = []
    after_parts: list[np.ndarray] = []
    for group_uses, first, last in groups:
        starts = _block_starts(first, last)
        counts = np.diff(np.append(starts, last + 1)).astype(float)
        examples = counts * batch_size
        if group_uses == full:
            examples[0] -= batch_size - short  # the short last batch is at r = rest, the first of this group
        weight_parts.append(examples / dataset_size)
        use_parts.append(np.full(starts.size, group_uses, dtype=np.int64))
        after_parts.append(starts)
    w, n_uses, r = np.concatenate(weight_parts), np.concatenate(use_parts), np.concatenate(after_parts)
    return w, _schedule_mus(step_mu, c, per_epoch, n_uses, per_epoch, r, diameter_ratio)


def last_pass_mixture(
    *,
    step_mu: float,
    contraction: float,
    steps_per_epoch: int,
    steps: int,
    block_weights: Callable[[np.ndarray, np.ndarray], np.ndarray],
    unreached_weight: float,
    diameter_ratio: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""The schedule mixture of every scheme that draws the differing example's position afresh each pass
    (docs/derivations/schedule-mixtures.md#sm-reshuffle): every pass but the last one started relaxed to its
    worst case, a use at the pass's last step (Lemma 2: a later use never lowers :math:`\mu`), and the last
    pass mixed over the step p of its last use. With T = E l + k: for k = 0, that use at (E-1) l + p; for
    k > 0 and p < k, at E l + p; for k > 0 and no use in the partial pass, one component (the previous pass's
    last step is the last use). The caller gives the law of p, through r = window - 1 - p (the steps after
    that use; window = k, or l when k = 0).

    Args:
      step_mu: s, the shift one use claims (in per-step noise stds).
      contraction: c in [0, 1], every step's Lipschitz constant.
      steps_per_epoch: l >= 1.
      steps: T >= 0.
      block_weights: (starts, ends) -> the probability that the last pass's last use has r in
        [start, end), for consecutive blocks covering 0..window - 1 (starts[0] = 0).
      unreached_weight: the probability that a partial last pass does not use the example (0 when k = 0).
      diameter_ratio: D / sigma_p, or None.

    Returns:
      (weights, mus): one component per r (per block of r, given the block's largest mu, its smallest r:
      within the last pass mu is non-increasing in r by Lemma 2, when there are more than EXACT_POSITIONS),
      plus one for a partial last pass that does not use the example.
    """
    c = _check(step_mu, contraction, diameter_ratio)
    if steps < 0:
        raise ValueError(f"steps must be >= 0. Found {steps}.")
    full, rest = divmod(steps, steps_per_epoch)
    window = rest if rest > 0 else steps_per_epoch  # positions used in the last pass started
    # blocks of consecutive r = window - 1 - p, each given its smallest r (the largest mu)
    starts = _block_starts(0, window - 1) if window > EXACT_POSITIONS else np.arange(window)
    weights = [block_weights(starts, np.append(starts[1:], window))]
    uses = [np.full(starts.size, full + 1 if rest > 0 else full, dtype=np.int64)]
    gaps = [window - starts]  # g = p + 1 steps after the previous pass's last step
    after = [starts]
    if rest > 0:  # no use in the partial pass; the last use ends pass E - 1
        weights.append(np.array([unreached_weight]))
        uses.append(np.array([full], dtype=np.int64))
        gaps.append(np.array([steps_per_epoch]))
        after.append(np.array([rest]))
    w, n_uses, g, r = (np.concatenate(x) for x in (weights, uses, gaps, after))
    return w, _schedule_mus(step_mu, c, steps_per_epoch, n_uses, g, r, diameter_ratio)


def reshuffle_profile(
    *,
    step_mu: float,
    contraction: float,
    dataset_size: int,
    batch_size: int,
    steps: int,
    diameter_ratio: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Privacy profile of the last iterate under reshuffling (a fresh secret uniformly
    random permutation every pass): a mixture
    :math:`\delta(\varepsilon) \le \sum_p w_p\,\delta_{\mu_p}(\varepsilon)` over the
    differing example's position p in the last pass started.

    Our extension of Bok, Su & Altschuler 2024 (arXiv 2403.00278), section 4
    (docs/derivations/schedule-mixtures.md#sm-reshuffle): the positions of the differing example in
    the passes are independent of each other and of the data, and the same in both
    datasets (replace-one), so the released laws are mixtures over them with the same
    weights (joint convexity). The schedules are those of :func:`last_pass_mixture`, the last pass
    mixed exactly over p (weight |B_p|/n).

    Assumptions as :func:`shuffle_once_profile`; c the weakest contraction over the
    batch sizes of a pass (fixed by n and b, not by the permutations).

    Returns:
      (weights, mus): one component per position p of the last pass (per block of
      positions, given the block's largest mu, when there are more than
      EXACT_POSITIONS), plus one for the positions a partial last pass does not reach.
    """
    per_epoch, short = batch_sizes(dataset_size, batch_size)  # short: examples in the last batch
    rest = steps % per_epoch if steps >= 0 else 0

    def block_weights(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        examples = (ends - starts).astype(float) * batch_size
        if rest == 0:
            examples[0] -= batch_size - short  # r = 0 is p = l - 1, the short last batch
        return examples / dataset_size

    return last_pass_mixture(
        step_mu=step_mu,
        contraction=contraction,
        steps_per_epoch=per_epoch,
        steps=steps,
        block_weights=block_weights,
        unreached_weight=(dataset_size - rest * batch_size) / dataset_size,
        diameter_ratio=diameter_ratio,
    )


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


class _Inputs(TypedDict):
    step_mu: float
    contraction: float
    diameter_ratio: float | None


def _inputs(cfg: TrainingConfig, a: LossAssumptions) -> _Inputs:
    """Our parameters in the units of Bok, Su & Altschuler: per-step mu s = 2/z, the
    weakest contraction over the batch sizes of a pass, the diameter over sigma_p."""
    learning_rate = given(cfg.learning_rate, "learning_rate")
    return {
        "step_mu": replace_one_step_mu(cfg.noise_multiplier),
        "contraction": worst_batch_contraction(
            learning_rate=learning_rate,
            strong_convexity=a.strong_convexity,
            smoothness=given(a.smoothness, "smoothness"),
            dataset_size=cfg.dataset_size,
            batch_size=cfg.batch_size,
        ),
        "diameter_ratio": diameter_in_noise_units(
            a.diameter,
            batch_size=cfg.batch_size,
            learning_rate=learning_rate,
            noise_multiplier=cfg.noise_multiplier,
            clip_norm=cfg.clip_norm,
        ),
    }


def shifted_interpolation_full_batch(cfg: TrainingConfig, a: LossAssumptions) -> GaussianMixtureProfile:
    return GaussianMixtureProfile.gaussian(full_batch_mu(steps=cfg.steps, **_inputs(cfg, a)))


def shifted_interpolation_cyclic(cfg: TrainingConfig, a: LossAssumptions) -> GaussianMixtureProfile:
    mu = cyclic_mu(steps_per_epoch=cfg.steps_per_epoch, steps=cfg.steps, **_inputs(cfg, a))
    return GaussianMixtureProfile.gaussian(mu)


def shifted_interpolation_shuffle(cfg: TrainingConfig, a: LossAssumptions) -> GaussianMixtureProfile:
    weights, mus = shuffle_once_profile(
        dataset_size=cfg.dataset_size, batch_size=cfg.batch_size, steps=cfg.steps, **_inputs(cfg, a)
    )
    return GaussianMixtureProfile.mixture(weights, mus)


def shifted_interpolation_reshuffle(cfg: TrainingConfig, a: LossAssumptions) -> GaussianMixtureProfile:
    weights, mus = reshuffle_profile(
        dataset_size=cfg.dataset_size, batch_size=cfg.batch_size, steps=cfg.steps, **_inputs(cfg, a)
    )
    if not cfg.order_secret:
        # a public order is one fixed schedule: its mu is at most the largest component's (every pass but the
        # last relaxed to its last step, the last at its worst position): docs/derivations/public-order.md#po-reshuffle
        return GaussianMixtureProfile.gaussian(float(np.max(mus)))
    return GaussianMixtureProfile.mixture(weights, mus)
