"""Checkpoints of the Opacus accountant: what its state holds, what a loaded state must match, and
the check of the model resumed with it (its weights are those the state was saved with)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError, LastIteratePipelineChangedError
from lastiter_plugins.adapters.opacus._record import Observed
from lastiter_plugins.host import Departure

_Error = LastIterateConfigurationError
#: 4: the departures (a resumed run keeps the rows that left); states of format 3 have none
FORMAT = 4


def digest(tensors: Any) -> str:
    """SHA-256 of the tensors' dtypes, shapes and bytes, in order (what a checkpoint's weights must match)."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def steps_in(history: list) -> int:
    """Steps of an Opacus-format history (one entry while the configuration stays constant)."""
    return int(history[0][2]) if len(history) == 1 else int(sum(entry[2] for entry in history))


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A state read by :func:`read`: what the accountant continues from."""

    history: list
    observed: Observed | None
    model_digest: str | None  # the model after the state's steps (None without steps)
    void: str | None
    record: dict | None  # the derivation's index record (absent from states of earlier versions)
    departures: tuple[Departure, ...] = ()


def write(history: list, reg: Registration, observed: Observed | None, model_digest: str | None,
          void: str | None, record: dict | None, departures: tuple[Departure, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """The accountant's own key of a state (``"lastiter"``)."""
    return {
        "format": FORMAT,
        "registration": reg.to_dict(),
        "observed": None if observed is None else observed.to_dict(),
        "model_digest": model_digest if history else None,
        "void": void,
        "record": record,
        "departures": [
            {"step": d.step, "fact": d.fact, "changes": {k: getattr(v, "value", v) for k, v in d.changes.items()}}
            for d in departures
        ],
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
        departures=tuple(Departure(int(d["step"]), str(d["fact"]), d["changes"]) for d in extra.get("departures", ())),
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


def check_permutation(reg: Registration, saved: Observed, facts: Any) -> None:
    """A resumed shuffle-once run uses the checkpoint's permutation (``facts``: the loader bound now)."""
    from lastiter_plugins.adapters.opacus._checks import check_permutation as same_permutation

    same_permutation(reg.sampling, saved.permutation_digest, facts.permutation_digest)


def check_loaded_model(accountant: Any) -> None:
    """Before the first step after load_state_dict, an epsilon is about the checkpoint's model only."""
    expected, run = accountant.resume_digest, accountant.run
    if expected is None or run is None:
        return
    problem = model_differs(run.model_tensors(), expected, accountant.steps)
    if problem is not None:
        raise refuse_loaded_epsilon(problem)


def save(accountant: Any, destination: Any) -> Any:
    """``accountant.state_dict()``: Opacus' two keys (as Opacus 1.6 writes them; 1.5's IAccountant stores the
    mechanism method) and the accountant's own."""
    run = accountant.run
    if accountant.void is None and run is not None and accountant.history and accountant.resume_digest is None:
        try:  # a model written since the last step is not the accounted run's: the state says so
            run.at_release(accountant.steps)
        except LastIteratePipelineChangedError as exc:
            accountant.void = str(exc)
    model_digest = accountant.resume_digest
    if model_digest is None and run is not None:
        model_digest = run.model_digest()
    destination["history"] = [tuple(entry) for entry in accountant.history]
    destination["mechanism"] = accountant.mechanism()
    record = run.derivation.state() if run is not None else accountant.saved_record
    destination["lastiter"] = write(
        accountant.history, accountant.registration, accountant.observed, model_digest, accountant.void, record,
        tuple(accountant.departures),
    )  # fmt: skip
    return destination


def load(accountant: Any, state_dict: Any) -> None:
    """``accountant.load_state_dict``: validate the state against the registration and continue from it."""
    if accountant.glm is not None:
        accountant.glm.before_load()
    loaded = read(state_dict, accountant.registration)
    run = accountant.run
    if loaded.observed is not None and loaded.history and run is not None:
        check_permutation(accountant.registration, loaded.observed, run.facts)
    accountant.history = [tuple(entry) for entry in loaded.history]  # what IAccountant.load_state_dict sets
    accountant.observed, accountant.departures, accountant.void = loaded.observed, list(loaded.departures), loaded.void
    accountant.resumed = bool(loaded.history)
    accountant.saved_record, accountant.resume_digest = loaded.record, loaded.model_digest
    if run is not None and loaded.record is not None:
        run.derivation.restore(loaded.record)
