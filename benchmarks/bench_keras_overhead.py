"""CPU time per step of Keras' ``model.fit`` with ``LastIterateCallback``, against fit without it.

Issue 29 ("Adapters v4"), item 7: on the Keras 2-conv CNN (two ``Conv2D(32, 3x3)`` with ReLU, a
``Dense(10)``, 28x28x1 inputs, 193,898 weights; TF Privacy's ``VectorizedDPKerasSGDOptimizer``) at
batch 32, fit with the callback (``sampling="reshuffle"``, ``bound="best"``) must cost no more than fit
without it within the A/A spread + 2%.

Three pipelines, identical but for the callback (same generated data, initial weights, optimizer,
``fit(shuffle=True)``):

* A: no callback;
* B: ``LastIterateCallback``;
* A': no callback again (the A/A control).

Keras cannot interleave two models' steps inside ``fit``, so a block is one fresh ``fit`` per pipeline:
``--epochs`` epochs of ``--steps`` steps, the first (tracing) left out, every later epoch timed whole from
one epoch's end to the next (B's epoch hooks, the check of the epoch's per-step rows and the epsilon
written to the logs, are inside its block). Times are the process' CPU time (``time.process_time``: other
processes' load on a shared machine does not inflate it; one TensorFlow thread). Each round runs one
block of each pipeline, the order of the three rotated through all six permutations; per round,
``ratio`` = B / A and ``control`` = A' / A. Reported: their medians over the rounds (at least 7) with
their range [min, max]; the target is met when the median ratio is at most the control's upper end +
0.02. Also reported: the callback's own host work per epoch (its epoch hooks, timed by a subclass). An
epoch of 10 steps charges the epoch hooks to few steps; a real epoch (n / b steps) spreads them thinner.

    python benchmarks/bench_keras_overhead.py [--rounds 9] [--steps 10] [--epochs 3] [--model cnn]
        [--optimizer sgd] [--quick]

``--optimizer adam``: the same pipelines with TF Privacy's ``DPKerasAdamOptimizer`` (issue 37: the callback
then keeps the every-iterate rows; its checks and the per-step record are the same); ``sgd`` (the default):
``VectorizedDPKerasSGDOptimizer``.

``--model logistic`` / ``glm``: the same on a 31-weight logistic regression (batch 32) / the certified
GLM route on 512-dimensional embeddings (batch 64): the callback's fixed cost against a millisecond
step, no target. ``--quick``: 3 rounds of 2 steps, nothing written. Needs the ``tf`` extra; the CNN
takes about 4 minutes on 2 shared cores. Writes the ``keras_overhead`` section of
benchmarks/results.json (one row per model, the last run of each kept) and re-renders
benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from _common import HERE, update_results

LR = 0.1
DELTA = 1e-5
SLACK = 0.02


@dataclasses.dataclass(frozen=True)
class Case:
    """One model of the benchmark: how to build it, its data and the callback's arguments."""

    name: str
    batch_size: int
    build: Callable[[], Any]  # a compiled model (fresh weights, same seed)
    data: Callable[[int], tuple[np.ndarray, np.ndarray]]
    callback_args: dict[str, Any]


#: ``--optimizer``: the TF Privacy class and its learning rate.
OPTIMIZERS = {"sgd": ("VectorizedDPKerasSGDOptimizer", LR), "adam": ("DPKerasAdamOptimizer", 0.001)}


def _cases(optimizer: str = "sgd") -> dict[str, Case]:
    import tensorflow as tf
    import tensorflow_privacy as tfp

    from lastiter_plugins.adapters.tf_privacy import FeatureNormClip

    per_example = dict(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    name, rate = OPTIMIZERS[optimizer]

    def _optimizer(tfp: Any, clip: float = 1.0) -> Any:
        return getattr(tfp, name)(l2_norm_clip=clip, noise_multiplier=1.0, learning_rate=rate)

    suffix = "" if optimizer == "sgd" else f", {name}"

    def cnn():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential(
            [
                tf.keras.Input((28, 28, 1)),
                tf.keras.layers.Conv2D(32, 3, activation="relu"),
                tf.keras.layers.Conv2D(32, 3, activation="relu"),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(optimizer=_optimizer(tfp), loss=tf.keras.losses.SparseCategoricalCrossentropy(**per_example))
        return model

    def logistic():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((30,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=_optimizer(tfp), loss=tf.keras.losses.BinaryCrossentropy(**per_example))
        return model

    def glm():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((512,)), FeatureNormClip(1.0), tf.keras.layers.Dense(1)])
        model.compile(optimizer=_optimizer(tfp, clip=1.5), loss=tf.keras.losses.BinaryCrossentropy(**per_example))
        return model

    def images(n):
        rng = np.random.default_rng(0)
        return rng.normal(size=(n, 28, 28, 1)).astype("float32"), rng.integers(0, 10, n)

    def vectors(dim):
        def make(n):
            rng = np.random.default_rng(0)
            x = rng.normal(size=(n, dim)).astype("float32")
            return x, (x[:, 0] > 0).astype("float32")

        return make

    return {
        "cnn": Case(f"CNN 2xConv2D(32, 3x3) + Dense(10) (193,898 weights){suffix}", 32, cnn, images, {}),
        "logistic": Case(f"logistic regression (31 weights){suffix}", 32, logistic, vectors(30), {"smoothness": 0.25}),
        "glm": Case(f"GLM route, 512-dim embeddings (513 weights){suffix}", 64, glm, vectors(512),
                    {"model": "glm", "feature_norm": 1.0}),
    }  # fmt: skip


def _timed(hook: Callable[..., Any], *args: Any) -> float:
    start = time.process_time()
    hook(*args)
    return time.process_time() - start


def _block(case: Case, arm: str, x: np.ndarray, y: np.ndarray, steps: int, epochs: int) -> dict[str, Any]:
    """One fresh fit: CPU seconds per step over every epoch after the first; for B, the callback's host work."""
    import tensorflow as tf

    from lastiter_plugins.adapters.tf_privacy import LastIterateCallback

    class Timed(LastIterateCallback):
        """The callback, its epoch hooks timed."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.epoch_s: list[float] = []
            self._begin_s = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self._begin_s = _timed(super().on_epoch_begin, epoch, logs)

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_s.append(self._begin_s + _timed(super().on_epoch_end, epoch, logs))

    class EpochEnds(tf.keras.callbacks.Callback):  # epoch hooks only: Keras adds no per-batch work for it
        def __init__(self):
            super().__init__()
            self.ends: list[float] = []

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.process_time())

    timer = EpochEnds()
    callbacks: list[Any] = [timer]
    accountant = None
    if arm == "B":
        n = case.batch_size * steps
        accountant = Timed(sampling="reshuffle", dataset_size=n, delta=DELTA, **case.callback_args)
        callbacks.insert(0, accountant)  # before the timer: its epoch-end work is inside the timed epoch
    model = case.build()
    model.fit(x, y, batch_size=case.batch_size, epochs=epochs, shuffle=True, callbacks=callbacks, verbose=0)
    out: dict[str, Any] = {"step_s": (timer.ends[-1] - timer.ends[0]) / (steps * (epochs - 1))}
    if accountant is not None:
        out |= {"host_epoch_s": accountant.epoch_s[1:], "epsilon": accountant.epsilon}
        out["winner"] = accountant.result.winner
    return out


def measure(case: Case, *, rounds: int, steps: int, epochs: int) -> dict[str, Any]:
    x, y = case.data(case.batch_size * steps)
    orders = list(itertools.permutations(("A", "B", "A'")))
    blocks: dict[str, list[float]] = {"A": [], "B": [], "A'": []}
    ratios, controls, host = [], [], []
    last: dict[str, Any] = {}
    for r in range(rounds):
        times = {}
        for arm in orders[r % len(orders)]:
            result = _block(case, arm, x, y, steps, epochs)
            times[arm] = result["step_s"]
            blocks[arm].append(result["step_s"])
            if arm == "B":
                host += result["host_epoch_s"]
                last = result
        ratios.append(times["B"] / times["A"])
        controls.append(times["A'"] / times["A"])
        print(f"  round {r + 1}: step {times['A'] * 1e3:.1f} ms, ratio {ratios[-1]:.4f}, A/A {controls[-1]:.4f}",
              file=sys.stderr, flush=True)  # fmt: skip
    ratio = statistics.median(ratios)
    return {
        "model": case.name,
        "batch_size": case.batch_size,
        "rounds": rounds,
        "steps_per_epoch": steps,
        "epochs_timed": epochs - 1,
        "step_ms": {arm: statistics.median(v) * 1e3 for arm, v in blocks.items()},
        "ratio": ratio,
        "ratio_spread": [min(ratios), max(ratios)],
        "control_ratio": statistics.median(controls),
        "control_spread": [min(controls), max(controls)],
        "host_ms_per_epoch": statistics.median(host) * 1e3,
        "epsilon": last["epsilon"],
        "winner": last["winner"],
        "goal": f"ratio <= control's upper end + {SLACK:g}",
        "met": ratio <= max(controls) + SLACK,
    }


def _kept_rows(model: str) -> list[dict[str, Any]]:
    """The rows of the other models from the last run of each (one section, one row per model)."""
    path = HERE / "results.json"
    section = json.loads(path.read_text())["sections"].get("keras_overhead", {}) if path.exists() else {}
    return [r for r in section.get("rows", []) if "ratio" in r and "step_ms" in r and r["model"] != model]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("cnn", "logistic", "glm"), default="cnn")
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="sgd")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of three fits (at least 7)")
    parser.add_argument("--steps", type=int, default=10, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per fit; the first is not timed")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 steps, nothing written")
    args = parser.parse_args(argv)
    rounds, steps = (3, 2) if args.quick else (args.rounds, args.steps)
    if rounds < 7 and not args.quick:
        parser.error("--rounds must be at least 7 (the median of at least 7 blocks)")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is not timed)")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    case = _cases(args.optimizer)[args.model]
    start = time.perf_counter()
    print(f"{case.name}, batch {case.batch_size}:", file=sys.stderr, flush=True)
    row = measure(case, rounds=rounds, steps=steps, epochs=args.epochs)
    seconds = time.perf_counter() - start
    print(
        f"{row['model']}, b={row['batch_size']}: ratio {row['ratio']:.4f} {row['ratio_spread']}, A/A "
        f"{row['control_ratio']:.4f} {row['control_spread']}, step {row['step_ms']['A']:.1f} ms, host "
        f"{row['host_ms_per_epoch']:.1f} ms/epoch; target {'met' if row['met'] else 'NOT met'} ({seconds:.0f} s)"
    )
    if not args.quick:
        command = (
            f"python benchmarks/bench_keras_overhead.py --model {args.model} --optimizer {args.optimizer} "
            f"--rounds {rounds} --steps {steps} --epochs {args.epochs}"
        )
        row["command"] = command
        update_results("keras_overhead", [row, *_kept_rows(row["model"])], command=command, seconds=seconds,
                       tensorflow=tf.__version__, threads=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
