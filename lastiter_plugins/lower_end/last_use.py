r"""How tight, cyclic runs: instances that show the differing record's last use against the last step's
noise alone (docs/derivations/lower-end.md#last-use-instances).

With cyclic batches the order is public, so the record may sit in the batch of the last step
(``j* = (T - 1) mod l``) and the other records' losses may depend on the batch they sit in. Two
families clear the coordinate the last use writes to, right before it:

* G5, :class:`Wall` (a diameter D): one dimension, the segment ``[-D/2, D/2]``; every batch but the
  record's pushes the iterate onto the end -D/2, where the projection forgets the past exactly; the
  record's last use then moves it off the wall by ``-+eta gamma / b`` with one step of noise.
* G6, :class:`Erased` (no domain; convex, or strong convexity outside the clip): the other records'
  losses are Huber functions of curvature kappa <= M that erase a coordinate every step (exactly when
  ``eta M >= 1``); with a *clock* (a third coordinate the others push at a steady rate), the record's
  loss writes its earlier uses on a first coordinate (linear losses) and its last one on the erased
  coordinate: the two terms of the cyclic upper bound.

Each instance writes out its losses (:meth:`Wall.gradient`, :meth:`Erased.gradient`: per-example
gradients, by role) for the tests, its :class:`~lastiter_plugins.lower_end.declarations.InstanceProperties`
for :func:`~lastiter_plugins.lower_end.declarations.violations`, and computes the lower end of its exact
epsilon (:meth:`Wall.epsilon`, :meth:`Erased.epsilon`) with mixture.py's certified half-line tests.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import signal, stats

from lastiter_plugins.bounds._common import batch_sizes
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.lower_end import mixture
from lastiter_plugins.lower_end.declarations import ESCAPE_BUDGET, TOO_LARGE, InstanceProperties

#: The largest escape probability with which an instance is still used (as for G4).
MAX_ESCAPE = 1e-3
#: G6 holds a few arrays of one number per step: beyond this many steps, no instance (about a second).
MAX_ERASED_STEPS = 2 * 10**6
#: The clock slopes tried (the smallest one whose switch holds but with probability ESCAPE_BUDGET wins).
CLOCK_SLOPES = 1e-3 * 2.0 ** (np.arange(57) / 4.0)  # 1e-3 ... 16
#: Relative margin for floating-point rounding of the constants that must stay within a declaration.
_ROUNDING = 1e-12


def _batch_layout(config: TrainingConfig) -> tuple[np.ndarray, int]:
    """(sizes of the l batches of a pass, j*): the record sits in the batch of the last step."""
    per_epoch, last = batch_sizes(config.dataset_size, config.batch_size)
    sizes = np.full(per_epoch, config.batch_size, dtype=np.int64)
    sizes[-1] = last
    return sizes, (config.steps - 1) % per_epoch


def _noise_std(config: TrainingConfig) -> float:
    assert config.learning_rate is not None  # candidates() requires it
    return config.learning_rate * config.noise_multiplier * config.clip_norm / config.batch_size


def _periodic_affine(rho: np.ndarray, drift: np.ndarray, steps: int) -> np.ndarray:
    r"""``y_0 = 0``, ``y_{t+1} = rho_{t mod l} y_t + drift_{t mod l}``: the array ``y_0 .. y_steps``.

    Per pass the map is affine, ``y -> A y + B``; the values at the starts of the passes follow a
    scalar recursion (a linear filter), and within a pass ``y_{e l + i} = P_i y_{e l} + Q_i``."""
    length = rho.size
    prefix = np.concatenate(([1.0], np.cumprod(rho)))
    offset = np.zeros(length + 1)
    for i in range(length):
        offset[i + 1] = rho[i] * offset[i] + drift[i]
    passes = steps // length + 1
    starts = signal.lfilter([1.0], [1.0, -prefix[-1]], np.concatenate(([0.0], np.full(passes - 1, offset[-1]))))
    values = prefix[None, :length] * starts[:, None] + offset[None, :length]
    return values.ravel()[: steps + 1]


# ------------------------------------------------------------------------------------------ G5


@dataclasses.dataclass(frozen=True)
class Wall:
    r"""G5: the last use against a wall (docs/derivations/lower-end.md#last-use-instances).

    One dimension, the run projecting onto ``[-D/2, D/2]``. Losses: the record
    ``lam_in/2 x^2 +- gamma x`` (``gamma = C - lam_in D/2``; + in the first dataset), every record
    outside the record's batch (a *pusher*) ``lam_in/2 x^2 + gamma x``, the record's batch-mates
    ``lam_in/2 x^2``; the pipeline adds ``lam_out x`` after the clipped mean when the strong convexity
    is an l2 term outside the clip."""

    clip: float
    lam_in: float
    lam_out: float
    diameter: float

    @property
    def gamma(self) -> float:
        """The record's (and the pushers') linear coefficient: |gradient| <= lam_in D/2 + gamma = C on K."""
        return self.clip - self.lam_in * self.diameter / 2.0

    def properties(self, config: TrainingConfig) -> InstanceProperties:
        return InstanceProperties(
            family="G5",
            smoothness=self.lam_in + self.lam_out,
            strong_convexity=self.lam_in + self.lam_out,
            per_example_strong_convexity=self.lam_in,
            diameter=self.diameter,
            max_gradient_norm=self.lam_in * self.diameter / 2.0 + self.gamma,
            scalar_glm=True,  # 1-D: lam_in/2 x^2 + g x = phi(<1, x>) with phi convex
            l2_outside=self.lam_out,
            config=config,
        )

    def roles(self, config: TrainingConfig, step: int) -> dict[str, int]:
        """How many records of each role the batch of ``step`` holds."""
        sizes, j_star = _batch_layout(config)
        j = step % sizes.size
        return {"record": 1, "mate": int(sizes[j]) - 1} if j == j_star else {"pusher": int(sizes[j])}

    def gradient(self, role: str, x: np.ndarray, first: bool) -> np.ndarray:
        """Per-example gradient of a record of ``role`` at points ``x`` (shape (..., 1)), in the first
        dataset or the other."""
        linear = {"record": self.gamma if first else -self.gamma, "pusher": self.gamma, "mate": 0.0}[role]
        return self.lam_in * x + linear

    def _wall_escape(self, config: TrainingConfig) -> float:
        r"""A bound on the probability that ``X_{T-1} != -D/2`` (any history), minimised over the number
        m of pusher steps used: ``sum_t Phi_c((d_t - D/m)/sigma)`` over the last m of them."""
        assert config.learning_rate is not None
        sizes, _ = _batch_layout(config)
        lr, sigma, steps = config.learning_rate, _noise_std(config), config.steps
        pusher_steps = np.arange(max(steps - sizes.size, 0), steps - 1)  # the pass before the last use
        if pusher_steps.size == 0:
            return 1.0
        n = sizes[pusher_steps % sizes.size].astype(float)
        room = self.clip - self.lam_in * self.diameter  # the pushers' least pull, at -D/2
        drift = lr * ((n / config.batch_size) * room - self.lam_out * self.diameter / 2)
        best = 1.0
        for m in range(1, drift.size + 1):
            last = drift[-m:]
            advance = self.diameter / m
            if advance < last.min():
                best = min(best, float(np.sum(stats.norm.sf((last - advance) / sigma))))
        return min(1.0, best * (1.0 + 1e-9))

    def epsilon(self, config: TrainingConfig, delta: float) -> tuple[float | None, str]:
        """The lower end of this instance's exact epsilon, or None and why."""
        assert config.learning_rate is not None
        escape = self._wall_escape(config)
        if escape >= MAX_ESCAPE:
            return None, (
                f"G5: the other batches cannot hold the iterate on the end of the segment (probability bound "
                f"{escape:.2g} of missing it)"
            )
        sizes, j_star = _batch_layout(config)
        lr, half = config.learning_rate, self.diameter / 2.0
        rho_star = 1.0 - lr * (self.lam_in * sizes[j_star] / config.batch_size + self.lam_out)
        centre = -rho_star * half  # the mean of the last step's image of the wall, before the record's move
        law = mixture.finite_law(np.ones(1), np.ones(1), "one point")
        eps = mixture.epsilon_lower_end(
            law,
            lr * self.gamma / config.batch_size,
            _noise_std(config),
            add_or_remove=False,
            delta=delta,
            escape=escape,
            thresholds=(-half - centre, half - centre),
        )
        return eps, self.describe(escape)

    def describe(self, escape: float) -> str:
        return (
            f"the last use against a wall (cyclic, the record in the last batch; the other batches push the "
            f"iterate onto the end of a segment of length D = {self.diameter:g} with |gradient| = {self.clip:.4g}, "
            f"the record's |gradient| {self.gamma:.4g}; off the wall with probability <= {escape:.1e})"
        )


# ------------------------------------------------------------------------------------------ G6


@dataclasses.dataclass(frozen=True)
class Clock:
    r"""The switch of G6 with a clock: the record's loss
    ``c [+-x1 + h(+-(x2 - x1) + k (x3 - theta)) - (k/2) x3]``, h the smoothed ReLU of width w; the
    other records push x3 by ``push`` (their loss ``H(x2) - push x3``)."""

    slope: float  # k
    theta: float
    width: float  # w
    scale: float  # c = C / sqrt(1 + k^2/4), rounded down
    push: float  # p = sqrt(C^2 - (kappa R2)^2), rounded down


@dataclasses.dataclass(frozen=True)
class Ideal:
    r"""The exact law of the ideal process's last iterate, reduced to one statistic ``S = weights . x``:
    ``N(+-shift, std^2)`` in the two datasets, and the escape bound off which the pipeline equals it."""

    weights: np.ndarray
    shift: float
    std: float
    escape: float


@dataclasses.dataclass(frozen=True)
class Erased:
    r"""G6: the last use on an erased coordinate (docs/derivations/lower-end.md#last-use-instances).

    Every other record's loss is ``H(x2)`` (Huber, curvature kappa on ``|x2| <= radius``), minus
    ``push x3`` with a clock. Without a clock (one dimension, x = x2) the record's loss is ``+-C x``;
    with one (x = (x1, x2, x3)), see :class:`Clock`."""

    clip: float
    lam_out: float
    kappa: float
    radius: float
    clock: Clock | None = None

    @property
    def dimension(self) -> int:
        return 1 if self.clock is None else 3

    def properties(self, config: TrainingConfig) -> InstanceProperties:
        if self.clock is None:
            record_smoothness, record_norm = 0.0, self.clip
            other_norm = self.kappa * self.radius
        else:
            k = self.clock.slope
            record_smoothness = self.clock.scale * (2.0 + k * k) / self.clock.width
            record_norm = self.clock.scale * math.sqrt(1.0 + k * k / 4.0)
            other_norm = math.hypot(self.kappa * self.radius, self.clock.push)
        return InstanceProperties(
            family="G6",
            smoothness=max(self.kappa, record_smoothness) + self.lam_out,
            strong_convexity=self.lam_out,
            per_example_strong_convexity=0.0,
            diameter=None,
            max_gradient_norm=max(record_norm, other_norm),
            scalar_glm=self.clock is None,  # the clock's record depends on three directions
            l2_outside=self.lam_out,
            config=config,
        )

    def roles(self, config: TrainingConfig, step: int) -> dict[str, int]:
        """How many records of each role the batch of ``step`` holds."""
        sizes, j_star = _batch_layout(config)
        j = step % sizes.size
        return {"record": 1, "other": int(sizes[j]) - 1} if j == j_star else {"other": int(sizes[j])}

    def gradient(self, role: str, x: np.ndarray, first: bool) -> np.ndarray:
        """Per-example gradient of a record of ``role`` at points ``x`` (shape (..., dimension)), in the
        first dataset or the other."""
        x = np.asarray(x, dtype=float)
        out = np.zeros_like(x)
        erased = 0 if self.clock is None else 1
        sign = 1.0 if first else -1.0
        if role == "other":
            out[..., erased] = self.kappa * np.clip(x[..., erased], -self.radius, self.radius)
            if self.clock is not None:
                out[..., 2] = -self.clock.push
            return out
        if self.clock is None:
            out[..., 0] = sign * self.clip
            return out
        ck = self.clock
        v = sign * (x[..., 1] - x[..., 0]) + ck.slope * (x[..., 2] - ck.theta)
        h1 = np.clip(v / ck.width, 0.0, 1.0)  # h'(v)
        out[..., 0] = ck.scale * sign * (1.0 - h1)
        out[..., 1] = ck.scale * sign * h1
        out[..., 2] = ck.scale * ck.slope * (h1 - 0.5)
        return out

    def ideal(self, config: TrainingConfig) -> Ideal:
        """The ideal process's last iterate, reduced to one statistic, and the escape bound."""
        return _ideal(config, self.lam_out, self.kappa, self.clip, self.clock, self.radius)

    def epsilon(self, config: TrainingConfig, delta: float) -> tuple[float | None, str]:
        """The lower end of this instance's exact epsilon, or None and why."""
        ideal = self.ideal(config)
        if ideal.escape >= MAX_ESCAPE:
            return None, f"G6: the iterates may leave the region where it is Gaussian (bound {ideal.escape:.2g})"
        law = mixture.finite_law(np.ones(1), np.ones(1), "one point")
        eps = mixture.epsilon_lower_end(
            law, ideal.shift, ideal.std, add_or_remove=False, delta=delta, escape=ideal.escape
        )
        return eps, self.describe(ideal.escape)

    def describe(self, escape: float) -> str:
        text = (
            f"the last use on a coordinate the other records' curvature {self.kappa:.4g} erases (cyclic, the record "
            f"in the last batch; Huber within |x| <= {self.radius:.3g})"
        )
        if self.clock is not None:
            text += (
                f", the earlier uses linear on a second coordinate, switched by a clock coordinate (slope "
                f"{self.clock.slope:.3g}, the record's |gradient| {self.clock.scale:.4g})"
            )
        return text + f", left with probability <= {escape:.1e}"


@dataclasses.dataclass(frozen=True)
class _Moments:
    """Means and variances of the ideal process, per coordinate, at the states 0 .. T (unit shifts)."""

    uses: np.ndarray  # the record's use steps, the last one T - 1
    erased_var: np.ndarray  # Var X2_t (x2: the erased coordinate)
    erased_mean: np.ndarray  # |E X2_t| per unit of the record's move eta c / b (clock: 0 before the last step)
    linear_var: np.ndarray  # Var X1_t (clock only)
    linear_mean: np.ndarray  # |E X1_t| per unit of the record's move (clock only; the earlier uses)
    clock_push: np.ndarray  # E X3_t per unit of the others' x3 gradient (clock only)
    clock_record: np.ndarray  # E X3_t per unit of the record's x3 gradient (clock only)
    clock_var: np.ndarray
    rho_last: float  # the erased coordinate's contraction at the last step


def _moments(config: TrainingConfig, lam_out: float, kappa: float, clock: bool) -> _Moments:
    assert config.learning_rate is not None
    lr, b, steps, sigma = config.learning_rate, config.batch_size, config.steps, _noise_std(config)
    sizes, j_star = _batch_layout(config)
    others = sizes.astype(float)
    others[j_star] -= 1.0
    use = np.zeros(sizes.size)
    use[j_star] = 1.0
    rho2 = 1.0 - lr * (kappa * others / b + lam_out)
    rho_o = np.full(sizes.size, 1.0 - lr * lam_out)
    noise = np.full(sizes.size, sigma**2)
    uses = np.arange(j_star, steps, sizes.size)
    erased_var = _periodic_affine(rho2**2, noise, steps)
    if not clock:
        erased_mean = _periodic_affine(rho2, use, steps)
        zeros = np.zeros(0)
        return _Moments(uses, erased_var, erased_mean, zeros, zeros, zeros, zeros, zeros, float(rho2[j_star]))
    return _Moments(
        uses=uses,
        erased_var=erased_var,
        erased_mean=np.zeros(steps + 1),
        linear_var=_periodic_affine(rho_o**2, noise, steps),
        linear_mean=_periodic_affine(rho_o, use, steps),  # valid up to X_{T-1}: the last use writes x2
        clock_push=_periodic_affine(rho_o, lr / b * others, steps),
        clock_record=_periodic_affine(rho_o, lr / b * use, steps),
        clock_var=_periodic_affine(rho_o**2, noise, steps),
        rho_last=float(rho2[j_star]),
    )


def _radius(mom: _Moments, steps: int) -> float:
    """The smallest R2 with ``2 Phi_c((R2 - |E X2_t|)/sd X2_t) <= ESCAPE_BUDGET/(2T)`` at every state
    t < T where a gradient is evaluated (``mom.erased_mean``: |E X2_t| in the iterate's units here)."""
    k = float(stats.norm.isf(ESCAPE_BUDGET / (4.0 * steps)))
    sd = np.sqrt(mom.erased_var[:steps])
    return float(np.max(np.abs(mom.erased_mean[:steps]) + k * sd)) * (1.0 + 1e-9)


def _switch_escape(mom: _Moments, shift: float, clock: Clock) -> float:
    """P(the record is not in region A at an earlier use, or not in B at the last), under either ideal law."""
    u = mom.uses
    mean1 = shift * mom.linear_mean[u]
    m3 = clock.push * mom.clock_push[u] + clock.scale * clock.slope / 2.0 * mom.clock_record[u]
    mean_v = mean1 + clock.slope * (m3 - clock.theta)
    sd_v = np.sqrt(mom.linear_var[u] + mom.erased_var[u] + clock.slope**2 * mom.clock_var[u])
    with np.errstate(divide="ignore", invalid="ignore"):  # a deterministic state (sd 0) gives 0 or 1
        early = stats.norm.sf(-mean_v[:-1] / sd_v[:-1])  # P(v > 0)
        last = stats.norm.sf((mean_v[-1:] - clock.width) / sd_v[-1:])  # P(v < w)
    tails = np.concatenate((early, last))
    return float(np.sum(np.where(np.isnan(tails), 1.0, tails)))


def _ideal(
    config: TrainingConfig, lam_out: float, kappa: float, clip: float, clock: Clock | None, radius: float
) -> Ideal:
    assert config.learning_rate is not None
    lr, b, steps, sigma = config.learning_rate, config.batch_size, config.steps, _noise_std(config)
    mom = _moments(config, lam_out, kappa, clock is not None)
    sd_erased = np.sqrt(mom.erased_var[:steps])
    if clock is None:
        shift = lr * clip / b
        mean = shift * np.abs(mom.erased_mean)
        with np.errstate(divide="ignore"):  # the start is deterministic (sd 0, inside the radius)
            tails = 2.0 * stats.norm.sf((radius - mean[:steps]) / sd_erased)
        final_std = math.sqrt(mom.erased_var[steps])
        escape = min(1.0, float(np.sum(tails)) * (1.0 + 1e-9))
        return Ideal(np.ones(1), float(mean[steps]) * (1.0 - 1e-9), final_std, escape)
    shift = lr * clock.scale / b
    with np.errstate(divide="ignore"):
        escape = float(np.sum(2.0 * stats.norm.sf(radius / sd_erased))) + _switch_escape(mom, shift, clock)
    rho_o = 1.0 - lr * lam_out
    mean1 = shift * rho_o * mom.linear_mean[steps - 1]  # the last step writes nothing on x1
    var1 = rho_o**2 * mom.linear_var[steps - 1] + sigma**2
    var2 = mom.rho_last**2 * mom.erased_var[steps - 1] + sigma**2
    nu = mean1**2 / var1 + shift**2 / var2
    weights = np.array([mean1 / var1, shift / var2, 0.0]) / math.sqrt(nu)
    return Ideal(weights, math.sqrt(nu) * (1.0 - 1e-9), 1.0, min(1.0, escape * (1.0 + 1e-9)))


def _clock(config: TrainingConfig, mom: _Moments, kappa: float, radius: float, room: float) -> Clock | None:
    """The clock with the smallest slope whose switch holds but with probability ESCAPE_BUDGET/2 (None: none)."""
    assert config.learning_rate is not None
    clip, lr, b = config.clip_norm, config.learning_rate, config.batch_size
    push = math.sqrt(max(clip**2 - (kappa * radius) ** 2, 0.0)) * (1.0 - _ROUNDING)
    prev, last = mom.uses[-2], mom.uses[-1]
    for k in CLOCK_SLOPES:
        scale = clip / math.sqrt(1.0 + k * k / 4.0) * (1.0 - _ROUNDING)
        width = scale * (2.0 + k * k) / room * (1.0 + _ROUNDING)
        m3 = push * mom.clock_push + scale * k / 2.0 * mom.clock_record
        theta = (m3[prev] + m3[last]) / 2.0 - width / (2.0 * k)
        candidate = Clock(float(k), float(theta), width, scale, push)
        if _switch_escape(mom, lr * scale / b, candidate) <= ESCAPE_BUDGET / 2.0:
            return candidate
    return None


def _applies(config: TrainingConfig) -> bool:
    return (
        config.sampling is Sampling.CYCLIC
        and config.relation is Relation.REPLACE_ONE
        and config.learning_rate is not None
        and config.steps >= 1
    )


def candidates(config: TrainingConfig, a: LossAssumptions) -> tuple[list[Wall | Erased], list[str]]:
    r"""The G5/G6 instances for this pipeline (cyclic, replace-one), and why others are missing.

    G5 when a diameter is declared; G6 (without a clock, and with one when the record is used at
    least twice) when none is and the per-example strong convexity is 0. The caller checks each
    against the declarations (``violations``) before computing it."""
    if not _applies(config):
        return [], []
    assert config.learning_rate is not None
    lr, clip = config.learning_rate, config.clip_norm
    lam_out = a.strong_convexity if a.l2_outside_clip else 0.0
    lam_in = 0.0 if a.l2_outside_clip else a.strong_convexity
    if a.diameter is not None:
        wall = Wall(clip, lam_in, lam_out, a.diameter)
        return ([wall], []) if wall.gamma > 0 else ([], [])
    if lam_in > 0:
        return [], []
    if config.steps > MAX_ERASED_STEPS:
        return [], [f"G6: {TOO_LARGE} (more than {MAX_ERASED_STEPS:.0e} steps)"]
    # the per-example curvature allowed (rounded down, so that kappa + lam_out stays <= M in floating point)
    room = ((a.smoothness - lam_out) if a.smoothness is not None else 1.0 / lr) * (1.0 - _ROUNDING)
    kappa = min(room, (1.0 / lr - lam_out) * (1.0 - _ROUNDING))
    if kappa <= 0:
        return [], []
    out: list[Wall | Erased] = []
    refused: list[str] = []
    plain = _moments(config, lam_out, kappa, clock=False)
    scaled = dataclasses.replace(plain, erased_mean=plain.erased_mean * lr * clip / config.batch_size)
    radius = _radius(scaled, config.steps)
    if kappa * radius < clip:
        out.append(Erased(clip, lam_out, kappa, radius))
    else:
        refused.append("G6: the erasing curvature times the iterates' range exceeds C")
    timed = _moments(config, lam_out, kappa, clock=True)
    radius = _radius(timed, config.steps)
    if timed.uses.size >= 2 and kappa * radius < clip:
        clock = _clock(config, timed, kappa, radius, room)
        if clock is not None:
            out.append(Erased(clip, lam_out, kappa, radius, clock))
        else:
            refused.append("G6 with a clock: no clock slope keeps the switch reliable")
    return out, refused
