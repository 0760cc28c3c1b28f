r"""The registry's types: a row of the table (:class:`BoundSpec`) and what it is made of.

A row names the sampling schemes it covers (with the neighbouring relation it is proven for), its
preconditions (:data:`Condition`, in :mod:`lastiter_plugins.registry.conditions`), the glue computing it
(a function of the paper's module, typed by :mod:`lastiter_plugins.bounds._glue`), how it is justified
(:class:`Proof`, :class:`Provenance`), what its number protects (:class:`Protects`) and what kind of
guarantee it computes (:class:`Kind`). :class:`Unmet` and :class:`Applicability` are what a check of the
preconditions returns.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import numpy as np

from lastiter_plugins.bounds._glue import LowerEstimate, PrivacyProfile, ProfileFunction, RdpFunction
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, ValueEnum

__all__ = [
    "ALL_SCHEMES",
    "AT_MOST_B_SCHEMES",
    "DERIVED_HERE",
    "EPOCH_SCHEMES",
    "FIXED_BATCH_SCHEMES",
    "PROVEN",
    "PUBLISHED",
    "UNPROVEN",
    "Applicability",
    "BoundSpec",
    "BySampling",
    "Condition",
    "Kind",
    "LowerEstimate",
    "OutsidePublished",
    "PrivacyProfile",
    "ProfileFunction",
    "Proof",
    "Protects",
    "Provenance",
    "RdpFunction",
    "Unmet",
    "Violation",
    "provenance_short",
    "provenance_word",
]

#: What a condition returns: None when it holds, else (what is required, what was found), optionally with a
#: third text saying why (kept out of the one-line form compare prints; see Unmet.short).
Violation = tuple[str, str] | tuple[str, str, str] | None
#: A precondition of a row: a function of the pipeline returning None or what is violated.
Condition = Callable[[TrainingConfig, LossAssumptions], Violation]

ALL_SCHEMES = tuple(Sampling)
EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
FIXED_BATCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE)
# Decision (audit of arXiv 2407.05237 Prop. 2.1): with Poisson sampling the batch can be
# larger than the b it is divided by, so the step acts like eta*|B|/b and the
# Lipschitz and sensitivity constants of Kong & Ribero's proofs fail. Their
# "any sampling" bounds therefore cover every scheme with batches of at most b.
AT_MOST_B_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE, Sampling.RANDOM_BATCH)


class Protects(ValueEnum):
    """What a guarantee covers: the released final model, or every iterate."""

    FINAL_MODEL = "the final model only"
    EVERY_ITERATE = "every iterate"


class Kind(ValueEnum):
    """What a bound computes: a Renyi-DP curve, a Gaussian privacy profile (mu-GDP), or a
    privacy loss distribution composed by dp-accounting (a profile without a Renyi curve;
    its figures depend on dp-accounting's version and discretisation, docs/derivations/baselines.md#baselines)."""

    RDP = "rdp"
    GDP = "gdp"
    PLD = "pld"


@dataclasses.dataclass(frozen=True)
class Proof:
    """How a bound is justified.

    ``proven``: the theorem as stated, or our derivation written out in
    docs/decisions.md and pinned by ground-truth tests. Otherwise ``reason``
    says what is missing. Only proven bounds enter ``best``; an unproven one is
    computed only when asked for by name, and always shown as ``unproven: reason``.
    """

    proven: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.proven and not self.reason:
            raise ValueError("an unproven bound must say why (Proof.reason).")

    def __str__(self) -> str:
        return "proven" if self.proven else f"unproven: {self.reason}"


PROVEN = Proof(True)

#: A check that says why a pipeline leaves a published statement (None: it stays within it).
OutsidePublished = Callable[[TrainingConfig, LossAssumptions], "str | None"]


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a row's proof comes from (beside its proof status).

    Attributes:
      published: the published theorem the row applies within its stated assumptions (authors,
        venue or arXiv id, theorem); empty when none.
      derived: this library's derivation, extension or correction: the docs section and the
        independent checks it passed (exact instances, fuzzing, re-derivation); empty when none.
      outside_published: checks that say when a pipeline leaves the published statement (a short
        last batch, a projection the paper does not have, the linear-model route, ...): then the
        number rests on ``derived``.
    """

    published: str = ""
    derived: str = ""
    outside_published: tuple[OutsidePublished, ...] = ()

    def __post_init__(self) -> None:
        if not (self.published or self.derived):
            raise ValueError("a provenance names a published theorem or a derivation (or both).")
        if self.outside_published and not (self.published and self.derived):
            raise ValueError("a row that leaves its published statement needs both the theorem and the derivation.")

    def why_derived(self, cfg: TrainingConfig, a: LossAssumptions) -> str | None:
        """None when the number rests on the published theorem for this pipeline, else why not."""
        if not self.published:
            return "no published theorem states it"
        for check in self.outside_published:
            why = check(cfg, a)
            if why is not None:
                return why
        return None

    def describe(self, cfg: TrainingConfig, a: LossAssumptions) -> str:
        """One line: ``published: ...`` or ``derived here: ...`` for this pipeline."""
        why = self.why_derived(cfg, a)
        if why is None:
            return f"published: {self.published}"
        prefix = f"derived here ({why}): " if self.published else "derived here: "
        return prefix + self.derived


#: The provenance vocabulary, the same on every route (compare's proof column, ``lastiter bounds``,
#: ``lastiter epsilon``, the API's ``provenance`` field, the host rows): a published theorem applied within
#: its assumptions, this library's derivation (docs/derivations/, with the checks it passed), or no proof.
PUBLISHED, DERIVED_HERE, UNPROVEN = "published", "derived here", "unproven"


def provenance_word(provenance: str, proven: bool = True) -> str:
    """``published``, ``derived here`` or ``unproven``: the word a provenance line (:meth:`Provenance.describe`,
    or a host row's) starts with; ``unproven`` whenever the proof status says so."""
    if not proven or provenance.startswith(UNPROVEN):
        return UNPROVEN
    if provenance.startswith(PUBLISHED):
        return PUBLISHED
    if provenance.startswith(DERIVED_HERE):
        return DERIVED_HERE
    raise ValueError(f"a provenance starts with published, derived here or unproven. Found {provenance!r}.")


def provenance_short(provenance: str, proven: bool = True) -> str:
    """The provenance in one short phrase for a first screen: ``published (<theorem>)``, ``derived here
    (<why it left the theorem>; <its docs page>)`` or ``derived here (<its docs page>; checked)``,
    ``unproven (<why>)``. The full line stays in the ``provenance`` fields and behind ``explain``."""
    word = provenance_word(provenance, proven)
    if word == PUBLISHED:
        return f"{PUBLISHED} ({provenance.split(': ', 1)[-1]})"
    if word == UNPROVEN:
        return f"{UNPROVEN} ({provenance.split(': ', 1)[-1]})" if ": " in provenance else UNPROVEN
    docs = re.search(r"docs/[\w/.-]+(#[\w.-]+)?", provenance)
    page = docs.group(0) if docs else "docs/derivations/"
    why = re.match(r"derived here \(([^,)]*)", provenance)
    checks = "checked" if "checks:" in provenance else ""
    inside = "; ".join(filter(None, (why.group(1) if why else "", page, "" if why else checks)))
    return f"{DERIVED_HERE} ({inside})"


@dataclasses.dataclass(frozen=True)
class BySampling:
    """A row's RDP glue chosen by the sampling scheme, where the mapping to the paper's symbols differs
    between the schemes the row covers (the table is the one place that dispatches on sampling; a row
    using it names one function per covered scheme, checked when the row is built)."""

    functions: Mapping[Sampling, RdpFunction]

    def __call__(self, cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
        return self.functions[cfg.sampling](cfg, a, orders)


@dataclasses.dataclass(frozen=True)
class BoundSpec:
    """One row of the dispatch table.

    Attributes:
      id: the bound id users pass.
      title: a one-line description.
      reference: the citation users can follow (authors, year, arXiv id, theorem).
      covers: sampling scheme -> the neighbouring relation the bound is proven for.
      assumptions: what the bound assumes, in words.
      conditions: the preconditions, each a function returning None or (required, found).
      compute: the RDP curve at the given orders (nats); for a GDP bound, the RDP its
        profile implies (mu-GDP implies RDP alpha mu^2/2; mixtures by joint convexity);
        None for a PLD bound, and for a GDP bound whose profile truncates rare events (no
        Renyi curve). A :class:`BySampling` where the glue differs between the covered schemes.
      profile: for a GDP or PLD bound, its privacy profile (converted to epsilon exactly).
      proof: how the bound is justified.
      protects: what the number covers.
      kind: the kind of guarantee.
      linear_in_order: the RDP curve is exactly rho*alpha (converted at the continuous optimum).
      lower_estimate: a proven lower bound on the bound's epsilon at delta, cheap; ``best``
        computes an expensive bound only when this is not above the best so far.
      estimate_curve: a cheaper curve at or below ``compute`` at every order, which the lower
        estimate from a few orders may use instead (docs/derivations/lower-estimates.md#cheaper-curve).
      provenance: whether the proof is a published theorem or this library's derivation.
    """

    id: str
    title: str
    reference: str
    covers: Mapping[Sampling, Relation]
    assumptions: str
    conditions: tuple[Condition, ...]
    compute: RdpFunction | None
    profile: ProfileFunction | None = None
    proof: Proof = PROVEN
    protects: Protects = Protects.FINAL_MODEL
    kind: Kind = Kind.RDP
    linear_in_order: bool = False
    lower_estimate: LowerEstimate | None = None
    estimate_curve: RdpFunction | None = None
    provenance: Provenance | None = None  # every row of the table has one (checked when the table is built)

    def __post_init__(self) -> None:
        if (self.kind is Kind.RDP) != (self.profile is None):
            raise ValueError(f"{self.id}: a GDP or PLD bound, and only those, has a privacy profile.")
        if (self.kind is Kind.PLD and self.compute is not None) or (self.kind is Kind.RDP and self.compute is None):
            raise ValueError(f"{self.id}: a PLD bound has no Renyi curve, an RDP bound has one.")
        for glue in (self.compute, self.estimate_curve):
            if isinstance(glue, BySampling) and set(glue.functions) != set(self.covers):
                raise ValueError(f"{self.id}: its glue by sampling names other schemes than the row covers.")

    @property
    def has_renyi_curve(self) -> bool:
        """Whether the bound gives a Renyi-DP curve (a PLD row never does, nor a profile whose tails
        are truncated: mass negligible for delta can dominate a Renyi divergence)."""
        return self.compute is not None

    @property
    def relations(self) -> frozenset[Relation]:
        return frozenset(self.covers.values())

    def relation_for(self, sampling: Sampling) -> Relation | None:
        return self.covers.get(sampling)


@dataclasses.dataclass(frozen=True)
class Unmet:
    """One failed precondition: what is required, what was found, and (optionally) why it is needed."""

    required: str
    found: str
    why: str = ""

    @property
    def short(self) -> str:
        """The condition in one short line, without the theorem: ``required (found X)``."""
        return f"{self.required} (found {self.found})"

    @property
    def condition(self) -> str:
        """The condition in full (with why it is needed), without the theorem: what a listing that cites
        each reference once, at its end, prints."""
        why = f" ({self.why})" if self.why else ""
        return f"{self.required}{why} (found {self.found})"

    def message(self, where: str) -> str:
        """The full sentence of an error message, naming the bound and its theorem (``where``)."""
        why = f" ({self.why})" if self.why else ""
        return f"{self.required}{why} for {where}. Found {self.found}."


@dataclasses.dataclass(frozen=True)
class Applicability:
    """Whether a bound applies to a pipeline, and if not, every reason why.

    ``reasons`` are the full sentences (with the bound's reference); ``unmet`` the same
    conditions as data, in the same order (the first is what compare prints).
    """

    bound: str
    applies: bool
    reasons: tuple[str, ...]
    relation: Relation | None
    reference: str
    unmet: tuple[Unmet, ...] = ()

    @property
    def reason(self) -> str:
        return " ".join(self.reasons)
