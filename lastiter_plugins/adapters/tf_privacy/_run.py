r"""The ledger of one ``fit`` call: the run as planned before the first step, the steps counted and checked,
the departures found, and the checks (:mod:`.checks`) asked at every point.

:meth:`Run.begin` reads the DP optimizer and fit's data (:mod:`._settings`), derives the loss assumptions of a
certified linear model, asks every check before the first step (a refusal raises there) and instruments the
compiled step (:class:`._observe.StepProbe`). :meth:`Run.verify` reads the steps recorded since the last check
in one transfer and asks every check about each, then about the host's facts; a departure is recorded (and the
named bound or ``require`` checked against the pipeline left), a refusal voids the run. :meth:`Run.account` is
the number for the pipeline that ran (:func:`lastiter_plugins.host.account`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lastiter_plugins import (
    LossAssumptions,
    NotApplicableError,
    PipelineChangedError,
    Relation,
    Sampling,
    TrainingConfig,
    impossible_declaration,
)
from lastiter_plugins.host import Account, Declaration, Departure, account

from . import _glm
from . import _observe as observe
from . import checks as checks_module
from ._errors import AccountingError
from ._settings import DPOptimizerSettings, FitSettings, read_dp_optimizer, read_fit
from .checks import VOID, Check, ProjectionCheck, Start, Verdict


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the user registered with the callback (validated there)."""

    declaration: Declaration
    sampling: Sampling
    dataset_size: int
    relation: Relation
    delta: float
    assumptions: LossAssumptions
    glm: _glm.GlmDeclaration | None
    metric_source: str | None
    public_statistics: bool = False
    public_pretraining: bool = False


class Run:
    """One fit call, from its first step on (made by :meth:`begin`)."""

    def __init__(
        self, start: Start, checks: tuple[Check, ...], departures: list[Departure], probe: observe.StepProbe
    ) -> None:
        self.start = start
        self.checks = checks
        self.departures = departures
        self.probe = probe
        self.steps = 0  # steps counted and checked
        self.failure: str | None = None
        self.ended = False

    @classmethod
    def begin(cls, model: Any, declared: Declared, earlier_steps: int | None, keras_steps_before: int) -> Run:
        """Before the first step: the planned run, or AccountingError / NotApplicableError (nothing installed).
        ``earlier_steps``: an earlier accounted fit's steps on the model; ``keras_steps_before``: Keras' count of
        the model's training steps before this fit."""
        settings = read_dp_optimizer(model.optimizer)
        fit = read_fit(model)
        assumptions, glm = declared.assumptions, None
        if declared.glm is not None:  # model="glm": derive the assumptions (the diameter stays declared)
            assumptions, glm = _glm.derive(
                declared.glm, model, clip_norm=_glm.clip_as_run(settings.l2_norm_clip), diameter=assumptions.diameter
            )
        config = planned_config(settings, fit, declared)
        impossible = impossible_declaration(config, assumptions)  # a real run has real losses
        if impossible is not None:
            raise AccountingError(f"{impossible}. Found them declared to LastIterateCallback.")
        start = Start(
            model,
            settings,
            fit,
            config,
            assumptions,
            declared.dataset_size,
            earlier_steps,
            keras_steps_before,
            declared.metric_source,
            public_statistics=declared.public_statistics,
            public_pretraining=declared.public_pretraining,
        )
        checks = checks_module.checks(glm)
        departures = [departure for check in checks for departure in check.start(start)]  # a refusal raises
        account(declared.declaration, config, assumptions, declared.delta, departures)  # refuses now
        projection = next(c for c in checks if isinstance(c, ProjectionCheck))
        probe = observe.StepProbe(model, model.optimizer, projection.ball, capacity=fit.steps_per_epoch)
        for check in checks:  # a check's own probe wraps the step probe's wrappers: installed after it
            check.install(start)
        return cls(start, checks, departures, probe)

    # -- reading

    @property
    def settings(self) -> DPOptimizerSettings:
        return self.start.optimizer

    @property
    def fit(self) -> FitSettings:
        return self.start.fit

    @property
    def assumptions(self) -> LossAssumptions:
        return self.start.assumptions

    @property
    def accounted_steps(self) -> int:
        """The steps the epsilon covers: those counted, or every planned one when training may stop at a time
        chosen during the run."""
        planned = any(check.planned_steps for check in self.checks)
        return self.start.config.steps if planned else self.steps

    def account(self, declared: Declared, steps: int = 0) -> Account:
        """The number for the pipeline that ran, after the steps counted (at least ``steps``; raises
        NotApplicableError)."""
        config = self.start.config.replace(steps=max(self.accounted_steps, steps))
        return account(declared.declaration, config, self.assumptions, declared.delta, self.departures)

    # -- checking

    def verify(self, model: Any, declared: Declared) -> None:
        """Check the steps recorded since the last check and the host's facts; a refusal voids the run
        (PipelineChangedError)."""
        if self.failure is not None:
            raise PipelineChangedError(self.failure)
        if self.ended:
            return
        problem = self._problem(model, declared)
        if problem is not None:
            self.fail(problem)

    def count(self, model: Any, declared: Declared) -> int:
        """Check the steps recorded so far without raising: the steps counted up to the first one no row covers
        (which the next :meth:`verify` raises)."""
        if self.failure is None and not self.ended:
            self.failure = self._problem(model, declared)
        return self.steps

    def _problem(self, model: Any, declared: Declared) -> str | None:
        record = self.probe.read()
        if record.lost(self.steps):
            return (
                f"the callback must check every step: {record.steps - self.steps} steps ran since its last check, "
                f"more than the {record.capacity} (one epoch) it records between two checks (train_on_batch or "
                "another training call inside fit?)" + VOID
            )
        for check in self.checks:
            why = check.read(record.steps)
            if why is not None:
                return why + VOID
        for k in range(self.steps + 1, record.steps + 1):
            facts = observe.StepFacts.of(record.row(k))
            for check in self.checks:
                problem = self.take(check.step(k, facts), declared)
                if problem is not None:
                    return problem
            self.steps = k
        host = observe.host_facts(model, self.probe)
        for check in self.checks:
            problem = self.take(check.host(host, self.steps), declared)
            if problem is not None:
                return problem
        return None

    def take(self, verdict: Verdict, declared: Declared) -> str | None:
        """Record a departure (refused when it breaks the named bound or ``require``); the refusal, or None."""
        if verdict is None or isinstance(verdict, str):
            return verdict
        self.departures.append(verdict)
        try:
            self.account(declared, verdict.step)
        except NotApplicableError as exc:
            return f"{exc}".rstrip(".") + VOID
        return None

    def epoch_end(self, model: Any, declared: Declared) -> None:
        self.verify(model, declared)
        self._ask(lambda c: c.epoch_end(self.steps, _stopped(model)), declared)

    def train_end(self, model: Any, declared: Declared) -> None:
        self.verify(model, declared)
        self.remove()
        self.ended = True
        self._ask(lambda c: c.train_end(self.steps, _stopped(model)), declared)
        self.when_read(model)

    def _ask(self, ask: Any, declared: Declared) -> None:
        for check in self.checks:
            problem = self.take(ask(check), declared)
            if problem is not None:
                self.fail(problem)

    def when_read(self, model: Any) -> None:
        """Whether the model is still what the counted steps made (checked whenever the epsilon is read): a
        problem ending with VOID (the model changed) voids the run; another (steps the callback did not see)
        only refuses this read (PipelineChangedError)."""
        moved = self.probe.departure() if self.ended else None
        for check in self.checks:
            problem = check.when_read(model, self.steps, moved)
            if problem is not None and problem.endswith(VOID):
                self.fail(problem)
            if problem is not None:
                raise PipelineChangedError(problem)

    def fail(self, message: str) -> None:
        self.failure = message
        self.remove()
        raise PipelineChangedError(message)

    def remove(self) -> None:
        """Unwrap the step (the checks' probes wrap the step probe's wrappers: removed first) and drop the train
        function compiled with the wrappers; the records stay readable."""
        for check in reversed(self.checks):
            check.remove()
        if self.probe.installed:
            self.probe.remove()
            self.probe.model.train_function = None


def planned_config(settings: DPOptimizerSettings, fit: FitSettings, declared: Declared) -> TrainingConfig:
    """The run as declared and planned: the SGD update at the optimizer's rate at step 0, every planned step.

    A :class:`RandomAllocationDataset` pads every batch to L rows, and TF Privacy divides by L: in the core's
    terms (divisor b, which fixes the t steps of an epoch) that is the learning rate ``eta b / L``, the same
    update, with batches cut at L (docs/derivations/fixed-length-batches.md, part 5)."""
    allocation = fit.allocation if declared.sampling is Sampling.RANDOM_ALLOCATION else None  # else: refused later
    return TrainingConfig(
        dataset_size=fit.dataset_size,
        batch_size=fit.batch_size,
        noise_multiplier=settings.noise_multiplier,
        steps=fit.epochs * fit.steps_per_epoch,
        sampling=declared.sampling,
        learning_rate=settings.learning_rate * fit.batch_size / fit.rows_per_step,
        clip_norm=settings.l2_norm_clip,
        relation=declared.relation,
        allocations_per_epoch=1 if allocation is None else allocation.allocations_per_epoch,
        max_batch_size=None if allocation is None else allocation.max_batch_size,
    )


def _stopped(model: Any) -> bool:
    return bool(getattr(model, "stop_training", False))


__all__ = ["AccountingError", "Declared", "Run", "planned_config"]
