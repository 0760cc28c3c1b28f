"""Benchmarks of the last-iterate accountants against the anchors.

    python benchmarks/bench_epsilon.py                 # everything (~ minutes)
    python benchmarks/bench_epsilon.py --quick         # T in {1e3, 1e5} only, 3 repeats, short Opacus loop

Writes benchmarks/results.json and benchmarks/results.md (medians over repeats;
see lastiter_plugins/verification/benchmark.py for what is timed and how).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from lastiter_plugins.verification import benchmark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="T in {1e3, 1e5}, fewer repeats")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="output folder")
    parser.add_argument("--skip-opacus-loop", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    steps = (10**3, 10**5) if args.quick else benchmark.STEPS
    repeats = 3 if args.quick else 5

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "epsilon": benchmark.epsilon_timings(steps, repeats=repeats, progress=log),
        "calibration": benchmark.calibration_timings(repeats=3),
    }
    if args.skip_opacus_loop:
        results["opacus_overhead"] = [{"error": "skipped (--skip-opacus-loop)"}]
    else:
        results["opacus_overhead"] = []
        for hidden in (0, 256):
            try:
                results["opacus_overhead"].append(
                    benchmark.opacus_step_overhead(steps=100 if args.quick else 300, hidden=hidden)
                )
            except Exception as exc:
                results["opacus_overhead"].append({"error": f"{type(exc).__name__}: {exc}"})
    results["seconds"] = time.perf_counter() - start
    command = "python benchmarks/bench_epsilon.py" + (" --quick" if args.quick else "")
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(benchmark.to_markdown(results, command))
    print(benchmark.to_markdown(results, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
