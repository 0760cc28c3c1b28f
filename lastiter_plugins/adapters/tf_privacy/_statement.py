r"""``compute_last_iterate_privacy_statement``: a privacy report for the FINAL model of a DP-SGD run,
the last-iterate counterpart of TF Privacy's ``compute_dp_sgd_privacy_statement``."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np
from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib as _tfp_statement

import lastiter_plugins as lp
from lastiter_plugins import LossAssumptions, Relation, Sampling, TrainingConfig, Update
from lastiter_plugins.config import default_relation, refuse_renamed
from lastiter_plugins.host import answer as host_answer
from lastiter_plugins.host import host_numbers, rows_needing
from lastiter_plugins.validation import validate_delta

from . import _glm
from . import _observe as observe
from ._settings import flag


def _steps_from_epochs(num_epochs: Any, steps_per_epoch: int) -> int:
    value = observe.finite_positive(num_epochs)
    if value is None:
        raise ValueError(f"num_epochs must be a finite number > 0. Found {num_epochs!r}.")
    steps = value * steps_per_epoch
    if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
        raise ValueError(
            f"num_epochs * ceil(number_of_examples / batch_size) must be a whole number of steps "
            f"(ceil = {steps_per_epoch}). Found num_epochs={num_epochs!r}, i.e. {steps:g} steps."
        )
    return round(steps)


_SAMPLING_WORDS = {
    Sampling.CYCLIC: "cyclic: the same order and batches every epoch (Keras fit(shuffle=False))",
    Sampling.SHUFFLE_ONCE: "shuffle once: one secret random permutation, then cyclic over it",
    Sampling.RESHUFFLE: "reshuffle: a new random permutation every epoch (Keras fit(shuffle=True))",
    Sampling.RANDOM_BATCH: "random batch: a uniformly random batch of b examples every step",
    Sampling.POISSON: "Poisson: each example joins each step independently with probability b/n",
    Sampling.RANDOM_ALLOCATION: "random allocation: each example joins k of each epoch's steps, drawn anew every epoch",
}

_RELATION_WORDS = {
    Relation.REPLACE_ONE: "replace-one adjacency (the two datasets have the same size and differ in one example)",
    Relation.ADD_OR_REMOVE_ONE: "add-or-remove-one adjacency (one dataset has one example more)",
}


#: The statement's lines are wrapped to this width (the table rows excepted).
_WIDTH = 80


def _fill(text: str) -> str:
    return textwrap.fill(text, width=_WIDTH)


def _fill_item(text: str) -> str:
    return textwrap.fill(text, width=80, initial_indent="    - ", subsequent_indent="      ", break_on_hyphens=False)


def _format_eps(value: float) -> str:
    return f"{value:12.3f}" if math.isfinite(value) else f"{'inf':>12}"


def compute_last_iterate_privacy_statement(
    *,
    number_of_examples: int,
    batch_size: int,
    num_epochs: float,
    noise_multiplier: float,
    delta: float,
    l2_norm_clip: float,
    learning_rate: float | None = None,
    sampling: str | Sampling,
    update: str | Update = Update.SGD,
    smoothness: float | None = None,
    weak_convexity: float = 0.0,
    strong_convexity: float = 0.0,
    diameter: float | None = None,
    gradient_norms_within_clip: bool = False,
    clipped_loss_convex_smooth: bool = False,
    l2_outside_clip: bool = False,
    model: str | None = None,
    feature_norm: float | None = None,
    loss: Any = None,
    units: int = 1,
    bias: bool = True,
    **renamed: Any,
) -> str:
    r"""A privacy report for the FINAL model of a DP-SGD run: the last-iterate
    counterpart of TF Privacy's ``compute_dp_sgd_privacy_statement``.

    It states the setup, the threat model (the final model only where a
    last-iterate row applies; TF Privacy's statement protects every checkpoint),
    the loss assumptions with their constants, for each neighbouring relation (the
    sampling scheme's default first: ``lastiter_plugins.config.DEFAULT_RELATION``)
    the epsilon of every applicable bound and the best, the rows a left-out
    ``learning_rate`` would add, and TF Privacy's own statement as the baseline
    (computed with ``used_microbatching=False``: one example per microbatch, the
    only setting :class:`LastIterateCallback` accepts), each of its numbers
    marked NOT VALID where its assumptions fail, with the ratio of the valid
    number to it.

    Args:
      number_of_examples: n.
      batch_size: b.
      num_epochs: passes over the data; ``num_epochs * ceil(n/b)`` must be a whole number of steps.
      noise_multiplier: z.
      delta: the target delta.
      l2_norm_clip: C.
      learning_rate: eta, constant (None: the rows that need it are left out, and the statement names them).
      sampling: what the pipeline did (see :class:`lastiter_plugins.Sampling`).
      update: ``"sgd"`` (plain SGD at the constant ``learning_rate``) or ``"any"`` (Adam, Adagrad, momentum, a
        learning-rate schedule fixed in advance: only the every-iterate rows cover it).
      smoothness, weak_convexity, strong_convexity, diameter, gradient_norms_within_clip,
        clipped_loss_convex_smooth, l2_outside_clip: the loss assumptions, as the core takes them
        (:class:`lastiter_plugins.LossAssumptions`).
      model: ``"glm"`` derives the loss assumptions as ``LastIterateCallback(model="glm")`` does, for one
        ``Dense(units, use_bias=bias)`` without activation on features clipped by ``FeatureNormClip(A)``
        with A <= ``feature_norm``, trained on ``loss`` (the Keras loss given to ``compile``); the
        assumption arguments above must then be left out (``diameter`` stays).
      feature_norm, loss, units, bias: with ``model="glm"``, the model's feature-norm bound A, compiled loss,
        Dense units and use_bias.

    Returns:
      The statement, the answer first (:func:`lastiter_plugins.answer_lines`: the number, what it protects, its
      relation, the winning row and its provenance, TF Privacy's own numbers NOT VALID where their assumptions
      fail), then the run, the threat model, the assumptions, every row, TF Privacy's statement and the
      references: lines of at most 80 characters apart from the table rows (about 100); each
      reference once, numbered, at the end.

    Raises:
      ValueError: invalid parameters, or no bound applies under either relation.
    """
    refuse_renamed(renamed)
    if renamed:
        raise TypeError(f"unexpected keyword argument {next(iter(renamed))!r}.")
    gradient_norms_within_clip = flag(gradient_norms_within_clip)
    clipped_loss_convex_smooth = flag(clipped_loss_convex_smooth)
    l2_outside_clip = flag(l2_outside_clip)
    declared = {
        "smoothness": smoothness is not None,
        "weak_convexity": weak_convexity != 0.0,
        "strong_convexity": strong_convexity != 0.0,
        "gradient_norms_within_clip": gradient_norms_within_clip is not False,
        "clipped_loss_convex_smooth": clipped_loss_convex_smooth is not False,
        "l2_outside_clip": l2_outside_clip is not False,
    }
    glm = _glm.declare(model=model, feature_norm=feature_norm, declared=declared)
    if glm is None and loss is not None:
        raise ValueError(f"loss needs model='glm'. Found loss={loss!r} without it.")
    # TF Privacy's names first (the core's checks name its own: dataset_size, clip_norm), then the sampling,
    # n, b, z, C and eta with the library's checks before using them.
    for name, value, what in (
        ("learning_rate", learning_rate, "the constant step size the last-iterate bounds depend on, or None"),
        ("l2_norm_clip", l2_norm_clip, "the per-example clipping norm"),
    ):
        if observe.finite_positive(value) is None and not (name == "learning_rate" and value is None):
            raise ValueError(f"{name} must be a finite number > 0 ({what}). Found {value!r}.")
    if isinstance(number_of_examples, bool) or not isinstance(number_of_examples, (int, np.integer)):
        raise ValueError(f"number_of_examples must be an integer >= 1. Found {number_of_examples!r}.")
    shape = TrainingConfig(
        dataset_size=number_of_examples,
        batch_size=batch_size,
        noise_multiplier=noise_multiplier,
        steps=1,
        sampling=Sampling.parse(sampling),
        learning_rate=learning_rate,
        clip_norm=l2_norm_clip,
        relation=default_relation(sampling),  # the statement reports both relations, the default first
        update=Update.parse(update),
    )
    if shape.dataset_size % shape.batch_size:
        raise ValueError(
            f"batch_size must divide number_of_examples = {shape.dataset_size}: TF Privacy divides a short last "
            "batch by its own size, which the last-iterate bounds do not cover (see LastIterateCallback). "
            f"Found batch_size={shape.batch_size}."
        )
    steps = _steps_from_epochs(num_epochs, shape.steps_per_epoch)
    config = shape.replace(steps=steps)
    if glm is not None:
        assumptions, family, _ = _glm.certify(
            glm,
            loss=loss,
            units=units,
            bias=flag(bias),
            clip_norm=_glm.clip_as_run(config.clip_norm),
            diameter=diameter,
        )
        model_words = f"certified linear model ({family.value} on features of norm <= {glm.feature_norm:g})"
    else:
        assumptions = LossAssumptions(
            smoothness=smoothness,
            weak_convexity=weak_convexity,
            strong_convexity=strong_convexity,
            diameter=diameter,
            gradient_norms_within_clip=gradient_norms_within_clip,
            clipped_loss_convex_smooth=clipped_loss_convex_smooth,
            l2_outside_clip=l2_outside_clip,
        )
        model_words = None
    impossible = lp.impossible_declaration(config, assumptions)  # a real run has real losses
    if impossible is not None:
        raise ValueError(f"{impossible}. Found them declared to compute_last_iterate_privacy_statement.")
    delta = validate_delta(delta)
    sections: dict[Relation, tuple[list[tuple[str, lp.EpsilonResult]], lp.EpsilonResult, list[str]]] = {}
    relations = (config.relation, *(r for r in Relation if r is not config.relation))  # the default first
    for relation in relations:
        cfg = config.replace(relation=relation)
        evaluations = lp.applicable_bounds(delta=delta, config=cfg, assumptions=assumptions)
        evaluations.pop(lp.BEST)
        rows = [(bid, e.result) for bid, e in evaluations.items() if e.applies and e.result is not None]
        if rows:
            try:
                best = lp.epsilon(lp.BEST, delta, lower_bound=True, config=cfg, assumptions=assumptions)
            except lp.NotApplicableError:
                continue
            needs = set(rows_needing("learning_rate", cfg, assumptions)) if cfg.learning_rate is None else set()
            missing = [
                f"{bid}: {_first_condition(e)}"
                for bid, e in evaluations.items()
                if _fails_here(e, cfg) and bid not in needs
            ]
            if needs:
                missing.insert(0, f"give learning_rate= for {', '.join(b for b in evaluations if b in needs)}")
            other = [bid for bid, e in evaluations.items() if not e.applies and cfg.sampling not in e.covers]
            if other:
                missing.append(f"for other samplings only: {', '.join(other)}")
            sections[relation] = (rows, best, missing)
    if not sections:
        raise ValueError(
            f"no bound applies to sampling={config.sampling.value} under either neighbouring relation; "
            "see lastiter_plugins.applicable_bounds for the reasons."
        )

    n, b, per_epoch = config.dataset_size, config.batch_size, config.steps_per_epoch
    if config.update is Update.ANY:
        update_words = "the update computed from the noisy gradients otherwise than plain SGD: Adam, momentum or a "
        update_words += "learning-rate schedule fixed in advance"
    elif config.learning_rate is None:
        update_words = "plain SGD, constant learning rate not given"
    else:
        update_words = f"plain SGD, constant learning rate {config.learning_rate:g}"
    last_iterate = any(r.protects is lp.Protects.FINAL_MODEL for rows, _, _ in sections.values() for _, r in rows)
    paragraphs = [
        _fill(
            f"DP-SGD ({update_words}) performed over {n} examples "
            f"with {b} examples per iteration ({per_epoch} iterations per epoch"
            + f"), clipping norm {config.clip_norm:g} per example (one example per microbatch), noise "
            f"multiplier {config.noise_multiplier:g}, for {num_epochs:g} epochs = {steps} iterations. "
            f"Sampling: {_SAMPLING_WORDS[config.sampling]}."
        ),
        _fill(_THREAT_LAST_ITERATE.format(steps=steps) if last_iterate else _THREAT_EVERY_ITERATE.format(steps=steps)),
        _assumptions_paragraph(assumptions, config.clip_norm, model_words),
    ]
    references = _References()
    for relation, (rows, best, missing) in sections.items():
        head = _fill(
            f"Example-level DP with {_RELATION_WORDS[relation]} at delta = {delta:g}, lastiter-plugins "
            "accounting (Renyi-DP, f-DP and PLD bounds, each converted to (epsilon, delta)):"
        )
        lines = [head]
        for bid, result in rows:
            lines.append(f"    {bid:<28}{_format_eps(result.epsilon)}   ({_label(result, references)})")
        lines.append(f"    {'best':<28}{_format_eps(best.epsilon)}   (via {best.winner}; {_label(best, references)})")
        lines.append(textwrap.fill(best.tightness_line, width=80, initial_indent="  ", subsequent_indent="    "))
        if lp.is_standard_baseline(best):
            suggestions = lp.advise(
                delta, top=3, host="keras", config=config.replace(relation=relation), assumptions=assumptions
            )
            note = lp.baseline_note(best, suggestions).split("\n")
            lines.append(textwrap.fill(note[0], width=80, initial_indent="  ", subsequent_indent="  "))
            lines.extend(_fill_item(line.strip()) for line in note[1:])
        if missing:
            lines.append("  Not applicable here (the first condition each fails):")
            lines.extend(_fill_item(m) for m in missing)
        paragraphs.append("\n".join(lines))
    for relation in relations:
        if relation not in sections:
            paragraphs.append(
                _fill(f"No bound covers sampling={config.sampling.value} under {_RELATION_WORDS[relation]}.")
            )
    baseline = _tfp_statement.compute_dp_sgd_privacy_statement(
        number_of_examples=n,
        batch_size=b,
        num_epochs=float(num_epochs),
        noise_multiplier=config.noise_multiplier,
        delta=delta,
        used_microbatching=False,
    )
    paragraphs.append(  # its verdict for this pipeline follows: the Poisson line's sampling, the relation
        _fill(
            "Baseline: TF Privacy's compute_dp_sgd_privacy_statement (tensorflow-privacy 0.9, "
            "used_microbatching=False), display only, add-or-remove-one, every checkpoint (a replace-one "
            "change is one removal plus one addition: compare with care):"
        )
        + "\n"
        + "\n".join(f"  | {line}".rstrip() for line in baseline.rstrip("\n").split("\n"))
    )
    relation, (_, valid, _) = next(iter(sections.items()))
    verdicts = [_fill("For this pipeline (never counted):")]
    for number in host_numbers(config.replace(relation=relation), delta, "tf_privacy"):
        times = ""
        if number.epsilon is not None and number.epsilon > 0:
            times = f"; the valid best above ({relation.value}) is {valid.epsilon / number.epsilon:.3g}x it"
        verdicts.append(_fill_item(f"{number}{times}"))
    paragraphs.append("\n".join(verdicts))
    paragraphs.append(references.render())
    first = config.replace(relation=relation)  # the first screen: the default relation's best, TF Privacy's numbers
    answer = lp.answer_lines(host_answer(valid, first, assumptions, "tf_privacy"), width=_WIDTH)
    return "\n\n".join(["\n".join(answer), *paragraphs]) + "\n"


_THREAT_LAST_ITERATE = (
    "This privacy guarantee protects the release of the FINAL model only. It does not protect "
    "intermediate checkpoints, models evaluated or published during training, or anything "
    "computed from them: they must stay private. (TF Privacy's statement below protects the "
    "release of all model checkpoints in addition to the final model, with different numbers; "
    "the 'composition' rows below, the standard baselines, also protect every iterate.) It covers "
    "the model after the {steps} iterations stated, a number fixed before training: a stopping time chosen from the "
    "private data (early stopping on a training or validation metric) and a model selected among "
    "intermediate iterates (restoring the best weights, releasing the best checkpoint) are not covered."
)
_THREAT_EVERY_ITERATE = (
    "No bound certifying the final model alone applies to this pipeline: the best number below is a composition "
    "row, which protects the release of every iterate (all checkpoints), hence also of the final model. It "
    "covers the {steps} iterations stated, a number fixed before training, and anything computed from the "
    "iterates; a stopping time or a learning rate chosen from a metric on the private data is not covered."
)


def _assumptions_paragraph(a: LossAssumptions, clip_norm: float, model_words: str | None) -> str:
    smooth = "not declared" if a.smoothness is None else f"M = {a.smoothness:g} (every per-example loss M-smooth)"
    convexity = (
        f"lam = {a.strong_convexity:g} (strongly convex)"
        if a.strong_convexity > 0
        else ("convex (m = 0)" if a.weak_convexity == 0 else f"m = {a.weak_convexity:g} (m-weakly convex)")
    )
    domain = "no projection" if a.diameter is None else f"projection onto a convex set of diameter D = {a.diameter:g}"
    if a.gradient_norms_within_clip:
        clipping = (
            f"clipping declared inactive: every per-example gradient norm <= C = {clip_norm:g} on the whole domain"
        )
    elif a.clipped_loss_convex_smooth:
        clipping = "clipping may be active, and the clipped update is the gradient step of convex losses (scalar GLM)"
    else:
        clipping = "clipping may be active"
    l2 = "; the strong convexity is an l2 term outside the clip" if a.l2_outside_clip else ""
    who = f"derived from the {model_words}" if model_words else "declared by the trainer"
    return _fill(
        f"Assumptions {who} (the guarantee holds only if they do, for the per-example "
        f"loss actually optimised, on both neighbouring datasets): smoothness {smooth}; {convexity}; "
        f"{domain}; {clipping}{l2}."
    )


def _fails_here(evaluation: Any, config: TrainingConfig) -> bool:
    return not evaluation.applies and config.sampling in evaluation.covers


def _first_condition(evaluation: Any) -> str:
    """The first condition a bound fails, in one short line (the full sentences name the theorem)."""
    if evaluation.unmet:
        return evaluation.unmet[0].short
    return evaluation.reasons[0] if evaluation.reasons else "does not apply"


class _References:
    """Each reference once: rows cite ``[k]``, the statement ends with the numbered list."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def cite(self, reference: str) -> str:
        number = self._numbers.setdefault(reference, len(self._numbers) + 1)
        return f"[{number}]"

    def render(self) -> str:
        lines = ["References:"]
        for reference, number in self._numbers.items():
            first = f"  [{number}] "
            lines.append(textwrap.fill(reference, width=80, initial_indent=first, subsequent_indent="      "))
        return "\n".join(lines)


def _label(result: lp.EpsilonResult, references: _References) -> str:
    """What a row protects, its proof status and its reference number, as the core reports them."""
    d = result.to_dict()
    proof = "" if d.get("proof") in (None, "proven") else f"; {d['proof']}"
    return f"protects {d['protects']}{proof}; {references.cite(d['reference'])}"
