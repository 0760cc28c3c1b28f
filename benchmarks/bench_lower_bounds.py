r"""How tight (issue 19, requirement 5): best and its lower bound on the anchor settings of
docs/anchor-table.md (n = 60000, b = 1500, z = 3, learning_rate = 1, smoothness = 1,
strong_convexity = 1 - c; Poisson: add-or-remove with z = 1.5), as declared and in two variants
that have exact instances: the same contraction as an l2 term outside the clip (G2) and the
convex case (c = 1, G1). docs/decisions.md, section 20; the table is in docs/tightness.md.

Run: ``.venv/bin/python benchmarks/bench_lower_bounds.py`` (prints a markdown table).
"""

from __future__ import annotations

import time

import lastiter_plugins as lp

DELTA = 1e-5
SAMPLINGS = ("cyclic", "shuffle_once", "reshuffle", "random_batch", "poisson")


def _params(sampling: str, epochs: int, variant: str, c: float = 0.9999) -> dict:
    params = dict(
        dataset_size=60000,
        batch_size=1500,
        noise_multiplier=3.0,
        epochs=epochs,
        learning_rate=1.0,
        smoothness=1.0,
        gradient_norms_within_clip=True,
        sampling=sampling,
    )
    if sampling == "poisson":
        params.update(noise_multiplier=1.5, relation="add_or_remove_one")
    if variant != "convex (c = 1)":
        params["strong_convexity"] = 1.0 - c
    if variant == "l2 outside the clip":
        params["l2_outside_clip"] = True
    return params


def main() -> None:
    print("| declarations | sampling | epochs | best | lower bound | best / lower | seconds | instance or why none |")
    print("|---|---|---|---|---|---|---|---|")
    for variant in ("as declared (c = 0.9999)", "l2 outside the clip", "convex (c = 1)"):
        for sampling in SAMPLINGS:
            for epochs in (50, 100, 200):
                start = time.perf_counter()
                r = lp.epsilon("best", DELTA, lower_bound=True, **_params(sampling, epochs, variant))
                took = time.perf_counter() - start
                low = "None" if r.lower_bound is None else f"{r.lower_bound:.2f}"
                ratio = "-" if r.lower_bound is None else f"{r.epsilon / r.lower_bound:.3f}"
                note = r.lower_bound_note.split(",")[0] if r.lower_bound is not None else r.lower_bound_note[:70]
                print(
                    f"| {variant} | {sampling} | {epochs} | {r.epsilon:.2f} ({r.winner}) | {low} | {ratio} | "
                    f"{took:.1f} | {note} |"
                )


if __name__ == "__main__":
    main()
