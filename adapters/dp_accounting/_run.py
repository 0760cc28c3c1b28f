r"""One last-iterate run on its own: its lossless (epsilon, delta) and its mu-GDP guarantee.

Pure functions of ``(bound, TrainingConfig, LossAssumptions)`` used by the
dp-accounting adapter:

* :func:`epsilon` and :func:`delta` answer for a ledger that holds exactly one
  last-iterate run and nothing else. :func:`epsilon` is the core's
  ``compute_epsilon`` (lossless: a privacy profile converted exactly, a curve
  linear in the order at its continuous optimum, any other curve refined between
  the orders). :func:`delta` is its counterpart at a given epsilon: the smallest
  delta over the same candidates, each converted the same way (the exact profile;
  the continuous optimum of the line; an order search that evaluates the bound at
  new orders), every number being dp-accounting's ``compute_delta`` at an order
  where the bound was evaluated, or a profile's exact delta.
* :func:`gaussian_mu` is the mu of a run certified mu-GDP (a GDP bound whose
  profile has one component), for composing it as a Gaussian mechanism in
  dp-accounting's PLD accountant.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import optimize

from lastiter_plugins import registry
from lastiter_plugins.api import compute_epsilon
from lastiter_plugins.config import LossAssumptions, TrainingConfig
from lastiter_plugins.conversion import MIN_CONVERSION_ORDER, validate_orders
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.evaluation import EpsilonResult
from lastiter_plugins.registry import BEST, BoundSpec, Kind

# ---------------------------------------------------------------- which bounds


def candidates(bound: str, config: TrainingConfig, assumptions: LossAssumptions) -> tuple[BoundSpec, ...]:
    """The bounds ``bound`` stands for on this run.

    ``best``: every proven bound that applies to the run with its relation (the
    candidates of ``best``). A bound id: that bound, which must apply.

    Raises:
      NotApplicableError: the named bound does not apply, or (``best``) none does.
    """
    if bound != BEST:
        spec = registry.get_spec(bound)
        registry.require(spec, config, assumptions)
        return (spec,)
    found = tuple(
        spec
        for spec in registry.BOUNDS.values()
        if spec.proof.proven and registry.applicability(spec, config, assumptions).applies
    )
    if not found:
        raise NotApplicableError(
            f"no proven bound applies to sampling={config.sampling.value} with relation={config.relation.value} "
            f"(see {registry.DOCS})."
        )
    return found


# ---------------------------------------------------------------- epsilon and delta


def epsilon(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, delta: float, orders: np.ndarray | None
) -> EpsilonResult:
    """The core's lossless (epsilon, delta) for the run (``orders`` None: the default grid)."""
    return compute_epsilon(bound, config, assumptions, delta, orders)


def delta(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, eps: float, orders: np.ndarray | None
) -> tuple[float, float | None]:
    """(delta, order) at ``eps`` >= 0 for the run: the smallest over the candidates of ``bound``.

    Each candidate is converted as the core converts it for epsilon: a GDP or PLD
    profile exactly (order None); an RDP curve linear in the order at the
    continuous optimum over all orders when ``orders`` is None; any other curve
    on the grid, refined by evaluating the bound at new orders. Every delta is
    valid for (eps, delta); the minimum of valid deltas is valid.
    """
    default = orders is None
    grid = validate_orders(orders)
    best: tuple[float, float | None] = (1.0, None)
    for spec in candidates(bound, config, assumptions):
        found = _spec_delta(spec, config, assumptions, float(eps), grid, default)
        if found[0] < best[0]:
            best = found
    return best


def _spec_delta(
    spec: BoundSpec, config: TrainingConfig, assumptions: LossAssumptions, eps: float, orders: np.ndarray, default: bool
) -> tuple[float, float | None]:
    if spec.profile is not None:  # a GDP or PLD bound: its privacy profile, exactly
        return min(float(spec.profile(config, assumptions).delta(eps)), 1.0), None
    curve = registry.rdp_curve(spec, config, assumptions, orders)
    if spec.linear_in_order and default:
        # the same line the core converts for epsilon: rho * alpha >= the curve on the grid
        return linear_rdp_delta(float(np.max(curve / orders)), eps)
    return refine_delta(lambda new: registry.rdp_curve(spec, config, assumptions, new), orders, curve, eps)


def _host_delta(orders: np.ndarray, rdp: np.ndarray, eps: float) -> tuple[float, float]:
    """dp-accounting's ``compute_delta`` over the finite values ((1, first order) when none)."""
    finite = np.isfinite(rdp)
    if not finite.any():
        return 1.0, float(orders[0])
    found, order = _dp_rdp.compute_delta(orders[finite], rdp[finite], eps)
    return float(found), float(order)


def _log_delta_each(orders: np.ndarray, rdp: np.ndarray, eps: float) -> np.ndarray:
    """dp-accounting's per-order log delta, vectorised (to rank candidate orders only)."""
    out = np.zeros(orders.shape)  # non-finite RDP: delta 1
    finite = np.isfinite(rdp)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.where(finite, rdp, 0.0)
        kl = np.where(r > 0, 0.5 * np.log1p(-np.exp(-r)), -np.inf)
        improved = (orders - 1.0) * (r - eps + np.log1p(-1.0 / orders)) - np.log(orders)
        value = np.where(orders > 1.01, np.minimum(kl, improved), kl)
    out[finite] = value[finite]
    return np.where(np.isnan(out), 0.0, out)


def linear_rdp_delta(rho: float, eps: float) -> tuple[float, float]:
    r"""(delta, order) at ``eps`` for the RDP curve :math:`\rho\alpha`, at the continuous optimum.

    dp-accounting's improved conversion (Canonne, Kamath & Steinke 2020, arXiv
    2004.00010, Prop. 12) at order :math:`\alpha` gives
    :math:`\log\delta = (\alpha-1)(\rho\alpha - \varepsilon + \log(1 - 1/\alpha)) - \log\alpha`,
    whose derivative :math:`\rho(2\alpha-1) - \varepsilon + \log((\alpha-1)/\alpha)` is
    increasing (second derivative :math:`2\rho + 1/(\alpha(\alpha-1)) > 0`): one
    minimiser, found by Brent's method. The number is dp-accounting's
    ``compute_delta`` at that order (clipped to its domain, > 1.01) and at the
    smallest order (its KL bound), with the line's values: valid whatever the
    precision of the root.
    """
    if rho == 0.0 or math.isinf(eps):
        return 0.0, MIN_CONVERSION_ORDER
    if not math.isfinite(rho):
        return 1.0, MIN_CONVERSION_ORDER

    def slope(a: float) -> float:
        return rho * (2.0 * a - 1.0) - eps + math.log1p(-1.0 / a)

    lo = MIN_CONVERSION_ORDER
    order = lo
    if slope(lo) < 0.0:
        hi = max(2.0, (eps + math.log(2.0)) / (2.0 * rho) + 1.0)  # slope(hi) > 0
        order = max(optimize.brentq(slope, lo, hi, xtol=1e-12, rtol=4.0 * np.finfo(float).eps, maxiter=500), lo)
    orders = np.array([order, lo])
    return _host_delta(orders, rho * orders, eps)


def refine_delta(
    rdp_at, orders: np.ndarray, rdp: np.ndarray, eps: float, *, points: int = 12, rounds: int = 4
) -> tuple[float, float]:
    """(delta, order) at ``eps``: the grid conversion, refined by evaluating the bound at new orders.

    The counterpart of ``lastiter_plugins.conversion.refine_epsilon`` for delta:
    each round evaluates ``rdp_at`` at ``points`` orders evenly spaced between
    the evaluated neighbours of the best order so far and at the integers next
    to it (the first round around each of the three best local minima). The
    search stays within the grid's range. The number is dp-accounting's
    ``compute_delta`` over every evaluated order (never above the grid's).
    """
    order_arr = np.asarray(orders, dtype=float)
    sort = np.argsort(order_arr, kind="stable")
    seen_orders, seen_rdp = order_arr[sort], np.asarray(rdp, dtype=float)[sort]
    low, high = float(seen_orders[0]), float(seen_orders[-1])
    seen_log = _log_delta_each(seen_orders, seen_rdp, eps)
    for step in range(rounds):
        if not np.isfinite(seen_log.min()) or seen_log.min() >= 0.0:
            break  # delta 0 already, or no order gives anything below 1
        centres = _local_minima(seen_log) if step == 0 else [int(np.argmin(seen_log))]
        new = np.setdiff1d(np.concatenate([_around(c, seen_orders, low, high, points) for c in centres]), seen_orders)
        if new.size == 0:
            break
        values = np.asarray(rdp_at(new.copy()), dtype=float).reshape(-1)
        if values.shape != new.shape or (values < 0).any():
            raise RuntimeError(f"internal error: invalid RDP values at new orders: {values}")
        seen_orders = np.concatenate([seen_orders, new])
        seen_rdp = np.concatenate([seen_rdp, values])
        seen_log = np.concatenate([seen_log, _log_delta_each(new, values, eps)])
        sort = np.argsort(seen_orders, kind="stable")
        seen_orders, seen_rdp, seen_log = seen_orders[sort], seen_rdp[sort], seen_log[sort]
    polished = _polish(rdp_at, seen_orders, seen_log, eps, low, high)
    if polished is not None:
        seen_orders = np.append(seen_orders, polished[0])
        seen_rdp = np.append(seen_rdp, polished[1])
    return _host_delta(seen_orders, seen_rdp, eps)


def _polish(rdp_at, orders: np.ndarray, log_delta: np.ndarray, eps: float, low: float, high: float):
    """(order, RDP) at the minimiser of log delta between the evaluated neighbours of the best order,
    by bounded Brent to near machine precision, or None.

    Why: the set of orders at which (eps, delta) holds is the set at which epsilon at delta is
    <= eps, an interval around the continuous optimum. The core's epsilon search stops inside
    it at some precision; finding the minimiser of delta more precisely lands inside it too,
    so delta at the epsilon reported for delta is <= delta (up to rounding)."""
    best = int(np.argmin(log_delta))
    if not (np.isfinite(log_delta[best]) and log_delta[best] < 0.0):
        return None
    lo = max(float(orders[max(best - 1, 0)]), low, MIN_CONVERSION_ORDER)
    hi = min(float(orders[min(best + 1, orders.size - 1)]), high)
    if not lo < hi:
        return None

    def objective(a: float) -> float:
        value = float(np.asarray(rdp_at(np.array([a])), dtype=float).reshape(-1)[0])
        return float(_log_delta_each(np.array([a]), np.array([value]), eps)[0])

    found = optimize.minimize_scalar(
        objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13 * hi, "maxiter": 200}
    )
    order = float(found.x)
    value = float(np.asarray(rdp_at(np.array([order])), dtype=float).reshape(-1)[0])
    if not value >= 0.0:
        raise RuntimeError(f"internal error: invalid RDP value {value} at order {order}")
    return order, value


def _local_minima(values: np.ndarray, at_most: int = 3) -> list[int]:
    left = np.concatenate(([math.inf], values[:-1]))
    right = np.concatenate((values[1:], [math.inf]))
    found = np.flatnonzero((values < left) & (values <= right))
    if found.size == 0:
        found = np.array([int(np.argmin(values))])
    return [int(i) for i in found[np.argsort(values[found], kind="stable")][:at_most]]


def _around(centre: int, orders: np.ndarray, low: float, high: float, points: int) -> np.ndarray:
    mid = float(orders[centre])
    lo = max(float(orders[max(centre - 1, 0)]), low, MIN_CONVERSION_ORDER)
    hi = min(float(orders[min(centre + 1, orders.size - 1)]), high)
    if not lo < hi:
        return np.empty(0)
    new = [*np.linspace(lo, mid, points // 2 + 2)[1:-1], *np.linspace(mid, hi, points - points // 2 + 2)[1:-1]]
    new += [math.floor(mid), math.ceil(mid)] if mid != math.floor(mid) else [mid - 1.0, mid + 1.0]
    arr = np.array(new, dtype=float)
    return arr[(arr > lo) & (arr < hi)]


# ---------------------------------------------------------------- mu-GDP


def gaussian_mu(bound: str, config: TrainingConfig, assumptions: LossAssumptions) -> tuple[float, str]:
    r"""(mu, bound id): the run is mu-GDP for ``config.relation`` by that bound.

    A GDP bound whose privacy profile has a single component certifies that the
    run's output pair is a post-processing of :math:`(\mathcal N(0,1), \mathcal N(\mu,1))`
    (Dong, Roth & Su 2019, arXiv 1905.02383): it is dominated by a Gaussian
    mechanism of sensitivity 1 and noise :math:`1/\mu`, and composes as one.
    ``best``: the smallest mu over the proven mu-GDP bounds that apply (a
    smaller mu is a stronger guarantee at every delta).

    Raises:
      NotApplicableError: no such bound; the message says why (a Renyi-DP
        bound, a mixture profile, or no mu-GDP bound applies).
    """
    found: list[tuple[float, str]] = []
    mixtures: list[str] = []
    for spec in candidates(bound, config, assumptions):
        if spec.kind is not Kind.GDP:
            continue
        profile = spec.profile(config, assumptions)
        if len(profile.mus) == 1:
            found.append((float(profile.mus[0]), spec.id))
        else:
            mixtures.append(spec.id)
    if found:
        return min(found)
    use = "Use LastIterateAccountant (Renyi DP) for this run"
    if mixtures and bound != BEST:
        raise NotApplicableError(
            f"{bound} certifies a mixture of Gaussian privacy profiles (one component per position of the "
            "differing example), not one Gaussian, so it cannot be composed as a Gaussian mechanism. "
            "shifted-interpolation-cyclic also covers shuffle_once (the worst position: the mixture's largest "
            f"component) and is one Gaussian. {use}, which composes the mixture's Renyi DP."
        )
    if bound != BEST:
        raise NotApplicableError(
            f"{bound} is a Renyi-DP bound, not a mu-GDP one: only runs certified mu-GDP compose as Gaussian "
            f"mechanisms in the PLD accountant. {use}."
        )
    raise NotApplicableError(
        "no proven mu-GDP bound (one Gaussian privacy profile) applies to this run with sampling="
        f"{config.sampling.value}, relation={config.relation.value} (the f-DP bounds are "
        f"{', '.join(gdp_bound_ids())}, each with its own conditions, see {registry.DOCS}; a mixture profile is not "
        f"one Gaussian). {use}."
    )


def gdp_bound_ids() -> tuple[str, ...]:
    """The ids of the GDP (privacy-profile) bounds of the table."""
    return tuple(spec.id for spec in registry.BOUNDS.values() if spec.kind is Kind.GDP)
