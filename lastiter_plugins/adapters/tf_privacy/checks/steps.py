r"""Every step is one DP-SGD step of the planned mechanism: one DP gradient computation per ``train_step`` on a
fresh optimizer, ``b`` examples each contributing one loss value (one clipped gradient), loss weights 1, the
planned clip norm and noise, and nothing but the DP update changing a weight inside the step; the optimizer
object, the trainable variables and the model's weights stay those fit started with, and every epoch is one
pass. Each is a precondition of every row (the noise, the sensitivity or the count of steps): refused."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from lastiter_plugins.host import Departure

from .._errors import AccountingError
from .._observe import HostFacts, StepFacts
from ._check import VOID, Check, Start, Verdict


class StepCheck(Check):
    def start(self, start: Start) -> Iterable[Departure]:
        optimizer = start.model.optimizer
        iterations = int(optimizer.iterations.numpy())
        if start.earlier_steps is not None:
            raise AccountingError(
                f"the model must not have been trained before: a LastIterateCallback already accounted "
                f"{start.earlier_steps} steps on it, and this run would start from their result, which its epsilon "
                "does not cover. Train in one fit call, or compose the runs' RDP (the dp-accounting adapter "
                "does). Found a model trained by an earlier accounted fit."
            )
        counted = start.keras_steps_before
        if (iterations or counted) and not start.public_pretraining:
            found = (
                f"optimizer.iterations={iterations}"
                if iterations
                else f"{counted} training step(s) in Keras' count of the model (an earlier fit or train_on_batch)"
            )
            raise AccountingError(
                "the model must not have been trained before this fit on private data: this run starts from the "
                "weights that training made, which the epsilon does not cover (a new optimizer does not undo it). "
                "If that training used public data only, declare public_pretraining=True; otherwise train a fresh "
                "model in one fit call with this callback. "
                f"Found {found} before the first accounted step, with public_pretraining=False."
            )
        self.first = iterations  # the optimizer's steps before the run (declared public)
        self.settings, self.fit, self.planned = start.optimizer, start.fit, start.config.steps
        self.batch_size = start.fit.rows_per_step
        self.padded = start.fit.allocation is not None  # zero-weight padding rows: the allocation check's
        self.accounted = optimizer
        self.trainable_ids = tuple(id(v) for v in start.model.trainable_variables)
        self.weight_ids = tuple(id(v) for v in start.model.weights)
        return ()

    def step(self, k: int, step: StepFacts) -> Verdict:
        s = self.settings
        started = self.first + k - 1
        if step.step != k or step.dp_calls != 1 or step.iterations != started:
            return (
                f"every optimizer step must be one DP-SGD step of the compiled train_step, observed by this "
                f"callback: step {k} ran {step.dp_calls:g} DP gradient computation(s) and started at "
                f"optimizer.iterations={step.iterations:g} (expected 1 and {started}: a train_step that "
                "does not call the DP optimizer once, a second optimizer, or optimizer steps between the "
                "steps)" + VOID
            )
        b = self.batch_size
        if step.rows != b:
            return (
                f"every batch must have {self.fit.rows_named}, as planned: step {k} had {step.rows}. Change "
                "nothing in the data between steps" + VOID
            )
        if step.loss_length != b:
            return (
                f"the loss must return one value per example: step {k} passed a loss vector of {step.loss_length} "
                f"entries for a batch of {b} examples to TF Privacy, which clips one gradient per entry "
                f"(num_microbatches=None) and divides by {step.loss_length}. An example contributing several "
                "entries (augmented views concatenated, pairs, a loss over tokens) contributes several clipped "
                "gradients, which multiplies the sensitivity the bounds assume. Average each example's terms "
                "inside the loss so that it returns a vector of batch_size values" + VOID
            )
        if step.weight_off_one > 0 and not self.padded:
            return (
                f"every example's loss weight must be 1: step {k} fed fit's sample_weight / class_weight with an "
                f"entry {step.weight_off_one:g} away from 1, which rescales that example's loss" + VOID
            )
        planned_std = s.noise_multiplier * s.l2_norm_clip
        if not (_close(step.clip, s.l2_norm_clip) and _close(step.noise_std, planned_std)):
            z = step.noise_std / step.clip if step.clip else math.inf
            return (
                f"the clip norm and the noise must stay as planned: step {k} clipped at {step.clip:g} with noise std "
                f"{step.noise_std:g} on the clipped sum (noise multiplier {z:g}), planned "
                f"C = {s.l2_norm_clip:g}, std = {planned_std:g} (z = {s.noise_multiplier:g}). Something changed "
                "the optimizer's l2_norm_clip or noise_multiplier (a tf.Variable assigned during fit); keep "
                "them fixed, or account the run with the smallest noise multiplier and the largest clip norm "
                "it used" + VOID
            )
        if step.tampered:
            return (
                f"within step {k}, something other than the DP optimizer's update changed the model's weights "
                "(a second, non-private optimizer, a layer updating a non-trainable weight from the batch, e.g. "
                "a running statistic or a counter of the data, or an assign in the step). Every weight change "
                "must be the DP-SGD update; statistics of the private data kept in the model are released with "
                "it without noise" + VOID
            )
        if step.others_moved:
            return (
                f"step {k} must start where step {k - 1} ended: the non-trainable weights changed between the two "
                "steps (a callback or other code wrote them). Weights that are not trained must stay as they "
                "were at the start of fit" + VOID
            )
        return None

    def host(self, facts: HostFacts, checked: int) -> Verdict:
        if facts.optimizer is not self.accounted:
            return "model.optimizer must stay the optimizer fit started with: it was replaced during fit" + VOID
        planned = tuple(sorted(self.trainable_ids))
        if facts.trainable_ids != self.trainable_ids or any(ids != planned for ids in facts.traced_ids):
            differentiated = " or ".join(sorted({str(len(ids)) for ids in facts.traced_ids})) or "none"
            return (
                "the DP optimizer must train exactly the model's trainable variables, fixed for the whole run: "
                f"by the end of step {checked} model.trainable_variables has {len(facts.trainable_ids)} variable(s) "
                f"(at the start {len(self.trainable_ids)}) and the DP optimizer differentiated {differentiated}. A "
                "layer's trainable flag changed during fit, or another optimizer trains some variables; train all "
                "parameters with the one DP optimizer" + VOID
            )
        if facts.weight_ids != self.weight_ids:
            return (
                f"the model's weights must be the ones fit started with: after step {checked} model.weights "
                f"lists {len(facts.weight_ids)} variable(s), at the start {len(self.weight_ids)} (a layer created "
                "or replaced during fit); build the whole model before fit" + VOID
            )
        return None

    def epoch_end(self, steps: int, stopped: bool) -> Verdict:
        per_epoch = self.fit.steps_per_epoch
        if not stopped and steps % per_epoch:  # a stop is the metric rules' business
            return (
                f"every epoch must be one pass over the data in {per_epoch} steps of "
                f"{self.fit.batch_size} examples: an epoch ended after {steps} steps in total" + VOID
            )
        return None

    def train_end(self, steps: int, stopped: bool) -> Verdict:
        if not stopped and steps != self.planned:
            return f"fit ran {steps} steps, planned {self.planned}" + VOID
        return None

    def when_read(self, model: Any, steps: int, moved: tuple[float, bool] | None) -> str | None:
        return usable_problem(self.accounted, getattr(model, "optimizer", None), steps, self.first)


def usable_problem(accounted: Any, optimizer: Any, steps: int, first: int = 0) -> str | None:
    """Whether ``model.optimizer`` (``optimizer``) is the accounted one and took exactly the counted steps after
    its ``first`` steps before the run (declared public)."""
    if optimizer is not accounted:
        return (
            "model.optimizer must be the optimizer whose steps this callback counted: the model was "
            "compiled again, so steps taken with the new optimizer are not accounted. Found "
            f"{type(optimizer).__name__} object {id(optimizer):#x}, not the accounted one "
            f"{id(accounted):#x}; account the whole training in one fit call with this callback."
        )
    iterations = int(optimizer.iterations.numpy())
    expected = first + steps
    counted = f"the {steps} steps this callback counted" + (f" after the {first} before the run" if first else "")
    if iterations > expected:
        return (
            f"model.optimizer.iterations must equal {expected}, {counted}: the "
            f"model took {iterations - expected} optimizer step(s) it did not see (a later fit or "
            "train_on_batch without this callback, or a custom training loop), so the epsilon would describe "
            f"fewer steps than the model took. Found iterations={iterations}; account the whole training in "
            "one fit call with this callback."
        )
    if iterations < expected:
        return (
            f"model.optimizer.iterations must equal {expected}, {counted}: the "
            f"step count was set back (a restored optimizer state?). Found iterations={iterations}."
        )
    return None


def _close(found: float, planned: float) -> bool:
    return abs(found - planned) <= 1e-6 * abs(planned)
