"""The host contract (lastiter_plugins/host.py): an adapter uses the public package and the contract, never
the core's inner modules (STYLE.md, fourth review: one host contract).

A ratchet: the modules below still reach past the contract. The list may only shrink: a new module on it,
or one that no longer needs to be on it, fails the test (remove it from the list then).
"""

from __future__ import annotations

from pathlib import Path

import lastiter_plugins as lp
from tests.support import imported_modules

#: the core's inner modules (the math, the table, the evaluation path, the conversion, the profiles)
INNER = ("evaluation", "registry", "conversion", "profiles", "bounds", "baselines", "lower_end")

#: adapter module -> the inner modules it still imports (to be moved onto the contract); empty: every adapter is on it
NOT_YET: dict[str, set[str]] = {}


def _inner_imports(path: Path) -> set[str]:
    found = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] == "lastiter_plugins" and len(parts) > 1 and parts[1] in INNER:
            found.add(parts[1])
    return found


def test_adapters_use_only_the_public_package_and_the_host_contract():
    adapters = Path(lp.__file__).parent / "adapters"
    found = {p.relative_to(adapters).as_posix(): _inner_imports(p) for p in sorted(adapters.rglob("*.py"))}
    assert len(found) > 20  # the adapters were found
    reaching = {module: inner for module, inner in found.items() if inner}
    assert reaching == NOT_YET
