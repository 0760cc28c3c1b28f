r"""Every accountant side by side for one DP-SGD pipeline (``lastiter compare``).

One row per bound of the registry and per standard
accountant a user would otherwise run: Opacus' RDP, PRV and GDP accountants
(when Opacus is importable) and dp-accounting's RDP and PLD accountants (a core
dependency). Every row says whether it is valid for the declared pipeline (and
if not, why), the sampling schemes it covers, its neighbouring relation, the
assumptions it uses, epsilon at delta, the optimal Renyi order (RDP rows only)
and what it protects (the final model only, or every iterate).

Rules the table keeps:

* A registry bound that does not apply has no number (it never returns one).
* A standard accountant whose sampling model is not the pipeline's (the
  Poisson-only accountants of Opacus and dp-accounting on a shuffled or cyclic
  pipeline, for example) is still computed, the way a user would call it, but
  flagged NOT valid: this is the mistake the table exists to show.
* An unproven bound is listed with its proof status and computed only when
  asked for by name (``unproven=``); it never enters a best-valid line.
* The "best valid" line is computed per neighbouring relation, never as one
  minimum over different relations. For the registry it is ``best`` (the
  smallest epsilon over the proven bounds valid here); valid standard
  accountants that are guarantees (not Opacus' GDP approximation) join it.

The registry rows are read from the one evaluation path
(:func:`lastiter_plugins.evaluation.evaluate_all`). :func:`compare_rows` and
:func:`compare` are pure functions of the scenario; :func:`format_comparison`
renders a :class:`Comparison` as text, Markdown, JSON or CSV;
:func:`epsilon_curves` sweeps the comparison over epochs and :func:`write_plot`
draws it. The command line lives in :mod:`lastiter_plugins.cli`.

Host versions this was written against: dp-accounting 0.4.3 (also 0.6.0),
Opacus 1.6.0.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import importlib
import importlib.metadata
import io
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import dp_accounting
import numpy as np
from dp_accounting.pld import privacy_loss_mechanism as _pld_mechanism

from lastiter_plugins import api, evaluation, plot, registry
from lastiter_plugins.bounds import composition
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.conversion import rdp_to_epsilon, validate_delta, validate_orders
from lastiter_plugins.jsonout import dump_json
from lastiter_plugins.registry import Protects

_T = TypeVar("_T")

DEFAULT_DELTA = 1e-5
FORMATS = ("table", "markdown", "json", "csv")

FINAL_MODEL = Protects.FINAL_MODEL.value
EVERY_ITERATE = Protects.EVERY_ITERATE.value
DEFAULT_POINTS = 25
_NOT_DRAWN = ("opacus-gdp",)  # an approximation, not a bound: never drawn

#: The scenario ``lastiter compare`` runs when given no parameters (also
#: examples/scenarios/shuffle-once-logistic-regression.toml). L2-regularised
#: logistic regression on features of norm <= 1, weights projected onto the
#: ball of radius D/2 = 5 after every step, one fixed random permutation
#: (shuffle once). Per-example loss: log(1 + exp(-y <x, w>)) + (lam/2)|w|^2,
#: so M = 1/4 + lam, lam = 0.01, and every per-example gradient norm is at most
#: |x| + lam |w| <= 1 + lam D/2 = 1.05 = C on the whole domain: clipping is
#: never active.
BUILTIN_SCENARIO: dict[str, Any] = {
    "name": "shuffle-once logistic regression (built-in scenario)",
    "dataset_size": 10000,
    "batch_size": 100,
    "noise_multiplier": 4.0,
    "clip_norm": 1.05,
    "learning_rate": 1.0,
    "epochs": 100,
    "sampling": "shuffle_once",
    "smoothness": 0.26,
    "strong_convexity": 0.01,
    "diameter": 10.0,
    "gradient_norms_within_clip": True,
    "delta": 1e-5,
}

_SCENARIO_TEXT_KEYS = ("name", "description")
REQUIRED_KEYS = ("dataset_size", "batch_size", "noise_multiplier", "sampling")


# ---------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class Row:
    """One accountant in the comparison.

    Attributes:
      id: stable identifier (a registry bound id, or e.g. ``opacus-rdp``).
      label: human-readable name.
      kind: ``last-iterate bound``, ``composition`` or ``standard accountant``.
      valid: True when every assumption of the accountant holds for the pipeline.
      why_not: the violated conditions (empty when valid).
      covers: sampling schemes the accountant is proven for.
      relation: its neighbouring relation (for this pipeline's sampling).
      assumptions: what it assumes, in words.
      epsilon: epsilon at ``delta`` (None when there is no number: a registry
        bound that does not apply, or a host error; ``inf`` is possible).
      order: optimal Renyi order (RDP accountants only).
      protects: ``final model only`` or ``every iterate``.
      reference: theorem or host-library API.
      counted: whether it takes part in the best-valid line (valid, proven, a guarantee).
      proof: ``proven`` or ``unproven: <reason>`` (standard accountants: their own theorems).
      notes: extra remarks (order at the grid's edge, host warnings, errors).
    """

    id: str
    label: str
    kind: str
    valid: bool
    why_not: tuple[str, ...]
    covers: tuple[str, ...]
    relation: str
    assumptions: str
    epsilon: float | None
    order: float | None
    protects: str
    reference: str
    counted: bool
    proof: str = "proven"
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["why_not"] = list(self.why_not)
        out["covers"] = list(self.covers)
        out["notes"] = list(self.notes)
        return out


@dataclasses.dataclass(frozen=True)
class BestLine:
    """The smallest valid epsilon for one neighbouring relation."""

    relation: str
    declared: bool  # the relation the user asked for
    epsilon: float | None  # None: no valid accountant for this relation
    winner: str | None
    order: float | None
    protects: str | None
    how: str  # how the minimum was taken
    every_iterate_epsilon: float | None = None  # smallest valid composition-type number, same relation
    every_iterate_winner: str | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["notes"] = list(self.notes)
        return out


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The whole table: scenario, rows and the best-valid lines."""

    name: str
    params: Mapping[str, Any]
    delta: float
    steps: int
    steps_per_epoch: int
    rows: tuple[Row, ...]
    best: tuple[BestLine, ...]
    hosts: Mapping[str, str | None]

    def row(self, row_id: str) -> Row:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise KeyError(row_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.name,
            "params": dict(self.params),
            "delta": self.delta,
            "steps": self.steps,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.steps / self.steps_per_epoch,
            "rows": [r.to_dict() for r in self.rows],
            "best": [b.to_dict() for b in self.best],
            "hosts": dict(self.hosts),
            "note": _FOOTER,
        }


_FOOTER = (
    "Last-iterate epsilons protect the final model only: intermediate checkpoints must not be released. "
    "Composition and the standard accountants protect every iterate. Relations are never mixed in one minimum."
)


def _catching(fn: Callable[[], _T]) -> tuple[_T, tuple[str, ...]]:
    """Run ``fn``; turn its warnings into notes instead of printing them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, tuple(dict.fromkeys(str(w.message).strip() for w in caught))


# ---------------------------------------------------------------- registry rows


def _registry_rows(
    cfg: TrainingConfig, a: LossAssumptions, delta: float, orders: np.ndarray, unproven: Iterable[str]
) -> list[Row]:
    """One row per bound of the table, read from the evaluation path. Each bound is
    shown under the relation it is proven for with this sampling; the best-valid
    lines keep the relations apart."""
    asked = set(unproven)
    rows = []
    for spec in registry.BOUNDS.values():
        # one bound at a time, so that its warnings (e.g. an optimal order at the grid's edge) go to its row
        e, row_notes = _catching(
            functools.partial(
                evaluation.evaluate_bound,
                spec,
                cfg,
                a,
                delta,
                orders,
                compute_unproven=spec.id in asked,
                under_own_relation=True,
            )
        )
        if e.applies and not e.proof.proven and e.result is None:
            row_notes += (f"unproven: computed only when asked for by name (--unproven {e.bound}).",)
        rows.append(
            Row(
                id=e.bound,
                label=e.bound,
                kind="last-iterate bound" if e.protects is Protects.FINAL_MODEL else "composition",
                valid=e.applies,
                why_not=e.reasons,
                covers=tuple(s.value for s in e.covers),
                relation=(e.relation or cfg.relation).value,
                assumptions=e.assumptions,
                epsilon=e.epsilon,
                order=e.order,
                protects=e.protects.value,
                reference=e.reference,
                counted=e.applies and e.proof.proven and e.result is not None,
                proof=str(e.proof),
                notes=row_notes,
            )
        )
    return rows


# ---------------------------------------------------------------- standard accountants

Compute = Callable[[TrainingConfig, float, np.ndarray], tuple[float, "float | None"]]


@dataclasses.dataclass(frozen=True)
class StandardAccountant:
    """A host library's accountant, with the sampling model it is proven for."""

    id: str
    label: str
    host: str  # distribution name: "opacus" or "dp-accounting"
    covers: tuple[Sampling, ...]
    relation: Relation
    assumptions: str
    reference: str
    compute: Compute
    guarantee: bool = True  # False: an approximation that may under-estimate (never counted)
    caveat: str = ""  # why it is not a guarantee
    max_steps: int | None = None  # above this the host's discretised composition needs too much memory or time


#: Composing a sampled Gaussian step by step with a PLD/PRV discretisation needs memory
#: and time growing with the number of steps (Opacus' PRV asks for ~20 GiB at T = 1e12);
#: above this many steps those rows are shown without a number, with a note.
HOST_COMPOSITION_MAX_STEPS = 10**6

_POISSON_ASSUMES = (
    "Poisson sampling: every example joins every step independently with probability q = b/n; "
    "per-example clipping to C, noise std z*C on the sum"
)
_SWOR_ASSUMES = (
    "every step a uniformly random subset of exactly b examples, independent across steps; "
    "per-example clipping to C (the sum moves by 2C when one example is replaced: noise z/2 per unit)"
)
_EPOCH_ASSUMES = (
    "every example in at most one batch per epoch; per-example clipping to C "
    "(one Gaussian mechanism with sensitivity 2C per epoch, ceil(T/l) epochs)"
)


def _opacus_rdp(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, float]:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as opacus_rdp

    alphas = list(RDPAccountant.DEFAULT_ALPHAS)  # what Opacus prints by default
    rdp = opacus_rdp.compute_rdp(
        q=cfg.sampling_probability, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps, orders=alphas
    )
    eps, alpha = opacus_rdp.get_privacy_spent(orders=alphas, rdp=rdp, delta=delta)
    return float(eps), float(alpha)


def _opacus_prv(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, None]:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()  # a fresh instance of ours; Opacus' get_noise_multiplier fills it the same way
    accountant.history = [(cfg.noise_multiplier, cfg.sampling_probability, cfg.steps)]
    with warnings.catch_warnings():
        # PRV sizes its discretisation domain with an internal RDP bound whose
        # "optimal order is the largest alpha" warning is about that heuristic,
        # not about the PRV epsilon (which the error bracket keeps an upper bound).
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return float(accountant.get_epsilon(delta=delta)), None


def _opacus_gdp(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, None]:
    from opacus.accountants.analysis import gdp

    eps = gdp.compute_eps_poisson(
        steps=cfg.steps, noise_multiplier=cfg.noise_multiplier, sample_rate=cfg.sampling_probability, delta=delta
    )
    return float(eps), None


@functools.lru_cache(maxsize=16)
def _dpa_poisson_step(q: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    """dp-accounting's RDP of one Poisson-sampled Gaussian step (RDP composes additively)."""
    accountant = dp_accounting.rdp.RdpAccountant(list(orders), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)))
    step = np.array(accountant.rdp, dtype=float)
    step[~np.isfinite(step) | (step < 0)] = np.inf
    step.setflags(write=False)
    return step


def _dpa_rdp_poisson(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, float]:
    step = _dpa_poisson_step(cfg.sampling_probability, cfg.noise_multiplier, tuple(float(x) for x in orders))
    return rdp_to_epsilon(orders, cfg.steps * step, delta)


def _dpa_pld_poisson(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, None]:
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(
        cfg.sampling_probability, dp_accounting.GaussianDpEvent(cfg.noise_multiplier)
    )
    accountant.compose(event, cfg.steps)
    return float(accountant.get_epsilon(delta)), None


def _dpa_rdp_swor(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, float]:
    # composition.random_batch_rdp equals dp-accounting's RdpAccountant(REPLACE_ONE) on
    # SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(z/2)) x T (pinned to it to 1e-9 by
    # tests/test_known_values.py), vectorised instead of dp-accounting's per-order loop.
    rdp = composition.random_batch_rdp(
        orders,
        dataset_size=cfg.dataset_size,
        batch_size=cfg.batch_size,
        noise_multiplier=cfg.noise_multiplier,
        steps=cfg.steps,
    )
    return rdp_to_epsilon(orders, rdp, delta)


def _swor_event(cfg: TrainingConfig) -> dp_accounting.DpEvent:
    return dp_accounting.SampledWithoutReplacementDpEvent(
        cfg.dataset_size, cfg.batch_size, dp_accounting.GaussianDpEvent(cfg.noise_multiplier / 2.0)
    )


@functools.lru_cache(maxsize=1)
def _dpa_pld_swor_supported() -> bool:
    """Whether the installed dp-accounting's PLD accountant takes sampling without
    replacement (0.4.3 and 0.6.0 do not)."""
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(10, 2, dp_accounting.GaussianDpEvent(1.0))
    return bool(accountant.supports(event))


def _dpa_pld_swor(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, None]:
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(_swor_event(cfg), cfg.steps)
    return float(accountant.get_epsilon(delta)), None


def _dpa_rdp_epoch(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, float]:
    accountant = dp_accounting.rdp.RdpAccountant(list(orders), dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(cfg.noise_multiplier / 2.0), cfg.epochs_started)
    return rdp_to_epsilon(orders, np.array(accountant.rdp, dtype=float), delta)


def gaussian_epsilon(noise_multiplier: float, count: int, delta: float) -> float:
    r"""Epsilon at ``delta`` of ``count`` Gaussian mechanisms (noise/sensitivity
    ``noise_multiplier``), composed: exactly one Gaussian mechanism with noise
    ``noise_multiplier / sqrt(count)`` (Dong, Roth & Su 2019, GDP composition).

    dp-accounting's ``PLDAccountant`` composes ``GaussianDpEvent`` x count as
    exactly this mechanism and then discretises it; here the hockey-stick
    divergence of dp-accounting's ``GaussianPrivacyLoss`` is inverted directly
    (Balle & Wang 2018, exact), which is as fast at 10^4 epochs as at one.
    The bisection returns an epsilon whose delta is <= the target (rounded up).
    """
    delta = validate_delta(delta)
    loss = _pld_mechanism.GaussianPrivacyLoss(noise_multiplier / math.sqrt(count), sensitivity=1.0)

    def delta_at(eps: float) -> float:
        with warnings.catch_warnings():  # dp-accounting 0.4.3 converts a 1-element array with float()
            warnings.simplefilter("ignore", DeprecationWarning)
            return float(loss.get_delta_for_epsilon(eps))

    if delta_at(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_at(hi) > delta:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    lo = hi / 2.0 if hi > 1.0 else 0.0
    for _ in range(200):  # bisection keeps delta_at(hi) <= delta
        mid = 0.5 * (lo + hi)
        if delta_at(mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return hi


def _dpa_pld_epoch(cfg: TrainingConfig, delta: float, orders: np.ndarray) -> tuple[float, None]:
    return gaussian_epsilon(cfg.noise_multiplier / 2.0, cfg.epochs_started, delta), None


_POISSON = (Sampling.POISSON,)
_EPOCHS = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)

STANDARD_ACCOUNTANTS: tuple[StandardAccountant, ...] = (
    StandardAccountant(
        id="opacus-rdp",
        label="Opacus RDPAccountant",
        host="opacus",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; Opacus' default orders 1.1 .. 63",
        reference="opacus.accountants.RDPAccountant (Mironov, Talwar & Zhang 2019)",
        compute=_opacus_rdp,
    ),
    StandardAccountant(
        id="opacus-prv",
        label="Opacus PRVAccountant",
        host="opacus",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; upper end of the PRV error bracket (eps_error 0.01)",
        reference="opacus.accountants.PRVAccountant (Gopi, Lee & Wutschitz 2021)",
        compute=_opacus_prv,
        max_steps=HOST_COMPOSITION_MAX_STEPS,
    ),
    StandardAccountant(
        id="opacus-gdp",
        label="Opacus GaussianAccountant (GDP)",
        host="opacus",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; central-limit approximation",
        reference="opacus.accountants.GaussianAccountant (Bu, Dong, Long & Su 2020)",
        compute=_opacus_gdp,
        guarantee=False,
        caveat="Opacus' GDP accountant is a central-limit approximation that can under-estimate epsilon "
        "(Opacus warns so); it is not an upper bound and is never used in a best-valid line.",
    ),
    StandardAccountant(
        id="dp-accounting-rdp-poisson",
        label="dp-accounting RDP, Poisson",
        host="dp-accounting",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES,
        reference="dp_accounting.rdp.RdpAccountant, PoissonSampledDpEvent(q, GaussianDpEvent(z))",
        compute=_dpa_rdp_poisson,
    ),
    StandardAccountant(
        id="dp-accounting-pld-poisson",
        label="dp-accounting PLD, Poisson",
        host="dp-accounting",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES,
        reference="dp_accounting.pld.PLDAccountant, PoissonSampledDpEvent(q, GaussianDpEvent(z))",
        compute=_dpa_pld_poisson,
        max_steps=HOST_COMPOSITION_MAX_STEPS,
    ),
    StandardAccountant(
        id="dp-accounting-rdp-swor",
        label="dp-accounting RDP, sampled without replacement",
        host="dp-accounting",
        covers=(Sampling.RANDOM_BATCH,),
        relation=Relation.REPLACE_ONE,
        assumptions=_SWOR_ASSUMES,
        reference="dp_accounting.rdp.RdpAccountant(REPLACE_ONE), SampledWithoutReplacementDpEvent(n, b, "
        "GaussianDpEvent(z/2)) (Wang, Balle & Kasiviswanathan 2019)",
        compute=_dpa_rdp_swor,
    ),
    StandardAccountant(
        id="dp-accounting-pld-swor",
        label="dp-accounting PLD, sampled without replacement",
        host="dp-accounting",
        covers=(Sampling.RANDOM_BATCH,),
        relation=Relation.REPLACE_ONE,
        assumptions=_SWOR_ASSUMES,
        reference="dp_accounting.pld.PLDAccountant(REPLACE_ONE), SampledWithoutReplacementDpEvent",
        compute=_dpa_pld_swor,
        max_steps=HOST_COMPOSITION_MAX_STEPS,
    ),
    StandardAccountant(
        id="dp-accounting-rdp-epoch",
        label="dp-accounting RDP, once per epoch",
        host="dp-accounting",
        covers=_EPOCHS,
        relation=Relation.REPLACE_ONE,
        assumptions=_EPOCH_ASSUMES,
        reference="dp_accounting.rdp.RdpAccountant(REPLACE_ONE), GaussianDpEvent(z/2) x ceil(T/l)",
        compute=_dpa_rdp_epoch,
    ),
    StandardAccountant(
        id="dp-accounting-pld-epoch",
        label="dp-accounting PLD, once per epoch",
        host="dp-accounting",
        covers=_EPOCHS,
        relation=Relation.REPLACE_ONE,
        assumptions=_EPOCH_ASSUMES,
        reference="dp_accounting.pld GaussianPrivacyLoss(z/(2 sqrt(ceil(T/l)))), exact hockey-stick divergence "
        "(what PLDAccountant composes for GaussianDpEvent(z/2) x ceil(T/l), before discretisation)",
        compute=_dpa_pld_epoch,
    ),
)


@functools.lru_cache(maxsize=8)
def _host_available(host: str) -> bool:
    if host == "dp-accounting":
        return True
    try:
        importlib.import_module("opacus.accountants")
    except (ImportError, OSError):  # not installed, or torch fails to load
        return False
    return True


def host_versions() -> dict[str, str | None]:
    """Installed versions of the host libraries (None: not importable)."""
    out: dict[str, str | None] = {}
    for host in ("dp-accounting", "opacus"):
        try:
            out[host] = importlib.metadata.version(host) if _host_available(host) else None
        except importlib.metadata.PackageNotFoundError:
            out[host] = None
    return out


def _standard_row(acc: StandardAccountant, cfg: TrainingConfig, delta: float, orders: np.ndarray) -> Row | None:
    if not _host_available(acc.host):
        return None
    why_not: list[str] = []
    if cfg.sampling not in acc.covers:
        covered = acc.covers[0].value if len(acc.covers) == 1 else "one of " + ", ".join(s.value for s in acc.covers)
        why_not.append(
            f"sampling must be {covered} for {acc.label}. Found {cfg.sampling.value}: "
            "its number assumes a sampling your pipeline does not do."
        )
    if not acc.guarantee:
        why_not.append(acc.caveat)
    eps = order = None
    notes: tuple[str, ...] = ()
    if acc.id == "dp-accounting-pld-swor" and not _dpa_pld_swor_supported():
        if cfg.sampling is not Sampling.RANDOM_BATCH:
            return None  # only worth a row where it would be the right accountant
        version = importlib.metadata.version("dp-accounting")
        why_not.append(f"dp-accounting {version}'s PLDAccountant does not support SampledWithoutReplacementDpEvent.")
    elif acc.max_steps is not None and cfg.steps > acc.max_steps:
        notes = (
            f"not computed: {acc.label} composes {cfg.steps} steps one discretised distribution at a time, "
            f"beyond the {acc.max_steps} steps this comparison runs it for (memory and time).",
        )
    else:
        try:
            (eps, order), notes = _catching(functools.partial(acc.compute, cfg, delta, orders))
        except Exception as exc:  # a host library's failure is reported in the row, not hidden
            notes = (f"{acc.label} failed: {type(exc).__name__}: {exc}",)
    valid = not why_not
    return Row(
        id=acc.id,
        label=acc.label,
        kind="standard accountant",
        valid=valid,
        why_not=tuple(why_not),
        covers=tuple(s.value for s in acc.covers),
        relation=acc.relation.value,
        assumptions=acc.assumptions,
        epsilon=eps,
        order=order,
        protects=EVERY_ITERATE,
        reference=acc.reference,
        counted=valid and eps is not None,
        proof="proven" if acc.guarantee else "not a bound: an approximation",
        notes=notes,
    )


# ---------------------------------------------------------------- the table


def compare_rows(
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    unproven: Iterable[str] = (),
) -> tuple[Row, ...]:
    """Every registry bound and every installed standard accountant, in a fixed order.

    Registry bounds come first, then standard accountants; within each group
    valid rows are sorted by epsilon, the others keep the table's order.
    ``unproven`` names unproven bounds whose numbers are asked for (shown, never counted).
    """
    delta = validate_delta(delta)
    orders = validate_orders(orders)
    bounds = _registry_rows(config, assumptions, delta, orders, unproven)
    standard = [row for acc in STANDARD_ACCOUNTANTS if (row := _standard_row(acc, config, delta, orders))]
    return (*_sorted(bounds), *_sorted(standard))


def _sorted(rows: list[Row]) -> list[Row]:
    def key(item: tuple[int, Row]):
        index, row = item
        if row.valid and row.epsilon is not None:
            return (0, row.epsilon, index)
        return (1, 0.0, index)

    return [row for _, row in sorted(enumerate(rows), key=key)]


def best_lines(config: TrainingConfig, rows: Sequence[Row]) -> tuple[BestLine, ...]:
    """The smallest valid epsilon per neighbouring relation (declared relation first).

    The candidates are the counted rows of that relation: the proven registry
    bounds that apply (their minimum is ``best``) and the valid standard
    accountants that are guarantees. Each line also names the smallest valid
    every-iterate number of the same relation (composition or a standard
    accountant), the number the last-iterate bounds are to be compared with. A
    relation with no valid row is listed only when it is the declared one.
    """
    relations = [config.relation, *(r for r in Relation if r is not config.relation)]
    out = []
    for relation in relations:
        counted = [r for r in rows if r.counted and r.relation == relation.value and r.epsilon is not None]
        if not counted:
            if relation is config.relation:
                out.append(BestLine(relation.value, True, None, None, None, None, "no valid accountant"))
            continue
        winner = min(counted, key=lambda r: r.epsilon)
        every = [(r.epsilon, r.id) for r in counted if r.protects == EVERY_ITERATE]
        every_eps, every_id = min(every) if every else (None, None)
        out.append(
            BestLine(
                relation=relation.value,
                declared=relation is config.relation,
                epsilon=winner.epsilon,
                winner=winner.id,
                order=winner.order,
                protects=winner.protects,
                how="smallest epsilon of " + ", ".join(r.id for r in counted),
                every_iterate_epsilon=every_eps,
                every_iterate_winner=every_id,
            )
        )
    return tuple(out)


def split_scenario(params: Mapping[str, Any]) -> tuple[str, dict[str, Any], float]:
    """(name, keyword-API params, delta) from a scenario mapping (a TOML file's content).

    Raises:
      ValueError: an unknown key or a wrongly typed name/description/delta.
    """
    params = dict(params)
    name = params.pop("name", "custom scenario")
    description = params.pop("description", "")
    for key, value in (("name", name), ("description", description)):
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string. Found {value!r}.")
    delta = validate_delta(params.pop("delta", DEFAULT_DELTA))
    unknown = sorted(set(params) - set(api.PARAMETERS))
    if unknown:
        known = ", ".join((*api.PARAMETERS, "delta", *_SCENARIO_TEXT_KEYS))
        raise ValueError(f"unknown scenario key {unknown[0]!r}; known keys: {known}.")
    return name, params, delta


def compare(
    delta: float = DEFAULT_DELTA,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    name: str = "custom scenario",
    unproven: Iterable[str] = (),
    **params: Any,
) -> Comparison:
    """The side-by-side comparison for the keyword-API ``params`` (see :func:`api.build`).

    Pure: the same scenario gives the same :class:`Comparison`. ``unproven`` names
    unproven bounds whose numbers are shown (marked, never counted).
    """
    config, assumptions = api.build(**params)
    delta = validate_delta(delta)
    rows = compare_rows(config, assumptions, delta, orders, unproven=unproven)
    best = best_lines(config, rows)
    return Comparison(
        name=name,
        params=dict(params),
        delta=delta,
        steps=config.steps,
        steps_per_epoch=config.steps_per_epoch,
        rows=rows,
        best=best,
        hosts=host_versions(),
    )


# ---------------------------------------------------------------- rendering


def _num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}"


def _valid_cell(row: Row) -> str:
    if row.valid:
        return "yes"
    return "NOT VALID" if row.epsilon is not None else "no"


def _scenario_line(c: Comparison) -> str:
    p = c.params
    parts = [f"{k}={p[k]}" for k in api.PARAMETERS if k in p]
    return ", ".join(parts) + f"; {c.steps} steps ({c.steps / c.steps_per_epoch:g} epochs of {c.steps_per_epoch})"


def _best_text(b: BestLine) -> str:
    declared = " (declared relation)" if b.declared else ""
    if b.epsilon is None:
        return f"{b.relation}{declared}: no valid accountant for this pipeline"
    order = f", order {b.order:g}" if b.order is not None else ""
    text = f"{b.relation}{declared}: epsilon = {_num(b.epsilon)} via {b.winner}{order}, protects {b.protects}"
    if b.protects == FINAL_MODEL and b.every_iterate_epsilon is not None:
        ratio = b.every_iterate_epsilon / b.epsilon if b.epsilon > 0 else math.inf
        text += (
            f"; {ratio:.3g}x below the best valid every-iterate accountant "
            f"({b.every_iterate_winner}: {_num(b.every_iterate_epsilon)})"
        )
    if b.notes:
        text += " [" + "; ".join(b.notes) + "]"
    return text


def _hosts_line(c: Comparison) -> str:
    parts = []
    for host, version in c.hosts.items():
        if version is None:
            fix = f"pip install 'lastiter-plugins[{host}]'"
            parts.append(f"{host} not installed (its accountants are not shown: {fix})")
        else:
            parts.append(f"{host} {version}")
    return "Host libraries: " + ", ".join(parts) + "."


def _notes(row: Row) -> list[str]:
    out = [] if row.proof == "proven" else [row.proof]
    if row.why_not:
        out.append(("NOT valid here: " if row.epsilon is not None else "does not apply: ") + " ".join(row.why_not))
    else:
        out.append("assumes: " + row.assumptions)
    out.extend(row.notes)
    return out


_COLUMNS = ("accountant", "valid here", "relation", "epsilon", "order", "protects", "proof", "sampling covered")


def _cells(row: Row, note: str = "") -> tuple[str, ...]:
    return (
        row.id + note,
        _valid_cell(row),
        row.relation,
        _num(row.epsilon),
        _num(row.order, 4) if row.order is not None else "-",
        row.protects,
        "proven" if row.proof == "proven" else "UNPROVEN",
        ", ".join(row.covers),
    )


def format_table(c: Comparison) -> str:
    """Plain-text table with numbered notes (why not / assumptions)."""
    body = [_cells(r, f" [{i}]") for i, r in enumerate(c.rows, start=1)]
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(_COLUMNS)]
    right = {3, 4}

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in pairs]
        return "  ".join(parts).rstrip()

    out = [f"lastiter compare: {c.name}", _scenario_line(c), f"epsilon at delta = {c.delta:g}", ""]
    out.append(line(_COLUMNS))
    out.append(line(["-" * w for w in widths]))
    notes: list[str] = []
    previous_kind = None
    for row, cells in zip(c.rows, body, strict=True):
        group = row.kind == "standard accountant"
        if previous_kind is not None and group != previous_kind:
            out.append("")
        previous_kind = group
        notes.append(f"[{len(notes) + 1}] {row.id}: " + " | ".join(_notes(row)))
        out.append(line(cells))
    out += ["", "Best valid for this pipeline, per neighbouring relation:"]
    out += [f"  {_best_text(b)}" for b in c.best]
    out += ["", "Notes:", *notes, "", _hosts_line(c), _FOOTER]
    return "\n".join(out)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(c: Comparison) -> str:
    """GitHub-flavoured Markdown: the table, then the best-valid lines."""
    head = (*_COLUMNS, "why not / assumptions")
    out = [
        f"**{_md_escape(c.name)}**: {_md_escape(_scenario_line(c))}; epsilon at delta = {c.delta:g}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"] * 4) + "|",
    ]
    for row in c.rows:
        cells = list(_cells(row))
        cells[0] = f"`{row.id}`"
        if not row.valid:
            cells[1] = f"**{cells[1]}**"
        cells.append("<br>".join(_md_escape(n) for n in _notes(row)))
        out.append("| " + " | ".join(_md_escape(x) if i < len(head) - 1 else x for i, x in enumerate(cells)) + " |")
    out += ["", "Best valid for this pipeline, per neighbouring relation:", ""]
    out += [f"- {_md_escape(_best_text(b))}" for b in c.best]
    out += ["", _md_escape(_hosts_line(c)), "", f"_{_FOOTER}_"]
    return "\n".join(out)


CSV_FIELDS = (
    "id",
    "label",
    "kind",
    "valid",
    "relation",
    "epsilon",
    "delta",
    "order",
    "protects",
    "covers",
    "counted",
    "proof",
    "why_not",
    "assumptions",
    "reference",
    "notes",
)


def format_csv(c: Comparison) -> str:
    """One line per row, then one per best-valid line (kind ``best``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()

    def num(x: float | None) -> str:
        return "" if x is None else repr(float(x))  # 'inf' when infinite; empty when there is no number

    for r in c.rows:
        writer.writerow(
            {
                "id": r.id,
                "label": r.label,
                "kind": r.kind,
                "valid": str(r.valid).lower(),
                "relation": r.relation,
                "epsilon": num(r.epsilon),
                "delta": repr(c.delta),
                "order": num(r.order),
                "protects": r.protects,
                "covers": " ".join(r.covers),
                "counted": str(r.counted).lower(),
                "proof": r.proof,
                "why_not": " ".join(r.why_not),
                "assumptions": r.assumptions,
                "reference": r.reference,
                "notes": " ".join(r.notes),
            }
        )
    for b in c.best:
        writer.writerow(
            {
                "id": f"best-{b.relation}",
                "label": f"best valid ({b.relation})",
                "kind": "best",
                "valid": str(b.epsilon is not None).lower(),
                "relation": b.relation,
                "epsilon": num(b.epsilon),
                "delta": repr(c.delta),
                "order": num(b.order),
                "protects": b.protects or "",
                "covers": "",
                "counted": "",
                "proof": "proven" if b.epsilon is not None else "",
                "why_not": "" if b.epsilon is not None else b.how,
                "assumptions": "",
                "reference": b.winner or "",
                "notes": b.how,
            }
        )
    return buffer.getvalue().rstrip("\n")


def format_comparison(c: Comparison, fmt: str = "table") -> str:
    """Render as ``table``, ``markdown``, ``json`` (never NaN/Infinity) or ``csv``."""
    if fmt == "table":
        return format_table(c)
    if fmt == "markdown":
        return format_markdown(c)
    if fmt == "json":
        return dump_json(c.to_dict())
    if fmt == "csv":
        return format_csv(c)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}. Found {fmt!r}.")


# ---------------------------------------------------------------- scenario files


def load_scenario(path: str | Path) -> dict[str, Any]:
    """The content of a TOML scenario file (keys: keyword-API params, delta, name, description).

    Raises:
      ValueError: the file is missing, unreadable, not UTF-8 or not valid TOML.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ValueError("--config needs Python >= 3.11 or the tomli package (pip install tomli).") from None
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ValueError(f"config must be a readable TOML file. Found {str(path)!r}: {exc.strerror}.") from None
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config must be a UTF-8 TOML file. Found {str(path)!r}: byte {exc.object[exc.start]:#04x} at position "
            f"{exc.start} is not UTF-8."
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config must be valid TOML. Found {str(path)!r}: {exc}.") from None


# ---------------------------------------------------------------- epsilon against epochs


def sweep_epochs(total_epochs: int, points: int = DEFAULT_POINTS) -> list[int]:
    """Integer epoch counts 1 .. total_epochs, at most ``points`` of them, evenly spread."""
    if total_epochs < 1:
        raise ValueError(f"total_epochs must be an integer >= 1. Found {total_epochs!r}.")
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ValueError(f"points must be an integer >= 2. Found {points!r}.")
    return sorted({int(e) for e in np.rint(np.linspace(1, total_epochs, min(points, total_epochs)))})


def _progress(items: Sequence[int], enabled: bool | None):
    """tqdm progress bar on stderr when it is a terminal (or when forced), else the plain items."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety: no tqdm, no bar
        return items
    return tqdm(items, desc="epsilon sweep", unit="point", file=sys.stderr, leave=False)


def epsilon_curves(
    params: Mapping[str, Any],
    delta: float,
    *,
    points: int = DEFAULT_POINTS,
    orders=None,
    progress: bool | None = None,
    unproven: Iterable[str] = (),
) -> tuple[np.ndarray, list[plot.Curve]]:
    """Epsilon of every row of the comparison at epochs 1 .. the scenario's length.

    The last point is the scenario itself (its exact number of steps, a partial
    last epoch included).

    Returns:
      (epochs, curves): epochs as floats (steps / steps per epoch), one
      :class:`Curve` per accountant that gave a number at the scenario's length.
    """
    delta = validate_delta(delta)
    config, assumptions = api.build(**params)
    per_epoch = config.steps_per_epoch
    steps = [e * per_epoch for e in sweep_epochs(config.epochs_started, points) if e * per_epoch < config.steps]
    steps.append(config.steps)
    table: dict[str, list[float]] = {}
    meta: dict[str, Any] = {}
    for i, t in enumerate(_progress(steps, progress)):
        for row in compare_rows(config.replace(steps=t), assumptions, delta, orders, unproven=unproven):
            column = table.setdefault(row.id, [math.nan] * len(steps))
            column[i] = math.nan if row.epsilon is None else row.epsilon
            meta[row.id] = row  # the last point (the scenario) decides validity and labels
    curves = []
    for row_id, values in table.items():
        row = meta[row_id]
        if row_id in _NOT_DRAWN or row.epsilon is None:
            continue
        curves.append(
            plot.Curve(row_id, row.relation, row.protects, row.valid, row.kind, np.array(values, dtype=float))
        )
    return np.array(steps, dtype=float) / per_epoch, curves


def write_plot(
    params: Mapping[str, Any],
    delta: float,
    path: str | Path,
    *,
    points: int = DEFAULT_POINTS,
    title: str | None = None,
    orders=None,
    progress: bool | None = None,
    unproven: Iterable[str] = (),
) -> Path:
    """Sweep the comparison over epochs and write the PNG (see :mod:`lastiter_plugins.plot`).

    Raises:
      PlotDependencyError: matplotlib is missing (an ImportError and a ValueError).
      ValueError: invalid parameters, or the folder of ``path`` does not exist.
    """
    plot.check_can_plot(path)  # fail before the (slow) sweep
    epochs, curves = epsilon_curves(params, delta, points=points, orders=orders, progress=progress, unproven=unproven)
    config, _ = api.build(**params)
    return plot.draw_epsilon_vs_epochs(epochs, curves, path, config=config, delta=delta, title=title)
