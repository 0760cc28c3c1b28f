"""Registration of configured accountants under a name, creating and attaching them, and the adapter's errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import lastiter_plugins as lp
from lastiter_plugins.config import refuse_renamed, resolve_relation
from lastiter_plugins.validation import validate_orders

if TYPE_CHECKING:
    from lastiter_plugins.adapters.opacus._glm_declaration import GlmDeclaration


class LastIterateConfigurationError(lp.NotApplicableError):
    """The Opacus pipeline does not match what the registered bound assumes
    (found at ``make_private`` or when binding a loader).

    The message names the parameter, the constraint, the value found and the fix.
    """


class LastIteratePipelineChangedError(LastIterateConfigurationError, lp.PipelineChangedError):
    """What an optimizer step actually did differs from the configuration the accountant
    verified (data source, sampler, batch, per-example gradients, noise, clipping, step
    size, parameters, projection). The run's epsilon is void from then on."""


@dataclasses.dataclass(frozen=True)
class Registration:
    """What the user declared when registering an accountant name (validated)."""

    name: str
    bound: str
    sampling: lp.Sampling
    relation: lp.Relation
    dataset_size: int
    learning_rate: float
    assumptions: lp.LossAssumptions
    orders: tuple[float, ...] | None = None
    #: model="glm": the declared loss and feature-norm bound (the assumptions are derived from the model)
    glm: GlmDeclaration | None = None
    #: torch SGD weight_decay per parameter group that the optimizer check accepts (None: 0 everywhere);
    #: set by the GLM route, which folds it into the derived constants
    weight_decays: tuple[float, ...] | None = None
    #: l2_outside_clip declared by hand: the weight_decay of every parameter group (the declared strong convexity)
    weight_decay_everywhere: float | None = None
    #: best over bounds whose proof is a published theorem only
    published_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.glm is not None:  # only then, so that checkpoints of declared runs keep their format
            extra = {"glm": self.glm.to_dict(), "weight_decays": list(self.weight_decays or ())}
        if self.weight_decay_everywhere is not None:
            extra["weight_decay_everywhere"] = self.weight_decay_everywhere
        if self.published_only:
            extra["published_only"] = True
        return {
            **extra,
            "name": self.name,
            "bound": self.bound,
            "sampling": self.sampling.value,
            "relation": self.relation.value,
            "dataset_size": self.dataset_size,
            "learning_rate": self.learning_rate,
            "assumptions": dataclasses.asdict(self.assumptions),
            "orders": None if self.orders is None else list(self.orders),
        }


_REGISTRATIONS: dict[str, Registration] = {}


def register(
    name: str,
    *,
    bound: str = lp.BEST,
    sampling: str | lp.Sampling,
    dataset_size: int,
    learning_rate: float,
    smoothness: float | None = None,
    weak_convexity: float = 0.0,
    strong_convexity: float = 0.0,
    diameter: float | None = None,
    gradient_norms_within_clip: bool = False,
    clipped_loss_convex_smooth: bool = False,
    l2_outside_clip: bool = False,
    relation: str | lp.Relation | None = None,
    orders: Sequence[float] | None = None,
    published_only: bool = False,
    force: bool = False,
    model: str | None = None,
    loss: str | None = None,
    feature_norm: float | None = None,
    huber_delta: float | None = None,
    **renamed: Any,
) -> str:
    r"""Register a pre-configured last-iterate accountant under ``name``.

    Opacus instantiates registered accountants with no arguments, so the
    configuration is bound to the name. Afterwards ``PrivacyEngine(accountant=name)``
    uses it (Opacus 1.6). Opacus 1.5 has no accountant registry and its
    ``PrivacyEngine(accountant=name)`` refuses the name: there use
    ``attach(PrivacyEngine(), name)`` (also fine on 1.6), or assign
    ``engine.accountant = create_accountant(name)`` before ``make_private``.

    Args:
      name: the mechanism name (``accountant.mechanism()`` returns it).
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``: the
        minimum over every proven bound that applies, composition included).
      sampling: what the data loader does (cyclic, shuffle_once, reshuffle, poisson);
        checked against the loader.
      dataset_size: n; must equal ``len(data_loader.dataset)`` at every step.
      learning_rate: the constant SGD step size; every step must use exactly it.
      smoothness, weak_convexity, strong_convexity, diameter, gradient_norms_within_clip: the loss
        assumptions (see ``LossAssumptions``); ``diameter`` needs ``attach_projection``.
      clipped_loss_convex_smooth: declare by hand that every per-example loss is a scalar GLM
        phi(<a, x>) with phi convex and ``smoothness``-smooth (its clipped gradient is then a gradient
        step); ``model="glm"`` derives and checks this instead.
      l2_outside_clip: ``strong_convexity`` is torch SGD's ``weight_decay`` (added after the noisy
        clipped mean): every parameter group's ``weight_decay`` must then equal it, checked at every
        step; ``smoothness`` includes it.
      relation: the neighbouring relation of the guarantee. Default: the sampling scheme's
        (``lastiter_plugins.config.DEFAULT_RELATION``, the rule of every route): ``add_or_remove_one``
        with ``sampling="poisson"`` (the relation of Opacus' own accountants; lastiter-plugins 0.2.0 used
        ``replace_one``, and until 0.4.0 leaving it out warns with a ``FutureWarning``), else
        ``replace_one`` (the only relation the other schemes have bounds for).
      orders: Renyi orders (default: the library's grid).
      published_only: ``best`` over bounds whose proof is a published theorem for the run (not this
        library's derivations; a named ``bound`` must be one).
      force: replace an existing registration of ``name`` with a different configuration.
      model: ``"glm"`` derives the loss assumptions instead of taking them (certified linear models,
        docs/opacus.md): the model's only trainable layer must be a final ``nn.Linear`` fed by a
        ``FeatureNormClip(A)``; the constants are derived at ``make_private`` from the model, the clip
        norm and SGD's ``weight_decay``, and checked at every step. ``smoothness``, ``weak_convexity``,
        ``strong_convexity`` and ``gradient_norms_within_clip`` must then be left out.
      loss: with ``model="glm"``: ``"logistic"`` (``BCEWithLogitsLoss``), ``"softmax"``
        (``CrossEntropyLoss``) or ``"huber"`` (``HuberLoss(delta=huber_delta)``).
      feature_norm: with ``model="glm"``: A, the bound of the ``FeatureNormClip``.
      huber_delta: with ``loss="huber"``: the Huber loss' delta.

    Returns:
      ``name``.

    Raises:
      ValueError: an invalid value, a renamed keyword (``clipping``), or ``name``
        already registered with another configuration and ``force`` is False.
      lastiter_plugins.UnsupportedHostError: an Opacus version the adapter was not tested with.
    """
    from lastiter_plugins.adapters.opacus._accountant import register_class
    from lastiter_plugins.adapters.opacus._internals import require_tested_opacus

    refuse_renamed(renamed)
    if renamed:
        raise TypeError(f"register() got unexpected keyword arguments: {', '.join(sorted(renamed))}.")
    require_tested_opacus()
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string. Found {name!r}.")
    if bound not in lp.BOUND_IDS:
        raise ValueError(f"bound must be one of {', '.join(lp.BOUND_IDS)}. Found {bound!r}.")
    sampling = lp.Sampling.parse(sampling)
    relation = resolve_relation(relation, sampling)
    glm = None
    if model is not None:
        from lastiter_plugins.adapters.opacus._glm_declaration import declare

        if model != "glm":
            raise ValueError(f"model must be None or 'glm' (a certified linear model). Found {model!r}.")
        for key, value in (
            ("clipped_loss_convex_smooth", clipped_loss_convex_smooth),
            ("l2_outside_clip", l2_outside_clip),
        ):
            if value:
                raise ValueError(
                    f"{key} must be left out with model='glm': the route derives it from the model and the "
                    "optimizer's weight_decay. Found it declared."
                )
        glm = declare(
            loss=loss,
            feature_norm=feature_norm,
            huber_delta=huber_delta,
            smoothness=smoothness,
            weak_convexity=weak_convexity,
            strong_convexity=strong_convexity,
            gradient_norms_within_clip=gradient_norms_within_clip,
        )
    else:
        given = [
            k
            for k, v in (("loss", loss), ("feature_norm", feature_norm), ("huber_delta", huber_delta))
            if v is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} need model='glm'. Found them without it.")
    assumptions = lp.LossAssumptions(
        smoothness=smoothness,
        weak_convexity=weak_convexity,
        strong_convexity=strong_convexity,
        diameter=diameter,
        gradient_norms_within_clip=gradient_norms_within_clip,
        clipped_loss_convex_smooth=clipped_loss_convex_smooth,
        l2_outside_clip=l2_outside_clip,
    )
    # TrainingConfig validates dataset_size and learning_rate with the core's messages.
    probe = lp.TrainingConfig(
        dataset_size=dataset_size,
        batch_size=1,
        noise_multiplier=1.0,
        steps=1,
        sampling=sampling,
        learning_rate=learning_rate,
        relation=relation,
    )
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
            "sampling must be one of cyclic, shuffle_once, reshuffle, poisson for the Opacus adapter: it does not "
            "observe fixed-size random batches (a loader of one batch, DataLoader(ds, sampler=RandomSampler(ds, "
            "num_samples=b), batch_size=b), iterated afresh every step, would be one; account it with "
            "lp.epsilon(..., sampling='random_batch')). Found random_batch."
        )
    frozen_orders = None if orders is None else tuple(float(o) for o in validate_orders(orders))
    reg = Registration(
        name=name,
        bound=bound,
        sampling=sampling,
        relation=relation,
        dataset_size=probe.dataset_size,
        learning_rate=float(learning_rate),  # a finite number > 0: probe validated it
        assumptions=assumptions,
        orders=frozen_orders,
        glm=glm,
        weight_decay_everywhere=float(strong_convexity) if l2_outside_clip else None,
        published_only=_flag("published_only", published_only),
    )
    previous = _REGISTRATIONS.get(name)
    if previous is not None and previous == reg:
        return name
    if previous is not None and not force:
        raise ValueError(
            f"accountant name {name!r} is already registered with a different configuration "
            f"({previous.to_dict()}); pass force=True to replace it or choose another name."
        )
    register_class(name, reg, force=force or previous is not None)
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
    from lastiter_plugins.adapters.opacus._accountant import LastIterateAccountant
    from lastiter_plugins.adapters.opacus._internals import create_accountant as host_create

    registration(name)  # raises if the name is not ours
    accountant = host_create(name)
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
    from opacus import PrivacyEngine

    from lastiter_plugins.adapters.opacus._internals import engine_made_private

    if not isinstance(engine, PrivacyEngine):
        raise TypeError(f"engine must be an opacus.PrivacyEngine. Found {type(engine).__name__}.")
    if engine_made_private(engine):
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
