"""Every number, before and after a refactoring: each row's epsilon, ``best`` and its lower end, on fixed settings.

The settings: the built-in scenario and those of examples/scenarios/; the anchor settings of
docs/anchor-table.md (c = 0.9999 and 0.9998; E = 50, 100, 200; five samplings, and Poisson under
add-or-remove); the GLM route's settings (E = 20, 80, 200, both relations); the how-tight settings of
bench_lower_bounds.py; issue 40's convex random-batch and Poisson settings (delta = 1e-6). 97 settings, every row
of the table at delta = 1e-5 unless a setting names its delta.
Every setting states its neighbouring relation (a scenario file without one gets replace_one, the default of
0.2.0, where the records were first taken), so that a change of a default never changes a setting: records
taken before and after compare like with like.

    python benchmarks/row_snapshot.py take OUT.json        # every number, as repr (a few minutes)
    python benchmarks/row_snapshot.py compare A.json B.json  # the settings that differ; exit 1 if any

A refactoring that must not change a number passes ``compare`` with repr equality (issue 32).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def settings() -> dict[str, dict]:
    import bench_lower_bounds as blb

    from lastiter_plugins import scenarios

    out: dict[str, dict] = {"builtin": dict(scenarios.BUILTIN_SCENARIO)}
    for path in sorted((ROOT / "examples" / "scenarios").glob("*.toml")):
        out["scenario:" + path.stem] = scenarios.load_scenario(path)
    for scenario in out.values():
        scenario.setdefault("relation", "replace_one")
    for c in (0.9999, 0.9998):
        for e in (50, 100, 200):
            common = dict(
                dataset_size=60000, batch_size=1500, noise_multiplier=3.0, epochs=e, learning_rate=1.0,
                strong_convexity=1 - c, smoothness=1.0, gradient_norms_within_clip=True, delta=1e-5,
                relation="replace_one",
            )  # fmt: skip
            for s in blb.SAMPLINGS:
                out[f"anchor:{c}:{e}:{s}"] = dict(common, sampling=s)
            out[f"anchor:{c}:{e}:poisson-ar"] = dict(
                common, sampling="poisson", noise_multiplier=1.5, relation="add_or_remove_one"
            )
    for e in (20, 80, 200):
        glm = dict(
            dataset_size=450, batch_size=45, noise_multiplier=3.2, epochs=e, sampling="poisson",
            relation="add_or_remove_one", learning_rate=1 / 0.26, smoothness=0.26, strong_convexity=0.01,
            clipped_loss_convex_smooth=True, l2_outside_clip=True, delta=1e-5,
        )  # fmt: skip
        out[f"glm:{e}"] = glm
        out[f"glm:{e}:r1"] = dict(glm, relation="replace_one")
    convex = dict(
        dataset_size=50000, batch_size=500, noise_multiplier=0.8, steps=1000, learning_rate=1.0, smoothness=1.0,
        gradient_norms_within_clip=True, delta=1e-6,
    )  # fmt: skip
    out["issue40:convex-random-batch"] = dict(convex, sampling="random_batch", relation="replace_one")
    out["issue40:convex-poisson"] = dict(convex, sampling="poisson", relation="add_or_remove_one")
    out["issue40:convex-poisson-r1"] = dict(convex, sampling="poisson", relation="replace_one")
    for variant in ("as declared (c = 0.9999)", "l2 outside the clip", "convex (c = 1)"):
        for s in blb.SAMPLINGS:
            for e in (50, 100, 200):
                out[f"howtight:{variant}:{s}:{e}"] = {
                    "relation": "replace_one",
                    **blb._params(s, e, variant),
                    "delta": 1e-5,
                }
    return out


def take(path: str) -> None:
    import lastiter_plugins as lp
    from lastiter_plugins import evaluation

    out = {}
    for name, params in settings().items():
        params = {k: v for k, v in params.items() if k not in ("name", "description")}
        delta = params.pop("delta", 1e-5)
        cfg, a = lp.build(**params)
        rows = {
            bid: None if ev.result is None else repr(ev.result.epsilon)
            for bid, ev in evaluation.evaluate_all(cfg, a, delta).items()
        }
        try:
            r = lp.epsilon("best", delta, lower_bound=True, **params)
            best = [repr(r.epsilon), r.winner, None if r.lower_bound is None else repr(r.lower_bound)]
        except ValueError as err:
            best = ["refused", type(err).__name__, str(err)[:200]]
        out[name] = {"best": best, "rows": rows}
        print(name, *best, file=sys.stderr)
    pathlib.Path(path).write_text(json.dumps(out, indent=1, sort_keys=True))


def compare(before: str, after: str) -> int:
    a, b = (json.loads(pathlib.Path(p).read_text()) for p in (before, after))
    values = sum(len(v["rows"]) + 1 for v in a.values())
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    print(f"{len(a)} settings ({values} values: every row and best) before, {len(b)} after, {len(differ)} differ")
    for k in differ:
        print(f"  {k}\n    before {a.get(k)}\n    after  {b.get(k)}")
    return 1 if differ else 0


def main() -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("take").add_argument("out")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args()
    if args.command == "take":
        take(args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
