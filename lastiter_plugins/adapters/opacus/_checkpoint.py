"""Checkpoints of the Opacus accountant: what its state holds, what a loaded state must match, and
the check of the model resumed with it (its weights are those the state was saved with)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lastiter_plugins.adapters.opacus._observe import Observed
from lastiter_plugins.adapters.opacus._registration import (
    LastIterateConfigurationError,
    LastIteratePipelineChangedError,
    Registration,
)
from lastiter_plugins.adapters.opacus._steps import digest

_Error = LastIterateConfigurationError
FORMAT = 3


def steps_in(history: list) -> int:
    """Steps of an Opacus-format history (one entry while the configuration stays constant)."""
    return int(history[0][2]) if len(history) == 1 else int(sum(entry[2] for entry in history))


def check_permutation(reg: Registration, saved: str | None, current: str | None) -> None:
    """A resumed shuffle-once run uses the checkpoint's permutation."""
    if saved != current:
        raise _Error(
            f"a run with sampling={reg.sampling.value} must resume with the same permutation: the "
            "shuffle-once bound assumes one permutation for the whole run. Found a ShuffleOnceSampler whose "
            f"permutation differs from the checkpoint's (digest {str(current)[:12]} vs {str(saved)[:12]}). "
            "Build the ShuffleOnceSampler with the seed of the interrupted run."
        )


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A state read by :func:`read`: what the accountant continues from."""

    history: list
    observed: Observed | None
    model_digest: str | None  # the model after the state's steps (None without steps)
    void: str | None
    record: dict | None  # the derivation's index record (absent from states of earlier versions)


def write(history: list, reg: Registration, observed: Observed | None, model_digest: str | None,
          void: str | None, record: dict | None) -> dict[str, Any]:  # fmt: skip
    """The accountant's own key of a state (``"lastiter"``)."""
    return {
        "format": FORMAT,
        "registration": reg.to_dict(),
        "observed": None if observed is None else observed.to_dict(),
        "model_digest": model_digest if history else None,
        "void": void,
        "record": record,
    }


def read(state_dict: Any, reg: Registration) -> Loaded:
    """Validate a state against the registered configuration and read it."""
    if not state_dict or "lastiter" not in state_dict:
        raise _Error(
            f"state_dict must come from a last-iterate accountant (key 'lastiter'). Found keys "
            f"{sorted(state_dict or {})}."
        )
    if state_dict.get("mechanism") != reg.name:
        raise _Error(f"state_dict of {state_dict.get('mechanism')!r} cannot be loaded into accountant {reg.name!r}.")
    extra = state_dict["lastiter"]
    if extra.get("registration") != reg.to_dict():
        raise _Error(
            f"the checkpoint was accounted under a different configuration of {reg.name!r}: "
            f"{extra.get('registration')} vs now {reg.to_dict()}. Register the same configuration to resume."
        )
    history = [(float(z), float(q), int(steps)) for z, q, steps in state_dict.get("history", [])]
    if history and not extra.get("model_digest"):
        raise _Error(
            f"state_dict must hold a digest of the model after its {steps_in(history)} steps (format {FORMAT}), so "
            "that the weights loaded with it can be checked. Found a state of format "
            f"{extra.get('format', 1)} without one (saved by an earlier version of lastiter-plugins). Resume "
            "from a checkpoint saved by this version, or start the run again."
        )
    observed = None if extra.get("observed") is None else Observed.from_dict(extra["observed"])
    return Loaded(
        history=history,
        observed=observed,
        model_digest=extra["model_digest"] if history else None,
        void=extra.get("void"),
        record=extra.get("record") if history else None,
    )


def model_differs(tensors: list | None, expected: str, steps: int) -> str | None:
    """Why the model's parameters and buffers are not those a state was saved with (None: they are, or
    nothing is bound yet to compare with: the number is then the checkpoint's model's)."""
    if tensors is None:
        return None
    found = digest(tensors)
    if found == expected:
        return None
    return (
        f"the model's parameters and buffers must be those the accountant's state was saved with, after its "
        f"{steps} steps. Found others (digest {found[:12]} vs {expected[:12]}): weights of "
        "another checkpoint (a later one's steps are not in this state) or weights changed after loading"
    )


def refuse_resumed_step(problem: str, steps: int) -> LastIteratePipelineChangedError:
    """The refusal of the first step after load_state_dict on other weights."""
    return LastIteratePipelineChangedError(
        f"{problem} (at the first step after load_state_dict, step {steps + 1}), or a buffer updated by "
        "the forward pass. Load the model and the accountant from the same checkpoint "
        "(PrivacyEngine.load_checkpoint does)."
    )


def refuse_loaded_epsilon(problem: str) -> LastIterateConfigurationError:
    """The refusal of an epsilon read before the first step after load_state_dict, on other weights."""
    return _Error(
        f"{problem}. The epsilon loaded is that of the checkpoint's model. Load the model's weights from "
        "the same checkpoint as the accountant's state (PrivacyEngine.load_checkpoint does)."
    )
