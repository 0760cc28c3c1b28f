r"""Timings: epsilon for T in {10^3, 10^5, 10^6, 10^7} for every bound and for
the accountants users already have (Opacus RDP / PRV, dp-accounting RDP / PLD),
noise calibration, and the per-step overhead of the Opacus adapter.

The script ``benchmarks/bench_epsilon.py`` runs everything and writes
``benchmarks/results.json`` and ``benchmarks/results.md``. Times are medians
over repeats (wall clock, ``torch.set_num_threads(1)``); every repeat runs in a
freshly forked process (libraries imported, caches cold), so that a repeat
costs what a first call costs, and is killed after a timeout.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import lastiter_plugins as lp
from lastiter_plugins.bounds import altschuler_talwar, composition, kong_ribero, liang, sgm, ye_shokri

_BOUND_MODULES = (altschuler_talwar, kong_ribero, liang, ye_shokri)

DELTA = 1e-5
STEPS = (10**3, 10**5, 10**6, 10**7)

# one configuration per bound where it applies (n = 60000, b = 600: l = 100, q = 0.01)
_BASE = dict(dataset_size=60_000, batch_size=600, noise_multiplier=1.0, learning_rate=0.1, smoothness=1.0)
_SC = dict(_BASE, strong_convexity=0.05, gradient_norms_within_clip=True, learning_rate=0.5)  # strongly convex
CONFIGS: dict[str, dict[str, Any]] = {
    "kong-ribero-cyclic": dict(_BASE, sampling="cyclic"),
    "kong-ribero-bounded": dict(_BASE, sampling="random_batch", diameter=1.0),
    "kong-ribero-curvature-free": dict(_BASE, sampling="random_batch"),
    "altschuler-talwar": dict(_BASE, sampling="random_batch", diameter=1.0),
    "liang-bounded": dict(_BASE, sampling="poisson", relation="add_or_remove_one", diameter=1.0),
    "liang-unbounded": dict(_BASE, sampling="poisson", relation="add_or_remove_one"),
    "ye-shokri-cyclic": dict(_SC, sampling="cyclic"),
    "ye-shokri-shuffle": dict(_SC, sampling="shuffle_once"),
    "ye-shokri-random": dict(_SC, sampling="random_batch"),
    "ye-shokri-convex": dict(_BASE, sampling="cyclic", gradient_norms_within_clip=True),
    "ye-shokri-full-batch": dict(_SC, dataset_size=600, sampling="cyclic", strong_convexity=0.0),
    "composition (random_batch)": dict(_BASE, sampling="random_batch"),
    "composition (poisson)": dict(_BASE, sampling="poisson", relation="add_or_remove_one"),
    "best (shuffle_once)": dict(_SC, sampling="shuffle_once"),
}  # fmt: skip


def _clear_caches() -> None:
    """Clear every functools cache of the math layer (so a repeat costs what a first call costs)."""
    for module in (composition, sgm, *_BOUND_MODULES):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def _timed_in_child(fn: Callable[[], Any], timeout_s: float) -> tuple[float | None, Any, str | None]:
    """Run ``fn`` once in a forked child (cold caches, killable); (seconds, value, error)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        _clear_caches()
        gc.collect()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                start = time.perf_counter()
                value = fn()
                elapsed = time.perf_counter() - start
            send.send((elapsed, value if isinstance(value, (int, float)) else None, None))
        except Exception as exc:  # a host library may refuse a T: recorded, not hidden
            send.send((None, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"))

    proc = ctx.Process(target=child)
    proc.start()
    if receive.poll(timeout_s):
        result = receive.recv()
        proc.join()
        return result
    proc.kill()
    proc.join()
    return None, None, f"timeout: more than {timeout_s:.0f} s"


def median_time(
    fn: Callable[[], Any], *, repeats: int = 5, budget_s: float = 60.0, timeout_s: float = 180.0
) -> dict[str, Any]:
    """Median wall time of ``fn()`` over up to ``repeats`` runs, each in a fresh
    forked process (so every repeat starts with cold caches), killed after
    ``timeout_s``. Fewer repeats when runs are slow: stop once ``budget_s`` is spent."""
    times, value, error = [], None, None
    for _ in range(repeats):
        elapsed, value, error = _timed_in_child(fn, timeout_s)
        if elapsed is None:
            break
        times.append(elapsed)
        if sum(times) > budget_s:
            break
    out: dict[str, Any] = {"repeats": len(times)}
    if times:
        out["median_s"] = statistics.median(times)
    if error:
        out["error"] = error
    if isinstance(value, (int, float)):
        out["epsilon"] = float(value)
    return out


def _bound_epsilon(bound: str, params: dict[str, Any], steps: int) -> Callable[[], float]:
    name = bound.split(" ")[0]
    return lambda: lp.epsilon(name, DELTA, steps=steps, **params)[0]


def _opacus_rdp(q: float, z: float, steps: int) -> Callable[[], float]:
    def run():
        from opacus.accountants import RDPAccountant

        acc = RDPAccountant()
        acc.history = [(z, q, steps)]
        return acc.get_epsilon(DELTA)

    return run


def _opacus_prv(q: float, z: float, steps: int) -> Callable[[], float]:
    def run():
        from opacus.accountants import PRVAccountant

        acc = PRVAccountant()
        acc.history = [(z, q, steps)]
        return acc.get_epsilon(DELTA)

    return run


def _dpa(kind: str, q: float, z: float, steps: int) -> Callable[[], float]:
    def run():
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
        )
        acc = rdp_privacy_accountant.RdpAccountant() if kind == "rdp" else pld_privacy_accountant.PLDAccountant()
        acc.compose(event)
        return acc.get_epsilon(DELTA)

    return run


def epsilon_timings(
    steps=STEPS, repeats: int = 5, progress: Callable[[str], None] | None = None, skip_after_s: float = 30.0
) -> list[dict]:
    """One row per (accountant, T): median time of one epsilon and its value. An
    accountant whose previous (smaller) T took more than ``skip_after_s`` is not
    run at the larger T (recorded as skipped)."""
    # imported before forking, so that no timing includes an import
    import opacus.accountants  # noqa: F401
    from dp_accounting.pld import pld_privacy_accountant  # noqa: F401
    from dp_accounting.rdp import rdp_privacy_accountant  # noqa: F401

    rows = []
    q, z = 0.01, 1.0
    jobs: list[tuple[str, str, int, Callable[[], float]]] = []
    for t in steps:
        for bound, params in CONFIGS.items():
            jobs.append((bound, "lastiter", t, _bound_epsilon(bound, params, t)))
        jobs.append(("Opacus RDPAccountant", "host", t, _opacus_rdp(q, z, t)))
        jobs.append(("Opacus PRVAccountant", "host", t, _opacus_prv(q, z, t)))
        jobs.append(("dp-accounting RdpAccountant", "host", t, _dpa("rdp", q, z, t)))
        jobs.append(("dp-accounting PLDAccountant", "host", t, _dpa("pld", q, z, t)))
    previous: dict[str, float] = {}
    for name, kind, t, fn in jobs:
        if previous.get(name, 0.0) > skip_after_s:
            row = {"accountant": name, "kind": kind, "steps": t, "repeats": 0,
                   "error": f"skipped: the previous T took {previous[name]:.0f} s" if math.isfinite(previous[name])
                   else "skipped: the previous T timed out"}  # fmt: skip
            rows.append(row)
            continue
        row = {"accountant": name, "kind": kind, "steps": t, **median_time(fn, repeats=repeats)}
        previous[name] = row.get("median_s", math.inf)
        rows.append(row)
        if progress:
            progress(f"{name} T={t}: {row.get('median_s', float('nan')):.4g} s {row.get('error', '')}")
    return rows


def calibration_timings(repeats: int = 3) -> list[dict]:
    """Median time of calibrate_noise to epsilon = 1 at delta = 1e-5, T = 10^4."""
    rows = []
    for bound in ("ye-shokri-shuffle", "kong-ribero-cyclic", "altschuler-talwar", "composition (random_batch)",
                  "best (shuffle_once)"):  # fmt: skip
        params = {k: v for k, v in CONFIGS[bound].items() if k != "noise_multiplier"}
        name = bound.split(" ")[0]
        timing = median_time(lambda n=name, p=params: lp.calibrate_noise(n, 1.0, DELTA, steps=10**4, **p),
                             repeats=repeats)  # fmt: skip
        rows.append({"bound": bound, "steps": 10**4, "target_epsilon": 1.0, **timing})
    return rows


def opacus_step_overhead(steps: int = 300, repeats: int = 3, batch_size: int = 32, hidden: int = 0) -> dict[str, Any]:
    """Per-step time of an Opacus training loop (logistic regression on sklearn's
    breast-cancer data, plain SGD, the same shuffle-once loader for both) with the
    last-iterate accountant vs Opacus' RDP accountant; ratio of medians.

    With ``hidden = 0`` the model is a logistic regression: the accountant's
    per-step cost is a fixed overhead, so this is the worst case for the ratio;
    ``hidden > 0`` uses a two-hidden-layer MLP of that width instead.
    """
    import numpy as np
    import torch
    from opacus import PrivacyEngine
    from sklearn.datasets import load_breast_cancer
    from torch.utils.data import DataLoader, TensorDataset

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    torch.set_num_threads(1)
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    n, lr = len(data), 0.1
    name = lastiter_opacus.register(
        "bench-last-iterate", bound="best", sampling="shuffle_once", dataset_size=n, learning_rate=lr,
        smoothness=0.25, force=True,
    )  # fmt: skip

    def loop(accountant: str) -> list[float]:
        torch.manual_seed(0)
        if hidden:
            model = torch.nn.Sequential(
                torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                torch.nn.ReLU(), torch.nn.Linear(hidden, 1),
            )  # fmt: skip
        else:
            model = torch.nn.Linear(x.shape[1], 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        # the same shuffle-once loader for both, so that only the accountant differs
        loader = DataLoader(data, batch_size=batch_size, sampler=lastiter_opacus.ShuffleOnceSampler(data, seed=0))
        poisson = False
        engine = PrivacyEngine(accountant=accountant)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                poisson_sampling=poisson,
            )  # fmt: skip
        hook, hook_times = optimizer.step_hook, []

        def timed_hook(opt):
            start = time.perf_counter()
            hook(opt)
            hook_times.append(time.perf_counter() - start)

        optimizer.step_hook = timed_hook  # measure the accountant's own per-step work
        loss_fn = torch.nn.BCEWithLogitsLoss()
        times, done = [], 0
        warnings.simplefilter("ignore")  # torch's backward-hook notices, once per step
        while done < steps:
            for xb, yb in loader:
                if len(xb) == 0:
                    continue
                start = time.perf_counter()
                optimizer.zero_grad()
                loss_fn(model(xb).squeeze(-1), yb).backward()
                optimizer.step()
                times.append(time.perf_counter() - start)
                done += 1
                if done >= steps:
                    break
        return times, hook_times

    medians: dict[str, list[float]] = {"rdp": [], name: []}
    hooks: dict[str, list[float]] = {"rdp": [], name: []}
    for _ in range(repeats):
        for acc in ("rdp", name):
            with warnings.catch_warnings():
                step_times, hook_times = loop(acc)
            medians[acc].append(float(np.median(step_times)))
            hooks[acc].append(float(np.median(hook_times)))
    rdp_s, ours_s = statistics.median(medians["rdp"]), statistics.median(medians[name])
    hook_rdp, hook_ours = statistics.median(hooks["rdp"]), statistics.median(hooks[name])
    return {
        "steps_per_run": steps,
        "repeats": repeats,
        "batch_size": batch_size,
        "model": f"MLP 30-{hidden}-{hidden}-1" if hidden else "logistic regression (31 parameters)",
        "median_step_s_opacus_rdp": rdp_s,
        "median_step_s_last_iterate": ours_s,
        "ratio": ours_s / rdp_s,
        "median_hook_s_opacus_rdp": hook_rdp,
        "median_hook_s_last_iterate": hook_ours,
        "hook_ratio_estimate": (rdp_s - hook_rdp + hook_ours) / rdp_s,
        "note": "Both loops use the same shuffle-once loader (poisson_sampling=False) and model, so only the "
        "accountant differs. The machine is shared: ratios within ~1-2% are noise.",
    }


def to_markdown(results: dict[str, Any], command: str) -> str:
    """The tables of docs (medians; ratios to Opacus' RDP accountant at the same T)."""
    lines = [
        "# Benchmarks",
        "",
        f"Regenerate: `{command}` ({results.get('machine', '')}; {results.get('seconds', 0):.0f} s).",
        "Medians over repeats (column `rep`), each repeat in a freshly forked process (libraries imported, caches "
        "cold), killed after 180 s. q = 0.01, z = 1, delta = 1e-5; the bounds' configurations are in "
        "`lastiter_plugins/verification/benchmark.py` (CONFIGS).",
        "The `x Opacus RDP` column is the time ratio to Opacus' RDPAccountant at the same T.",
        "",
        "## Time of one epsilon",
        "",
        "| accountant | T | median time (s) | x Opacus RDP | rep | epsilon |",
        "|---|---|---|---|---|---|",
    ]
    ref = {r["steps"]: r.get("median_s") for r in results["epsilon"] if r["accountant"] == "Opacus RDPAccountant"}
    for r in results["epsilon"]:
        t = r.get("median_s")
        ratio = f"{t / ref[r['steps']]:.3g}" if t is not None and ref.get(r["steps"]) else "-"
        eps = f"{r['epsilon']:.4g}" if "epsilon" in r and math.isfinite(r["epsilon"]) else r.get("error", "-")
        time_s = f"{t:.3g}" if t is not None else "-"
        lines.append(f"| {r['accountant']} | {r['steps']:.0e} | {time_s} | {ratio} | {r['repeats']} | {eps} |")
    lines += ["", "## Noise calibration (target epsilon 1, delta 1e-5, T = 10^4)", "",
              "| bound | median time (s) | rep | noise multiplier |", "|---|---|---|---|"]  # fmt: skip
    for r in results["calibration"]:
        z = f"{r['epsilon']:.5g}" if "epsilon" in r else r.get("error", "-")
        lines.append(f"| {r['bound']} | {r.get('median_s', float('nan')):.3g} | {r['repeats']} | {z} |")
    lines += ["", "## Per-step overhead in an Opacus training loop", ""]
    runs = results.get("opacus_overhead") or []
    if isinstance(runs, dict):
        runs = [runs]
    measured = [r for r in runs if "ratio" in r]
    if measured:
        lines += ["| model | batch | step, Opacus RDP (ms) | step, last-iterate (ms) | ratio of step times | "
                  "hook, Opacus RDP (us) | hook, last-iterate (us) | ratio from hook times |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in measured:
            lines.append(
                f"| {r['model']} | {r['batch_size']} | {r['median_step_s_opacus_rdp'] * 1e3:.3f} | "
                f"{r['median_step_s_last_iterate'] * 1e3:.3f} | **{r['ratio']:.3f}** | "
                f"{r['median_hook_s_opacus_rdp'] * 1e6:.1f} | {r['median_hook_s_last_iterate'] * 1e6:.1f} | "
                f"**{r['hook_ratio_estimate']:.4f}** |"
            )
        lines += ["", "The hook columns time the accountant's own work inside `optimizer.step()` (the "
                  "`step_hook` Opacus calls); `ratio from hook times` = (Opacus-RDP step - its hook + our hook) / "
                  "Opacus-RDP step, which is insensitive to the load of the shared machine."]  # fmt: skip
        lines += ["", f"Goal: ratio <= 1.01. {measured[0]['steps_per_run']} steps x {measured[0]['repeats']} runs "
                  f"per accountant, alternating. {measured[0]['note']}"]  # fmt: skip
    for r in runs:
        if "error" in r:
            lines.append(f"Not measured: {r['error']}.")
    return "\n".join(lines) + "\n"
