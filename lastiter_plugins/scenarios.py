r"""Scenario files: a pipeline and a delta in TOML (``--config FILE`` on every subcommand).

A scenario holds the keyword-API parameters (:class:`lastiter_plugins.api.Parameters`),
``delta``, and the texts ``name`` and ``description``; examples/scenarios/ has six.
:data:`BUILTIN_SCENARIO` is what ``lastiter compare`` runs when given no parameters.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lastiter_plugins import api
from lastiter_plugins.defaults import DEFAULT_DELTA
from lastiter_plugins.validation import validate_delta

#: What a scenario given by flags alone must set (with ``steps`` or ``epochs``).
REQUIRED_KEYS = ("dataset_size", "batch_size", "noise_multiplier", "sampling")
_TEXT_KEYS = ("name", "description")

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
        known = ", ".join((*api.PARAMETERS, "delta", *_TEXT_KEYS))
        raise ValueError(f"unknown scenario key {unknown[0]!r}; known keys: {known}.")
    return name, params, delta


def load_scenario(path: str | Path) -> dict[str, Any]:
    """The content of a TOML scenario file (keys: keyword-API params, delta, name, description).

    Raises:
      ValueError: the file is missing, unreadable, not UTF-8 or not valid TOML.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
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
