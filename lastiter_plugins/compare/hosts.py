r"""What the host libraries report for the pipeline, as a user would call them: display only.

These rows are never counted in a best line (docs/derivations/baselines.md#host-accountants):

* Opacus' ``RDPAccountant`` (the Poisson RDP of ``composition`` on Opacus' coarser
  default orders: never below it), ``PRVAccountant`` (valid under add-or-remove, but
  Opacus is optional: ``best`` must not change with the hosts installed) and
  ``GaussianAccountant`` (a central-limit approximation, not a bound);
* on a pipeline that is not Poisson, dp-accounting's Poisson accountants as a user
  would call them with ``q = b/n``: the rows ``composition`` and
  ``composition-pld-poisson`` evaluated on the Poisson pipeline with the same ``q``
  (the same computation, never a second one). On a Poisson pipeline those rows are
  the registry's own and appear there;
* TF Privacy's ``compute_dp_sgd_privacy_statement`` (``used_microbatching=False``): its
  "each example occurring once per epoch" line (``GaussianDpEvent(z)`` composed
  ``ceil(E)`` times under add-or-remove at sensitivity C: not a proven bound for a
  fixed batch size, docs/derivations/baselines.md#host-accountants) and its Poisson line
  (``PoissonSampledDpEvent(b/n, GaussianDpEvent(z))`` composed ``ceil(E n/b)`` times),
  computed as TF Privacy computes them, with dp-accounting's ``RdpAccountant`` (TF
  Privacy is not imported: it loads TensorFlow).

A row whose sampling model is not the pipeline's is flagged NOT valid: the mistake
the table exists to show. jax_privacy's ``DpsgdTrainingAccountant`` (when jax_privacy is
installed): its Poisson number (what ``keras_api.DPKerasConfig`` calibrates with, also for a
``fit`` that shuffles) and its fixed-batch-size number (Poisson with the sensitivity doubled,
composed in an add-or-remove PLD: below the truth for adaptive runs under replace-one, so never
valid; docs/derivations/jax-privacy-adapter.md#jp-host-numbers). Host versions this was written
against: dp-accounting 0.4.3 (also 0.6), Opacus 1.5 and 1.6, tensorflow-privacy 0.9.0, jax_privacy 2.0.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import math
import warnings
from collections.abc import Callable

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from lastiter_plugins import evaluation, registry
from lastiter_plugins.bounds.sgm import sgm_rdp
from lastiter_plugins.compare.rows import EVERY_ITERATE, STANDARD, Row, catching
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig

Compute = Callable[[TrainingConfig, float, "np.ndarray | None"], tuple[float, "float | None"]]

#: Opacus' PRV composes a sampled Gaussian step by step on a discretised grid (~20 GiB at
#: T = 1e12); above this many steps its row is shown without a number, with a note.
HOST_COMPOSITION_MAX_STEPS = 10**6

_POISSON_ASSUMES = (
    "Poisson sampling: every example joins every step independently with probability q = b/n; "
    "per-example clipping to C, noise std z*C on the sum"
)


@dataclasses.dataclass(frozen=True)
class HostAccountant:
    """A host library's accountant, with the sampling model it is proven for."""

    id: str
    label: str
    host: str  # "opacus", "dp-accounting", "tf_privacy" or "jax-privacy" (DISTRIBUTIONS: its distribution name)
    covers: tuple[Sampling, ...]
    relation: Relation
    assumptions: str
    reference: str
    compute: Compute
    guarantee: bool = True  # False: an approximation that may under-estimate
    caveat: str = ""  # why it is not a guarantee
    not_a_bound: str = "not a bound: an approximation"  # the proof cell when it is not a guarantee
    max_steps: int | None = None  # above this the host's discretised composition needs too much memory or time
    same_as: str = ""  # the registry row computing the same mechanism, where there is one
    only_when_invalid: bool = False  # a registry row already shows it where it is valid


def _opacus_rdp(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, float]:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as opacus_rdp

    alphas = list(RDPAccountant.DEFAULT_ALPHAS)  # what Opacus prints by default
    rdp = opacus_rdp.compute_rdp(
        q=cfg.sampling_probability, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps, orders=alphas
    )
    eps, alpha = opacus_rdp.get_privacy_spent(orders=alphas, rdp=rdp, delta=delta)
    return float(eps), float(alpha)


def _opacus_prv(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, None]:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()  # a fresh instance of ours; Opacus' get_noise_multiplier fills it the same way
    accountant.history = [(cfg.noise_multiplier, cfg.sampling_probability, cfg.steps)]
    with warnings.catch_warnings():
        # PRV sizes its discretisation domain with an internal RDP bound whose
        # "optimal order is the largest alpha" warning is about that heuristic,
        # not about the PRV epsilon (which the error bracket keeps an upper bound).
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return float(accountant.get_epsilon(delta=delta)), None


def _opacus_gdp(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, None]:
    from opacus.accountants.analysis import gdp

    eps = gdp.compute_eps_poisson(
        steps=cfg.steps, noise_multiplier=cfg.noise_multiplier, sample_rate=cfg.sampling_probability, delta=delta
    )
    return float(eps), None


def _as_poisson(bound: str) -> Compute:
    """The registry row ``bound`` on the Poisson pipeline with the same q (add-or-remove)."""

    def compute(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, float | None]:
        poisson = cfg.replace(sampling=Sampling.POISSON, relation=Relation.ADD_OR_REMOVE_ONE)
        found = evaluation.evaluate_bound(registry.get_spec(bound), poisson, _NO_ASSUMPTIONS, delta, orders)
        if found.result is None:
            raise ValueError(" ".join(found.reasons) or f"{bound} gave no number")
        return found.result.epsilon, found.result.order

    return compute


def _tf_privacy_epochs(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, float]:
    """TF Privacy's "each example occurring once per epoch" line (tensorflow-privacy 0.9.0,
    ``compute_dp_sgd_privacy_lib._compute_dp_sgd_example_privacy`` with ``used_microbatching=False``):
    ``GaussianDpEvent(z)`` composed ``ceil(E)`` times in dp-accounting's ``RdpAccountant()`` (add-or-remove):
    RDP ``alpha / (2 z^2)`` per epoch on its default orders."""
    per_epoch = _TF_PRIVACY_ORDERS / (2.0 * cfg.noise_multiplier**2)
    return _tf_privacy_epsilon(math.ceil(_epochs(cfg)) * per_epoch, delta)


def _tf_privacy_poisson(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, float]:
    """TF Privacy's "assuming Poisson sampling" line: ``PoissonSampledDpEvent(b/n, GaussianDpEvent(z))`` composed
    ``ceil(E / (b/n))`` times in dp-accounting's ``RdpAccountant()``, as tensorflow-privacy 0.9.0 computes it; the
    sampled Gaussian's RDP on dp-accounting's default orders by :func:`~lastiter_plugins.bounds.sgm.sgm_rdp`
    (``exact_fractional``: dp-accounting's own series, cached; dp-accounting's loop takes about 0.1 s a call)."""
    q = cfg.batch_size / cfg.dataset_size
    per_step = sgm_rdp(q, cfg.noise_multiplier, _TF_PRIVACY_ORDERS, exact_fractional=True)
    return _tf_privacy_epsilon(math.ceil(_epochs(cfg) / q) * per_step, delta)


def _epochs(cfg: TrainingConfig) -> float:
    """The ``num_epochs`` a TF Privacy user passes for the run: its steps over the steps of a pass."""
    return cfg.steps / cfg.steps_per_epoch


#: The orders of TF Privacy's ``AccountantType.RDP`` accountant: ``dp_accounting.rdp.RdpAccountant()``'s default.
_TF_PRIVACY_ORDERS = np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=float)


def _tf_privacy_epsilon(rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """dp-accounting's RDP to (epsilon, delta) conversion, as ``RdpAccountant.get_epsilon`` does it."""
    with np.errstate(over="ignore"):
        eps, order = rdp_privacy_accountant.compute_epsilon(_TF_PRIVACY_ORDERS, rdp, delta)
    return float(eps), float(order)


def _jax_privacy(sampling_method: str) -> Compute:
    """jax_privacy's ``DpsgdTrainingAccountant`` as ``DPKerasConfig`` builds it (dp-accounting's add-or-remove PLD,
    value discretisation 1e-3), for ``sampling_method`` (``POISSON`` or ``FIXED_BATCH_SIZE``) with q = b/n."""

    def compute(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> tuple[float, None]:
        from jax_privacy.accounting import accountants, analysis

        accountant = analysis.DpsgdTrainingAccountant(
            dp_accountant_config=accountants.PldAccountantConfig(value_discretization_interval=1e-3)
        )
        params = analysis.DpParams(
            noise_multipliers=cfg.noise_multiplier,
            num_samples=cfg.dataset_size,
            batch_size=cfg.batch_size,
            delta=delta,
            sampling_method=analysis.SamplingMethod[sampling_method],
        )
        return float(accountant.compute_epsilon(cfg.steps, params)), None

    return compute


_NO_ASSUMPTIONS = LossAssumptions()  # the Poisson baselines assume nothing beyond clipping
_POISSON = (Sampling.POISSON,)
_EPOCHS = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
_TF_PRIVACY = (
    "tensorflow_privacy.compute_dp_sgd_privacy_statement(used_microbatching=False), tensorflow-privacy 0.9 "
    "(dp-accounting's RdpAccountant)"
)

HOST_ACCOUNTANTS: tuple[HostAccountant, ...] = (
    HostAccountant(
        id="opacus-rdp",
        label="Opacus RDPAccountant",
        host="opacus",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; Opacus' default orders 1.1 .. 63",
        reference="opacus.accountants.RDPAccountant (Mironov, Talwar & Zhang 2019)",
        compute=_opacus_rdp,
        same_as="composition",
    ),
    HostAccountant(
        id="opacus-prv",
        label="Opacus PRVAccountant",
        host="opacus",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; upper end of the PRV error bracket (eps_error 0.01)",
        reference="opacus.accountants.PRVAccountant (Gopi, Lee & Wutschitz 2021)",
        compute=_opacus_prv,
        max_steps=HOST_COMPOSITION_MAX_STEPS,
        same_as="composition-pld-poisson",
    ),
    HostAccountant(
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
        "(Opacus warns so); it is not an upper bound.",
    ),
    HostAccountant(
        id="dp-accounting-rdp-poisson",
        label="dp-accounting RDP, Poisson",
        host="dp-accounting",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES,
        reference="dp_accounting.rdp.RdpAccountant, PoissonSampledDpEvent(q, GaussianDpEvent(z)) (the registry's "
        "composition on the Poisson pipeline)",
        compute=_as_poisson("composition"),
        same_as="composition",
        only_when_invalid=True,
    ),
    HostAccountant(
        id="dp-accounting-pld-poisson",
        label="dp-accounting PLD, Poisson",
        host="dp-accounting",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES,
        reference="dp_accounting.pld.PLDAccountant, PoissonSampledDpEvent(q, GaussianDpEvent(z)) (the registry's "
        "composition-pld-poisson on the Poisson pipeline)",
        compute=_as_poisson("composition-pld-poisson"),
        max_steps=HOST_COMPOSITION_MAX_STEPS,
        same_as="composition-pld-poisson",
        only_when_invalid=True,
    ),
    HostAccountant(
        id="tf-privacy-epochs",
        label="TF Privacy statement, each example once per epoch",
        host="tf_privacy",
        covers=_EPOCHS,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions="each example in one batch per epoch; one Gaussian mechanism of sensitivity C per epoch "
        "(noise multiplier z), ceil(epochs) of them",
        reference=_TF_PRIVACY + ": the line 'Epsilon with each example occurring once per epoch'",
        compute=_tf_privacy_epochs,
        guarantee=False,
        caveat="an add-or-remove number at sensitivity C per epoch, not proven for a fixed batch size: an added "
        "example shifts the later batches of its pass (docs/derivations/baselines.md#host-accountants)",
        not_a_bound="not a proven bound: add-or-remove with a fixed batch size",
    ),
    HostAccountant(
        id="tf-privacy-poisson",
        label="TF Privacy statement, Poisson",
        host="tf_privacy",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; ceil(epochs * n/b) steps",
        reference=_TF_PRIVACY + ": the line 'Epsilon assuming Poisson sampling (*)'",
        compute=_tf_privacy_poisson,
        same_as="composition",
    ),
    HostAccountant(
        id="jax-privacy-poisson",
        label="jax_privacy DpsgdTrainingAccountant, Poisson",
        host="jax-privacy",
        covers=_POISSON,
        relation=Relation.ADD_OR_REMOVE_ONE,
        assumptions=_POISSON_ASSUMES + "; the PLD of DPKerasConfig (value discretisation 1e-3)",
        reference="jax_privacy.accounting.DpsgdTrainingAccountant, SamplingMethod.POISSON (what DPKerasConfig "
        "calibrates and checks its noise with)",
        compute=_jax_privacy("POISSON"),
        max_steps=HOST_COMPOSITION_MAX_STEPS,
        same_as="composition-pld-poisson",
    ),
    HostAccountant(
        id="jax-privacy-fixed-batch",
        label="jax_privacy DpsgdTrainingAccountant, fixed batch size",
        host="jax-privacy",
        covers=(Sampling.RANDOM_BATCH,),
        relation=Relation.REPLACE_ONE,
        assumptions="fixed-size random batches of b from n, replace-one: Poisson at q = b/n with noise multiplier "
        "z/2, composed in an add-or-remove PLD",
        reference="jax_privacy.accounting.DpsgdTrainingAccountant, SamplingMethod.FIXED_BATCH_SIZE",
        compute=_jax_privacy("FIXED_BATCH_SIZE"),
        guarantee=False,
        caveat="jax_privacy composes the two directions of the Poisson pair separately; for an adaptive run under "
        "replace-one that is below the truth (n = 4, b = 2, z = 1, T = 2: "
        "docs/derivations/baselines.md#random-batch-pair)",
        max_steps=HOST_COMPOSITION_MAX_STEPS,
    ),
)

#: The distribution of each host, and the extra of this package that installs it.
DISTRIBUTIONS = {
    "dp-accounting": "dp-accounting",
    "opacus": "opacus",
    "tf_privacy": "tensorflow-privacy",
    "jax-privacy": "jax-privacy",
}
EXTRAS = {"dp-accounting": "", "opacus": "opacus", "tensorflow-privacy": "tf", "jax-privacy": "jax"}


#: The module each optional host's accountants are imported from.
_HOST_MODULES = {"opacus": "opacus.accountants", "jax-privacy": "jax_privacy.accounting"}


@functools.lru_cache(maxsize=8)
def _host_available(host: str) -> bool:
    if host == "dp-accounting":
        return True
    if host == "tf_privacy":  # installed is enough: its numbers are computed without importing TensorFlow
        return importlib.util.find_spec("tensorflow_privacy") is not None
    try:
        importlib.import_module(_HOST_MODULES[host])
    except (ImportError, OSError):  # not installed, or torch (jax) fails to load
        return False
    return True


def host_versions() -> dict[str, str | None]:
    """Installed versions of the host libraries, by distribution name (None: not importable)."""
    out: dict[str, str | None] = {}
    for host, distribution in DISTRIBUTIONS.items():
        try:
            out[distribution] = importlib.metadata.version(distribution) if _host_available(host) else None
        except importlib.metadata.PackageNotFoundError:
            out[distribution] = None
    return out


def host_row(acc: HostAccountant, cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> Row | None:
    """The display-only row of ``acc`` for the pipeline, or None (host missing, or the registry shows it)."""
    if not _host_available(acc.host):
        return None
    covered = cfg.sampling in acc.covers
    if acc.only_when_invalid and covered:
        return None
    why_not: list[str] = []
    first_unmet = ""
    if not covered:
        name = acc.covers[0].value if len(acc.covers) == 1 else "one of " + ", ".join(s.value for s in acc.covers)
        why_not.append(
            f"sampling must be {name} for {acc.label}. Found {cfg.sampling.value}: "
            "its number assumes a sampling your pipeline does not do."
        )
        first_unmet = f"it assumes {name} sampling; this pipeline uses {cfg.sampling.value}"
    if not acc.guarantee:
        why_not.append(acc.caveat)
        first_unmet = first_unmet or acc.caveat
    eps: float | None = None
    order: float | None = None
    notes: tuple[str, ...] = ()
    if acc.max_steps is not None and cfg.steps > acc.max_steps:
        notes = (
            f"not computed: {acc.label} composes {cfg.steps} steps on a discretised grid, beyond the "
            f"{acc.max_steps} steps this comparison runs it for (memory and time).",
        )
    else:
        try:
            (eps, order), notes = catching(functools.partial(acc.compute, cfg, delta, orders))
        except Exception as exc:  # a host library's failure is reported in the row, not hidden
            notes = (f"{acc.label} failed: {type(exc).__name__}: {exc}",)
    if not why_not:
        same = f" ({acc.same_as} is the registry's row for the same mechanism)" if acc.same_as else ""
        notes = (f"display only: host accountants are never counted in a best line{same}.", *notes)
    return Row(
        id=acc.id,
        label=acc.label,
        kind=STANDARD,
        valid=not why_not,
        why_not=tuple(why_not),
        covers=tuple(s.value for s in acc.covers),
        relation=acc.relation.value,
        assumptions=acc.assumptions,
        epsilon=eps,
        order=order,
        protects=EVERY_ITERATE,
        reference=acc.reference,
        counted=False,
        proof="proven" if acc.guarantee else acc.not_a_bound,
        provenance=f"{registry.PUBLISHED}: {acc.reference}" if acc.guarantee else f"{registry.UNPROVEN}: {acc.caveat}",
        notes=notes,
        first_unmet=first_unmet,
    )


def host_rows(cfg: TrainingConfig, delta: float, orders: np.ndarray | None) -> list[Row]:
    """The display-only rows of every installed host accountant."""
    return [row for acc in HOST_ACCOUNTANTS if (row := host_row(acc, cfg, delta, orders)) is not None]
