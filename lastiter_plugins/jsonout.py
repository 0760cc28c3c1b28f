r"""Strict JSON for the CLI and the comparison: never NaN or Infinity (non-finite numbers become null)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, tuples and arrays as lists."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_safe(v) for v in value]
    return value


def dump_json(obj: Any) -> str:
    """Indented JSON that every strict parser accepts."""
    return json.dumps(json_safe(obj), allow_nan=False, indent=2)
