"""Speed of one epsilon at T = 10^6 steps, every bound and ``best``, next to Opacus.

For each pipeline (cyclic, shuffle once, reshuffle, random batch: the issues' targets; also
full batch and Poisson), every bound that applies (the unproven one by name) and
``best``: the median time of ``lp.epsilon(bound, 1e-5, ...)`` on the default
order grid, "cold" (the library's caches cleared before each call: what the first
call in a process costs) and "warm" (repeated calls), next to Opacus'
``RDPAccountant.get_epsilon`` for the same T measured in the same run, right
before each pipeline (q = b/n = 0.01, z = 1; the ratio uses the cold time).

Targets (issues "Core v2" and "f-DP"): each f-DP bound < 5 ms at T = 10^6 (issue "schedule
mixtures": each new bound <= 50 ms);
``best`` no slower than Opacus' RDP accountant on cyclic and shuffle-once pipelines.

Ratios to the host accountants (issue 19, requirement 3; the ``core_ratios`` section), at
T = 10^4 and 10^6, each side timed cold (the library's caches cleared; the host's objects
built anew) in the same process, the two sides' calls alternating (a drift of the VM's speed
reaches both), after one untimed call of each:

* ``best`` / Opacus' ``RDPAccountant.get_epsilon`` where best needs no PLD row (random batch
  and shuffle once; goal <= 1);
* ``best`` / dp-accounting's ``PLDAccountant`` on ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
  composed T times, ``get_epsilon``, where a PLD row is evaluated (Poisson, add-or-remove and
  replace-one where the installed dp-accounting composes it: 0.4.3 does not, the row says so;
  goal <= 1);
* ``calibrate_noise("best", 1.0, 1e-5)`` / Opacus' ``get_noise_multiplier`` with the matching
  accountant: RDP where best needs no PLD row, PRV where it does (PRV at T = 10^4 only: at
  10^6 one call takes minutes; goal <= 2);
* the new membership rows alone (shifted-interpolation-random-batch, -poisson) at T = 10^6,
  cold (goal <= 50 ms each).

    python benchmarks/bench_core_speed.py [--repeats 9] [--only speed|ratios]

Writes the ``core_speed`` and ``core_ratios`` sections of benchmarks/results.json and
re-renders benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _common import DELTA, clear_caches, in_process_median, opacus_rdp_epsilon, update_results

import lastiter_plugins as lp

T = 10**6
COMMON = dict(
    dataset_size=60_000,
    batch_size=600,
    noise_multiplier=1.0,
    learning_rate=0.5,
    steps=T,
    smoothness=1.0,
    strong_convexity=0.05,
    gradient_norms_within_clip=True,
    diameter=1.0,
)
PIPELINES = {
    "cyclic": dict(sampling="cyclic"),
    "shuffle_once": dict(sampling="shuffle_once"),
    "reshuffle": dict(sampling="reshuffle"),
    "random_batch": dict(sampling="random_batch"),
    "full batch (b = n)": dict(sampling="cyclic", batch_size=60_000),
    "poisson (add/remove)": dict(sampling="poisson", relation="add_or_remove_one", learning_rate=0.005),
}


def rows(repeats: int, log=print) -> list[dict]:
    from opacus.accountants import RDPAccountant  # noqa: F401  (imported before any timing)

    out = []
    for pipeline, changes in PIPELINES.items():
        params = {**COMMON, **changes}
        config, _ = lp.build(**params)
        opacus = opacus_rdp_epsilon(config.sampling_probability, config.noise_multiplier, T)
        opacus_s = in_process_median(opacus, repeats, cold=False)
        out.append({"pipeline": pipeline, "bound": "Opacus RDPAccountant", "kind": "rdp", "proof": "-",
                    "cold_ms": opacus_s * 1e3, "warm_ms": opacus_s * 1e3, "x_opacus": 1.0, "epsilon": opacus(),
                    "relation": "add_or_remove_one (Poisson)"})  # fmt: skip
        log(f"{pipeline}: Opacus RDPAccountant {opacus_s * 1e3:.2f} ms")
        applicable = [bid for bid, app in lp.applicable_bounds(**params).items() if app.applies]
        for bid in applicable:
            result = lp.epsilon(bid, DELTA, **params)
            cold = in_process_median(lambda b=bid, p=params: lp.epsilon(b, DELTA, **p), repeats, cold=True)
            warm = in_process_median(lambda b=bid, p=params: lp.epsilon(b, DELTA, **p), repeats, cold=False)
            spec = lp.BOUNDS.get(bid)
            out.append({
                "pipeline": pipeline, "bound": bid, "kind": spec.kind.value if spec else "best",
                "proof": str(result.proof), "cold_ms": cold * 1e3, "warm_ms": warm * 1e3,
                "x_opacus": cold / opacus_s, "epsilon": result.epsilon, "winner": result.winner,
                "relation": result.relation.value,
            })  # fmt: skip
            log(f"  {bid:34s} cold {cold * 1e3:8.2f} ms  warm {warm * 1e3:8.2f} ms  x{cold / opacus_s:6.3f}"
                f"  eps {result.epsilon:.4g}{' via ' + result.winner if bid == 'best' else ''}")  # fmt: skip
    return out


# ------------------------------------------------------------------ ratios to the host accountants

RATIO_STEPS = (10**4, 10**6)
#: (pipeline, changes to COMMON, host accountant of the epsilon, host accountant of the calibration)
RATIO_CASES = (
    ("random_batch", dict(sampling="random_batch"), "opacus-rdp", "rdp"),
    ("shuffle_once", dict(sampling="shuffle_once"), "opacus-rdp", "rdp"),
    ("cyclic", dict(sampling="cyclic"), "opacus-rdp", "rdp"),
    ("reshuffle", dict(sampling="reshuffle"), "opacus-rdp", "rdp"),
    ("full batch (b = n)", dict(sampling="cyclic", batch_size=60_000), "opacus-rdp", "rdp"),
    ("poisson (add/remove)", dict(sampling="poisson", relation="add_or_remove_one", learning_rate=0.005), "dpa-pld",
     "prv"),
    ("poisson (replace-one)", dict(sampling="poisson", relation="replace_one", learning_rate=0.005), "dpa-pld", "prv"),
)  # fmt: skip
NEW_ROWS = {
    "shifted-interpolation-random-batch": dict(sampling="random_batch"),
    "shifted-interpolation-poisson": dict(sampling="poisson", relation="add_or_remove_one", learning_rate=0.005),
}
PRV_MAX_STEPS = 10**4


def _dpa_pld(q: float, z: float, steps: int, replace_one: bool):
    def run():
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant

        relation = dp_accounting.NeighboringRelation
        acc = pld_privacy_accountant.PLDAccountant(relation.REPLACE_ONE if replace_one else relation.ADD_OR_REMOVE_ONE)
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        if not acc.supports(event):
            raise NotImplementedError("the installed dp-accounting's PLDAccountant does not compose this event")
        acc.compose(event, steps)
        return acc.get_epsilon(DELTA)

    return run


def _opacus_calibration(q: float, steps: int, accountant: str):
    def run():
        from opacus.accountants.utils import get_noise_multiplier

        return get_noise_multiplier(target_epsilon=1.0, target_delta=DELTA, sample_rate=q, steps=steps,
                                    accountant=accountant)  # fmt: skip

    return run


def _cold_medians(*fns, repeats: int, budget_s: float = 40.0) -> list[tuple[float | None, object, str | None]]:
    """Median of up to ``repeats`` cold calls of each function (the library's caches cleared before each), the
    functions' calls alternating so that a drift of the machine's speed reaches all of them, after one untimed
    call of each (one-time initialisations of the host libraries and numpy); fewer repeats once ``budget_s`` is
    spent. One (seconds, value, error) per function; a function that raises is recorded, not hidden."""
    values: list[object] = [None] * len(fns)
    errors: list[str | None] = [None] * len(fns)
    times: list[list[float]] = [[] for _ in fns]
    for i, fn in enumerate(fns):
        try:
            clear_caches()
            values[i] = fn()
        except Exception as exc:
            errors[i] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            if errors[i] is None:
                clear_caches()
                start = time.perf_counter()
                fn()
                times[i].append(time.perf_counter() - start)
        if sum(map(sum, times)) > budget_s:
            break
    return [(statistics.median(t) if t else None, v, e) for t, v, e in zip(times, values, errors, strict=True)]


def ratio_rows(repeats: int, log=print) -> list[dict]:
    import opacus.accountants.utils  # noqa: F401  (imported before any timing)
    from dp_accounting.pld import pld_privacy_accountant  # noqa: F401

    out = []

    def pair(task: str, pipeline: str, steps: int, ours, host, host_name: str, goal: float, note: str = "") -> None:
        (ours_s, ours_v, ours_err), (host_s, host_v, host_err) = _cold_medians(ours, host, repeats=repeats)
        ratio = ours_s / host_s if ours_s is not None and host_s is not None else None
        out.append({"task": task, "pipeline": pipeline, "steps": steps, "host": host_name, "ours_ms": _ms(ours_s),
                    "host_ms": _ms(host_s), "ratio": ratio, "goal": goal, "ours_value": _num(ours_v),
                    "host_value": _num(host_v), "error": ours_err or host_err, "note": note})  # fmt: skip
        log(f"{task:11s} {pipeline:22s} T={steps:<8d} ours {_ms(ours_s) or float('nan'):9.2f} ms  {host_name} "
            f"{_ms(host_s) or float('nan'):9.2f} ms  x{ratio or float('nan'):.3f}  {ours_v} vs {host_v}"
            f"{'  ' + (ours_err or host_err) if (ours_err or host_err) else ''}")  # fmt: skip

    for pipeline, changes, host, calibration_host in RATIO_CASES:
        for steps in RATIO_STEPS:
            params = {**COMMON, **changes, "steps": steps}
            config, _ = lp.build(**params)
            q, z = config.sampling_probability, config.noise_multiplier
            best = lambda p=params: lp.epsilon("best", DELTA, **p)  # noqa: E731
            if host == "opacus-rdp":
                pair("epsilon", pipeline, steps, lambda b=best: b().epsilon, opacus_rdp_epsilon(q, z, steps),
                     "Opacus RDPAccountant", 1.0)  # fmt: skip
            else:
                replace_one = params["relation"] == "replace_one"
                pair("epsilon", pipeline, steps, lambda b=best: b().epsilon, _dpa_pld(q, z, steps, replace_one),
                     "dp-accounting PLDAccountant", 1.0)  # fmt: skip
            calib = {k: v for k, v in params.items() if k != "noise_multiplier"}
            if calibration_host == "prv" and steps > PRV_MAX_STEPS:
                continue  # one PRV calibration at T = 1e6 takes minutes: measured at T = 1e4 only
            calibrated = lambda p=calib: lp.calibrate_noise("best", 1.0, DELTA, **p).noise_multiplier  # noqa: E731
            pair("calibration", pipeline, steps, calibrated,
                 _opacus_calibration(q, steps, calibration_host), f"Opacus get_noise_multiplier ({calibration_host})",
                 2.0)  # fmt: skip
    for bound, changes in NEW_ROWS.items():
        params = {**COMMON, **changes}
        [(s, value, err)] = _cold_medians(lambda b=bound, p=params: lp.epsilon(b, DELTA, **p).epsilon, repeats=repeats)
        out.append({"task": "new row", "pipeline": bound, "steps": T, "host": "-", "ours_ms": _ms(s), "host_ms": None,
                    "ratio": None, "goal_ms": 50.0, "ours_value": _num(value), "error": err})  # fmt: skip
        log(f"new row     {bound:36s} T={T} cold {_ms(s) or float('nan'):9.2f} ms  eps {value}")
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", choices=("speed", "ratios"), help="one section (default: both)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    command = "python benchmarks/bench_core_speed.py" + (f" --repeats {args.repeats}" if args.repeats != 9 else "")
    if args.only != "ratios":
        start = time.perf_counter()
        data = rows(args.repeats)
        update_results("core_speed", data, command=command + (" --only speed" if args.only else ""),
                       seconds=time.perf_counter() - start, steps=T, repeats=args.repeats, delta=DELTA)  # fmt: skip
    if args.only != "speed":
        start = time.perf_counter()
        data = ratio_rows(args.repeats)
        update_results("core_ratios", data, command=command + (" --only ratios" if args.only else ""),
                       seconds=time.perf_counter() - start, repeats=args.repeats, delta=DELTA)  # fmt: skip


if __name__ == "__main__":
    main()
