"""The public entry points: ``register`` a configured accountant under a name, create and attach it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from opacus import PrivacyEngine

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._accountant import LastIterateAccountant
from lastiter_plugins.adapters.opacus._declaration import PUBLIC, Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._glm_declaration import declare
from lastiter_plugins.adapters.opacus._patches import require_tested_torch
from lastiter_plugins.config import refuse_renamed, resolve_relation
from lastiter_plugins.host import LAST_ITERATE
from lastiter_plugins.validation import validate_orders

#: the loss-assumption keywords of ``register``: the fields of ``lastiter_plugins.LossAssumptions``
LOSS_KEYWORDS = tuple(f.name for f in dataclasses.fields(lp.LossAssumptions))
#: the ones model="glm" derives, and must not be given with it
_DERIVED = ("clipped_loss_convex_smooth", "l2_outside_clip")

_REGISTRATIONS: dict[str, Registration] = {}


def register(
    name: str,
    *,
    bound: str = lp.BEST,
    sampling: str | lp.Sampling,
    dataset_size: int,
    learning_rate: float | None = None,
    relation: str | lp.Relation | None = None,
    orders: Sequence[float] | None = None,
    published_only: bool = False,
    require: str | None = None,
    metric_source: str | None = None,
    force: bool = False,
    model: str | None = None,
    loss: str | None = None,
    feature_norm: float | None = None,
    huber_delta: float | None = None,
    **assumptions: Any,
) -> str:
    r"""Register a pre-configured accountant under ``name``.

    Opacus instantiates registered accountants with no arguments, so the configuration is bound to the name.
    Afterwards ``PrivacyEngine(accountant=name)`` uses it (Opacus 1.6). Opacus 1.5 has no accountant registry
    and its ``PrivacyEngine(accountant=name)`` refuses the name: there use ``attach(PrivacyEngine(), name)``
    (also fine on 1.6), or assign ``engine.accountant = create_accountant(name)`` before ``make_private``.

    The accountant gives every run the number the core gives for what ran: a fact observed at a step that
    breaks a row's precondition (Adam, momentum, a learning-rate schedule, per-layer clipping that may be
    active, a declared gradient norm exceeded) removes that row from ``best`` from that step on, and
    ``report`` says which rows left, when and why (docs/opacus.md).

    Args:
      name: the mechanism name (``accountant.mechanism()`` returns it).
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``: the minimum over every proven
        row whose preconditions held at every step, composition included). A named bound whose precondition
        breaks refuses the run.
      sampling: what the data loader does (cyclic, shuffle_once, reshuffle, poisson, random_allocation with a
        ``RandomAllocationSampler``, whose k and steps an epoch are read from it); checked against the loader.
      dataset_size: n; must equal ``len(data_loader.dataset)`` at every step.
      learning_rate: the constant SGD step size the last-iterate rows need (every step must use exactly it, or
        those rows leave); None (default): those rows leave, and the report says which would come back.
      relation: the neighbouring relation of the guarantee. Default: the sampling scheme's
        (``lastiter_plugins.config.DEFAULT_RELATION``, the rule of every route): ``add_or_remove_one``
        with ``sampling="poisson"`` (the relation of Opacus' own accountants; lastiter-plugins 0.2.0 used
        ``replace_one``, and until 0.4.0 leaving it out warns with a ``FutureWarning``), else
        ``replace_one`` (the only relation the other schemes have bounds for).
      orders: Renyi orders (default: the library's grid).
      published_only: ``best`` over bounds whose proof is a published theorem for the run (not this
        library's derivations; a named ``bound`` must be one).
      require: ``"last_iterate"``: refuse the run when no row certifying the final model only is left (instead
        of reporting an every-iterate number).
      metric_source: ``"public"`` declares that a rule reading a metric (``ReduceLROnPlateau``, early stopping)
        reads one computed from data outside the private set, or from the released iterates alone; without it
        a ``ReduceLROnPlateau`` that reads a metric refuses the run.
      force: replace an existing registration of ``name`` with a different configuration.
      model: ``"glm"`` derives the loss assumptions instead of taking them (certified linear models,
        docs/opacus.md): the model's only trainable layer must be a final ``nn.Linear`` fed by a
        ``FeatureNormClip(A)``; the constants are derived at ``make_private`` from the model, the clip
        norm and SGD's ``weight_decay``, and checked at every step. The loss assumptions (below) must then be
        left out, but for ``diameter``.
      loss: with ``model="glm"``: ``"logistic"`` (``BCEWithLogitsLoss``), ``"softmax"``
        (``CrossEntropyLoss``) or ``"huber"`` (``HuberLoss(delta=huber_delta)``).
      feature_norm: with ``model="glm"``: A, the bound of the ``FeatureNormClip``.
      huber_delta: with ``loss="huber"``: the Huber loss' delta.
      **assumptions: the loss assumptions, the fields of ``lastiter_plugins.LossAssumptions`` with their
        meaning there (``smoothness``, ``weak_convexity``, ``strong_convexity``, ``diameter`` (needs
        ``attach_projection``), ``gradient_norms_within_clip``, ``clipped_loss_convex_smooth``,
        ``l2_outside_clip``: ``strong_convexity`` is torch SGD's ``weight_decay``, which every parameter group
        must then use).

    Returns:
      ``name``.

    Raises:
      ValueError: an invalid value, a renamed keyword (``clipping``), or ``name``
        already registered with another configuration and ``force`` is False.
      lastiter_plugins.UnsupportedHostError: an Opacus or torch version the adapter was not tested with.
    """
    refuse_renamed(assumptions)
    unknown = sorted(set(assumptions) - set(LOSS_KEYWORDS))
    if unknown:
        raise TypeError(f"register() got unexpected keyword arguments: {', '.join(unknown)}.")
    internals.require_tested_opacus()
    require_tested_torch()
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string. Found {name!r}.")
    if bound not in lp.BOUND_IDS:
        raise ValueError(f"bound must be one of {', '.join(lp.BOUND_IDS)}. Found {bound!r}.")
    if require not in (None, LAST_ITERATE):
        raise ValueError(f"require must be None or {LAST_ITERATE!r}. Found {require!r}.")
    if metric_source not in (None, PUBLIC):
        raise ValueError(f"metric_source must be None or {PUBLIC!r}. Found {metric_source!r}.")
    sampling = lp.Sampling.parse(sampling)
    relation = resolve_relation(relation, sampling)
    glm = None
    if model is not None:
        if model != "glm":
            raise ValueError(f"model must be None or 'glm' (a certified linear model). Found {model!r}.")
        for key in _DERIVED:
            if assumptions.get(key):
                raise ValueError(
                    f"{key} must be left out with model='glm': the route derives it from the model and the "
                    "optimizer's weight_decay. Found it declared."
                )
        glm = declare(
            loss=loss,
            feature_norm=feature_norm,
            huber_delta=huber_delta,
            smoothness=assumptions.get("smoothness"),
            weak_convexity=assumptions.get("weak_convexity", 0.0),
            strong_convexity=assumptions.get("strong_convexity", 0.0),
            gradient_norms_within_clip=assumptions.get("gradient_norms_within_clip", False),
        )
    else:
        given = [
            k
            for k, v in (("loss", loss), ("feature_norm", feature_norm), ("huber_delta", huber_delta))
            if v is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} need model='glm'. Found them without it.")
    declared = lp.LossAssumptions(**assumptions)
    # TrainingConfig validates dataset_size and learning_rate with the core's messages.
    probe = lp.TrainingConfig(
        dataset_size=dataset_size, batch_size=1, noise_multiplier=1.0, steps=1, sampling=sampling,
        learning_rate=learning_rate, relation=relation,
    )  # fmt: skip
    if bound != lp.BEST:
        spec = lp.BOUNDS[bound]
        covered = spec.relation_for(sampling)
        if covered is None:
            schemes = ", ".join(s.value for s in spec.covers)
            raise ValueError(f"sampling must be one of {schemes} for {bound}. Found {sampling.value}.")
        if covered is not relation:
            raise ValueError(
                f"relation must be {covered.value} for {bound} with sampling={sampling.value}. Found {relation.value}."
            )
    if sampling is lp.Sampling.RANDOM_BATCH:
        raise ValueError(
            "sampling must be one of cyclic, shuffle_once, reshuffle, poisson, random_allocation for the Opacus "
            "adapter: it does not observe fixed-size random batches (a loader of one batch, DataLoader(ds, "
            "sampler=RandomSampler(ds, num_samples=b), batch_size=b), iterated afresh every step, would be one; "
            "account it with lp.epsilon(..., sampling='random_batch')). Found random_batch."
        )
    reg = Registration(
        name=name,
        bound=bound,
        sampling=sampling,
        relation=relation,
        dataset_size=probe.dataset_size,
        learning_rate=probe.learning_rate,  # a finite number > 0 (probe validated it), or None
        assumptions=declared,
        orders=None if orders is None else tuple(float(o) for o in validate_orders(orders)),
        glm=glm,
        weight_decay_everywhere=float(declared.strong_convexity) if declared.l2_outside_clip else None,
        published_only=_flag("published_only", published_only),
        require=require,  # type: ignore[arg-type]  # (validated above)
        metric_source=metric_source,  # type: ignore[arg-type]  # (validated above)
    )
    previous = _REGISTRATIONS.get(name)
    if previous is not None and previous == reg:
        return name
    if previous is not None and not force:
        raise ValueError(
            f"accountant name {name!r} is already registered with a different configuration "
            f"({previous.to_dict()}); pass force=True to replace it or choose another name."
        )
    cls = type(
        f"LastIterateAccountant_{name}",
        (LastIterateAccountant,),
        {"_registration": reg, "__module__": LastIterateAccountant.__module__, "__doc__": f"Accountant {name!r}."},
    )
    internals.register_accountant(name, cls, force=force or previous is not None)
    _REGISTRATIONS[name] = reg
    return name


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False. Found {value!r}.")
    return value


def create_accountant(name: str) -> Any:
    """A new accountant of the configuration registered under ``name`` (Opacus 1.5 and 1.6).

    Raises:
      ValueError: nothing is registered under ``name`` (call ``register`` first).
    """
    registration(name)  # raises if the name is not ours
    accountant = internals.create_accountant(name)
    if not isinstance(accountant, LastIterateAccountant):  # the name was taken over after register()
        raise ValueError(
            f"accountant name {name!r} must stand for the last-iterate accountant registered with register(). "
            f"Found {type(accountant).__name__} registered under it since; register it again."
        )
    return accountant


def attach(engine: Any, name: str) -> Any:
    """Give ``engine`` (an ``opacus.PrivacyEngine``) a new accountant of the configuration registered
    under ``name``, and return it: ``engine.accountant = create_accountant(name)``.

    The way to use a last-iterate accountant with Opacus 1.5, whose ``PrivacyEngine(accountant=...)``
    knows only rdp, gdp and prv; on Opacus 1.6 it is the same as ``PrivacyEngine(accountant=name)``.
    Call it before ``make_private``, which hands the optimizer the hook of the accountant the engine
    holds at that time.

    Raises:
      TypeError: ``engine`` is not an ``opacus.PrivacyEngine``.
      ValueError: nothing is registered under ``name``.
      LastIterateConfigurationError: ``engine.make_private`` has already run (its optimizer reports
        its steps to the accountant the engine held then, so the new one would see none).
    """
    if not isinstance(engine, PrivacyEngine):
        raise TypeError(f"engine must be an opacus.PrivacyEngine. Found {type(engine).__name__}.")
    if internals.engine_made_private(engine):
        raise LastIterateConfigurationError(
            f"attach(engine, {name!r}) must come before engine.make_private: the optimizer make_private returned "
            f"reports its steps to the accountant the engine held then ({type(engine.accountant).__name__}), so "
            "the new accountant would see none. Found an engine that has already made a model private. Create a "
            "new PrivacyEngine, attach the accountant, then call make_private."
        )
    accountant = create_accountant(name)
    engine.accountant = accountant
    return accountant


def registration(name: str) -> Registration:
    """The configuration registered under ``name``."""
    try:
        return _REGISTRATIONS[name]
    except KeyError:
        raise ValueError(f"no last-iterate accountant is registered under {name!r}; call register() first.") from None
