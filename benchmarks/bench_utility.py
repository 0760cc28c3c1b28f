"""Utility at fixed privacy, v2: tuned test accuracy of DP linear models, each accountant calibrating its own noise.

    python benchmarks/bench_utility.py          # the full run: writes docs/utility.md and docs/utility.png
    python benchmarks/bench_utility.py --tiny   # a smoke run (about a minute): small data, one seed, prints only

Tasks: scikit-learn's breast cancer (binary logistic regression), its digits (softmax
regression, 10 classes) and a generated linear probe (n = 50000 training and 10000 test
embeddings of dimension 128, 10 classes, a fixed-seed Gaussian mixture). The model is
``FeatureNormClip(1)`` + one ``nn.Linear``, trained with DP-SGD as Opacus runs it (per-example
clipping, Gaussian noise on the sum, division by the expected batch size, SGD with weight
decay). Each arm (ARMS) is an accountant with a neighbouring relation and the loaders it
is valid for; for every cell of the grid (loader, epochs, step size in {0.5, 1} / M) the
arm's own accountant calibrates the noise multiplier to the target epsilon, and the model is
trained for 3 seeds. Per arm, the cell with the highest mean test accuracy is reported
(chosen on the test split: not privately accounted, the usual practice it shows).

The grid is trained by ``train``, a vectorised re-implementation of Opacus' DP-SGD step for
one linear layer (the per-example gradient of a linear model is an outer product, so all of
a batch's clipped gradients cost two matrix products). ``check_against_opacus`` runs every
(task, arm, loader) once in a real Opacus pipeline (``make_private``; the lastiter arms under
the registered accountant, ``register(..., model="glm")``, which derives the constants from the
model and checks every step) at the first target, the smallest epoch budget and step 1/M,
asserts that the epsilon the engine reports is <= the target, and replays the batches that
loader drew through ``train`` with the same noise generator: the final parameters must agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import opacus
import torch
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.linear_model import LogisticRegression
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

import lastiter_plugins as lp
from lastiter_plugins.adapters import opacus as lastiter_opacus
from lastiter_plugins.glm import certify_linear_model

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python benchmarks/bench_utility.py"
FEATURE_NORM = 1.0
WEIGHT_DECAY = 0.01
STEP_FRACTIONS = (0.5, 1.0)  # learning rate = fraction / M
NOISE_SEED = 10_000  # the noise generator of seed s is seeded with NOISE_SEED + s
PROBE_SEPARATION = 3.05  # class separation of the generated probe (chosen for ~0.9 non-private accuracy)


# ------------------------------------------------------------------ tasks


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    loss: str  # register(loss=...)
    family: str  # certify_linear_model family
    train_size: int
    batch_size: int
    classes: int
    test_size: int | None = None  # generated tasks only

    def __post_init__(self) -> None:
        if self.train_size % self.batch_size:
            raise ValueError(f"{self.name}: batch_size must divide train_size (one loader batch per step).")

    @property
    def delta(self) -> float:
        return min(1e-5, self.train_size**-1.1)

    def data(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """((x, y) train, (x, y) test); features as fed to the model: after FeatureNormClip."""
        if self.test_size is not None:
            x, y = gaussian_mixture(self.train_size + self.test_size, dim=128, classes=self.classes)
            train, test = np.arange(self.train_size), np.arange(self.train_size, len(x))
        else:
            bunch = load_breast_cancer() if self.name == "breast cancer" else load_digits()
            order = np.random.default_rng(0).permutation(len(bunch.data))
            train, test = order[: self.train_size], order[self.train_size :]
            mean, std = bunch.data[test].mean(axis=0), bunch.data[test].std(axis=0) + 1.0  # the public split
            x, y = (bunch.data - mean) / std, bunch.target
        x = lastiter_opacus.FeatureNormClip(FEATURE_NORM)(torch.tensor(x, dtype=torch.float32))
        y = torch.tensor(y, dtype=torch.float32 if self.classes == 2 else torch.int64)
        return (x[train], y[train]), (x[test], y[test])

    def certificate(self):
        return certify_linear_model(
            self.family, feature_norm_bound=FEATURE_NORM, clip_norm=self.clip_norm, bias=True,
            num_classes=self.classes if self.classes > 2 else None, l2=WEIGHT_DECAY,
        )  # fmt: skip

    @property
    def clip_norm(self) -> float:
        if self.classes == 2:
            return 1.0  # clipping may be active: a clipped scalar GLM stays convex and smooth
        never_active = certify_linear_model(
            self.family, feature_norm_bound=FEATURE_NORM, clip_norm=1.0, bias=True, num_classes=self.classes
        ).clip_norm_never_active  # softmax is certified only where clipping is never active
        return math.ceil(never_active * 1000) / 1000

    def learning_rate(self, fraction: float) -> float:
        return fraction / self.certificate().smoothness


def gaussian_mixture(size: int, *, dim: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of a linear probe: x = mu_y + N(0, I), |mu_k| ~ PROBE_SEPARATION, scaled to unit norm."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((classes, dim)) * PROBE_SEPARATION / math.sqrt(dim)
    y = rng.integers(0, classes, size)
    x = means[y] + rng.standard_normal((size, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True), y


TASKS = (
    Task("breast cancer", "logistic", "binary_logistic", 450, 45, 2),
    Task("digits", "softmax", "softmax_cross_entropy", 1440, 96, 10),
    Task("linear probe", "softmax", "softmax_cross_entropy", 50_000, 1000, 10, test_size=10_000),
)
TINY_TASKS = (
    Task("breast cancer", "logistic", "binary_logistic", 450, 45, 2),
    Task("linear probe", "softmax", "softmax_cross_entropy", 2000, 200, 10, test_size=1000),
)


# ------------------------------------------------------------------ arms


@dataclasses.dataclass(frozen=True)
class Arm:
    key: str
    label: str  # what the doc calls it
    relation: lp.Relation
    samplers: tuple[str, ...]
    bound: str | None  # a lastiter bound id, "every-iterate" (the smallest such row), None: Opacus' RDP


ADD_OR_REMOVE, REPLACE_ONE = lp.Relation.ADD_OR_REMOVE_ONE, lp.Relation.REPLACE_ONE
ARMS = (
    Arm("opacus-rdp", "Opacus RDP (default)", ADD_OR_REMOVE, ("poisson",), None),
    Arm("best-aor", "lastiter best", ADD_OR_REMOVE, ("poisson",), lp.BEST),
    Arm("best-r1", "lastiter best", REPLACE_ONE, ("shuffle_once", "reshuffle", "poisson"), lp.BEST),
    Arm("every-r1", "lastiter every-iterate", REPLACE_ONE, ("reshuffle",), "every-iterate"),
)
#: The headline's rows: (arm, the loaders it is tuned over, how the row is named).
HEADLINE_ROWS = (
    ("opacus-rdp", ("poisson",), "Opacus RDP (default)"),
    ("best-aor", ("poisson",), "lastiter best"),
    ("best-r1", ("shuffle_once", "reshuffle", "poisson"), "lastiter best"),
    ("best-r1", ("shuffle_once", "reshuffle"), "lastiter best, shuffling loaders only"),
)
RELATION_SHORT = {ADD_OR_REMOVE: "add-or-remove", REPLACE_ONE: "replace-one"}
LOADER = {
    "poisson": "Poisson (`poisson_sampling=True`)",
    "reshuffle": "`DataLoader(shuffle=True)`",
    "shuffle_once": "`ShuffleOnceSampler`",
}


@dataclasses.dataclass(frozen=True)
class Calibration:
    noise: float | None
    winner: str  # the bound that certifies the target at that noise, or why the arm is refused
    protects: str


def calibrate(task: Task, arm: Arm, sampler: str, target: float, epochs: int, fraction: float) -> Calibration:
    n, b = task.train_size, task.batch_size
    if arm.bound is None:  # Opacus' accountant does not read the step size: one calibration per (q, E)
        z = _opacus_rdp_noise(target, task.delta, b / n, epochs)
        return Calibration(z, "Opacus RDPAccountant", str(lp.Protects.EVERY_ITERATE))
    params = dict(
        dataset_size=n, batch_size=b, epochs=epochs, learning_rate=task.learning_rate(fraction),
        clip_norm=task.clip_norm, sampling=sampler, relation=arm.relation,
        **task.certificate().loss_assumption_kwargs(),
    )  # fmt: skip
    if arm.bound == "every-iterate":
        candidates = [
            bid
            for bid, ev in lp.applicable_bounds(**params).items()
            if bid != lp.BEST and ev.applies and ev.proof.proven and ev.relation is arm.relation
            and ev.protects is lp.Protects.EVERY_ITERATE
        ]  # fmt: skip
    else:
        candidates = [arm.bound]
    found = []
    for bound in candidates:
        try:
            z = lp.calibrate_noise(bound, target, task.delta, **params).noise_multiplier
        except lp.NotApplicableError as exc:
            return Calibration(None, f"refused: {str(exc).splitlines()[0]}", "-")
        result = lp.epsilon(bound, task.delta, noise_multiplier=z, **params)
        found.append(Calibration(z, result.winner, str(result.protects)))
    if not found:
        return Calibration(None, "refused: no every-iterate bound applies", "-")
    return min(found, key=lambda c: c.noise)


# ------------------------------------------------------------------ training


@functools.cache
def _opacus_rdp_noise(target: float, delta: float, sample_rate: float, epochs: int) -> float:
    return get_noise_multiplier(
        target_epsilon=target, target_delta=delta, sample_rate=sample_rate, epochs=epochs, accountant="rdp"
    )


def batches(sampler: str, n: int, b: int, epochs: int, seed: int) -> Iterator[torch.Tensor]:
    """The index batches the loader draws, n/b steps per epoch: ShuffleOnceSampler's permutation,
    a fresh permutation per epoch, or Poisson batches (each example independently with probability
    q = b/n; drawn as the positions of a Bernoulli(q) sequence, whose gaps are geometric)."""
    rng = np.random.default_rng(seed)
    order = torch.tensor(lastiter_opacus.ShuffleOnceSampler(n, seed=seed).permutation)
    chunk = b + 10 * math.isqrt(b) + 10
    for _ in range(epochs):
        if sampler == "reshuffle":
            order = torch.from_numpy(rng.permutation(n))
        if sampler != "poisson":
            yield from torch.split(order, b)
            continue
        for _ in range(n // b):
            found, last = [], -1
            while last < n:
                positions = last + np.cumsum(rng.geometric(b / n, size=chunk))
                found.append(positions[positions < n])
                last = positions[-1]
            yield torch.from_numpy(np.concatenate(found))


def initial_layer(task: Task, dim: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(dim, 1 if task.classes == 2 else task.classes)


def train(task, x, y, steps, *, lr, noise, seed, private=True) -> tuple[torch.Tensor, torch.Tensor]:
    """DP-SGD on one linear layer, as Opacus' DPOptimizer with flat clipping runs it: per-example
    gradient g_i clipped by min(1, C / (|g_i| + 1e-6)), summed, N(0, (zC)^2) added to each
    coordinate (weight then bias, from the noise generator), divided by the expected batch size b,
    then torch SGD with weight decay. private=False: plain SGD on the batch mean.

    The layer is kept as one matrix [weight, bias] acting on [x, 1]; the per-example gradient is
    the outer product of the residual r_i = d loss / d logits and [x_i, 1], so |g_i| = |r_i| |[x_i, 1]|
    and the batch's clipped sum is one matrix product. Logits and residuals are kept as
    (outputs x batch): the products are 3x faster that way round on CPU."""
    layer = initial_layer(task, x.shape[1], seed)
    dim, outputs = x.shape[1], layer.out_features
    params = torch.cat([layer.weight.detach(), layer.bias.detach().unsqueeze(1)], dim=1)
    augmented = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    augmented_norm = augmented.norm(dim=1)
    target = y.unsqueeze(1) if task.classes == 2 else nn.functional.one_hot(y, task.classes).float()
    noise_gen = torch.Generator().manual_seed(NOISE_SEED + seed)
    std, b, decay = noise * task.clip_norm, task.batch_size, 1.0 - lr * WEIGHT_DECAY
    for idx in steps:
        xb = augmented.index_select(0, idx)
        logits = params @ xb.T
        prob = torch.sigmoid(logits) if task.classes == 2 else torch.softmax(logits, dim=0)
        residual = prob - target.index_select(0, idx).T
        if private:
            norms = residual.square().sum(0).sqrt() * augmented_norm.index_select(0, idx)
            residual *= (task.clip_norm / (norms + 1e-6)).clamp(max=1.0)
            grad = residual @ xb
            grad[:, :dim] += torch.normal(0.0, std, size=(outputs, dim), generator=noise_gen)
            grad[:, dim] += torch.normal(0.0, std, size=(outputs,), generator=noise_gen)
            scale = lr / b
        else:
            grad, scale = residual @ xb, lr / max(len(idx), 1)
        params.mul_(decay).sub_(grad, alpha=scale)
    return params[:, :dim], params[:, dim]


def accuracy(task: Task, weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    logits = x @ weight.T + bias
    pred = (logits.squeeze(1) > 0).float() if task.classes == 2 else logits.argmax(dim=1)
    return float((pred == y).float().mean())


# ------------------------------------------------------------------ the check against Opacus


def check_against_opacus(task, data, arm, sampler, target, epochs, fraction, cal) -> dict:
    """One real Opacus run of the arm's pipeline (seed 0): the engine's epsilon must be <= target,
    and ``train`` on the batches Opacus drew, with the same noise generator, must give the same model."""
    (x, y), _ = data
    n, lr, seed = task.train_size, task.learning_rate(fraction), 0
    dataset = TensorDataset(x, y, torch.arange(n))
    model = nn.Sequential(lastiter_opacus.FeatureNormClip(FEATURE_NORM), initial_layer(task, x.shape[1], seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    loss_fn = nn.BCEWithLogitsLoss() if task.classes == 2 else nn.CrossEntropyLoss()
    if arm.bound is None:
        engine = PrivacyEngine(accountant="rdp")
    else:
        name = lastiter_opacus.register(
            f"utility-{arm.key}-{sampler}", force=True, bound=lp.BEST if arm.bound == lp.BEST else cal.winner,
            sampling=sampler, relation=arm.relation, dataset_size=n, learning_rate=lr, model="glm",
            loss=task.loss, feature_norm=FEATURE_NORM,
        )  # fmt: skip
        engine = PrivacyEngine(accountant=name)
    if sampler == "shuffle_once":
        loader = DataLoader(dataset, batch_size=task.batch_size, sampler=lastiter_opacus.ShuffleOnceSampler(n, seed=0))
    else:
        shuffle = sampler == "reshuffle"
        loader = DataLoader(dataset, batch_size=task.batch_size, shuffle=shuffle)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, criterion=loss_fn, data_loader=loader, noise_multiplier=cal.noise,
        max_grad_norm=task.clip_norm, poisson_sampling=sampler == "poisson",
        noise_generator=torch.Generator().manual_seed(NOISE_SEED + seed),
    )  # fmt: skip
    drawn = []
    for _ in range(epochs):
        for xb, yb, ib in loader:
            drawn.append(ib)
            optimizer.zero_grad()
            out = model(xb)
            loss_fn(out.squeeze(-1) if task.classes == 2 else out, yb).backward()
            optimizer.step()
    spent = engine.get_epsilon(task.delta)
    tolerance = 0.01 if arm.bound is None else 0.0  # get_noise_multiplier's epsilon_tolerance
    if not spent <= target * (1 + 1e-9) + tolerance:
        raise AssertionError(f"{task.name}, {arm.key}, {sampler}: the engine reports epsilon {spent} > {target}")
    weight, bias = train(task, x, y, drawn, lr=lr, noise=cal.noise, seed=seed)
    layer = model._module[1] if hasattr(model, "_module") else model[1]
    gap = max(float((layer.weight.detach() - weight).abs().max()), float((layer.bias.detach() - bias).abs().max()))
    scale = max(float(weight.abs().max()), 1.0)
    if not gap <= 1e-4 * scale:
        raise AssertionError(f"{task.name}, {arm.key}, {sampler}: train() and Opacus differ by {gap:.3g}")
    return {"epsilon": spent, "gap": gap, "steps": len(drawn)}


# ------------------------------------------------------------------ the run


def _mean_spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run(tasks, targets, grid, seeds) -> dict:
    results: dict = {"grid": grid, "seeds": seeds, "targets": targets, "tasks": {}, "timing": {}}
    cells = [(a, s) for a in ARMS for s in a.samplers]
    total = len(tasks) * (1 + len(targets) * len(cells)) * len(grid) * len(STEP_FRACTIONS)
    bar = tqdm(total=total, desc="cells", unit="cell", file=sys.stderr, dynamic_ncols=True)
    spent = {"calibration": 0.0, "training": 0.0, "checks": 0.0}
    for task in tasks:
        data = task.data()
        (x, y), (x_test, y_test) = data
        clock = time.perf_counter()
        reference = LogisticRegression(max_iter=1000).fit(x.numpy(), y.numpy()).score(x_test.numpy(), y_test.numpy())
        entry: dict = {"task": task, "sklearn": reference, "nonprivate": {}, "cells": {}, "checks": {}}
        for epochs in grid:
            for fraction in STEP_FRACTIONS:
                lr = task.learning_rate(fraction)
                entry["nonprivate"][(epochs, fraction)] = [
                    accuracy(task, *train(task, x, y, batches("reshuffle", len(x), task.batch_size, epochs, s),
                                          lr=lr, noise=0.0, seed=s, private=False), x_test, y_test)
                    for s in range(seeds)
                ]  # fmt: skip
                bar.update()
        spent["training"] += time.perf_counter() - clock
        for target in targets:
            for arm, sampler in cells:
                for epochs in grid:
                    for fraction in STEP_FRACTIONS:
                        bar.set_postfix_str(f"{task.name}, eps {target:g}, {arm.key} {sampler} E={epochs}")
                        clock = time.perf_counter()
                        cal = calibrate(task, arm, sampler, target, epochs, fraction)
                        spent["calibration"] += time.perf_counter() - clock
                        accs = []
                        if cal.noise is not None:
                            clock = time.perf_counter()
                            for s in range(seeds):
                                steps = batches(sampler, len(x), task.batch_size, epochs, s)
                                model = train(
                                    task, x, y, steps, lr=task.learning_rate(fraction), noise=cal.noise, seed=s
                                )
                                accs.append(accuracy(task, *model, x_test, y_test))
                            spent["training"] += time.perf_counter() - clock
                            if target == targets[0] and epochs == grid[0] and fraction == STEP_FRACTIONS[-1]:
                                clock = time.perf_counter()
                                entry["checks"][(arm.key, sampler)] = check_against_opacus(
                                    task, data, arm, sampler, target, epochs, fraction, cal
                                )
                                spent["checks"] += time.perf_counter() - clock
                        entry["cells"][(target, arm.key, sampler, epochs, fraction)] = (cal, accs)
                        bar.update()
        results["tasks"][task.name] = entry
    bar.close()
    results["timing"] = spent
    return results


def tuned(entry: dict, target: float, arm: Arm, grid) -> tuple | None:
    """(sampler, epochs, fraction, calibration, accuracies) of the arm's best cell by mean accuracy."""
    options = [
        (s, e, f, *entry["cells"][(target, arm.key, s, e, f)])
        for s in arm.samplers
        for e in grid
        for f in STEP_FRACTIONS
        if entry["cells"][(target, arm.key, s, e, f)][1]
    ]
    return max(options, key=lambda o: statistics.fmean(o[4])) if options else None


# ------------------------------------------------------------------ rendering


def _acc(values: list[float]) -> str:
    mean, spread = _mean_spread(values)
    return f"{mean:.3f} ± {spread:.3f}"


def _step(fraction: float) -> str:
    return "1/M" if fraction == 1.0 else f"{fraction:g}/M"


def _protects(text: str) -> str:
    return "final model only" if text == str(lp.Protects.FINAL_MODEL) else text


def render_headline(results: dict, elapsed: float, machine: str) -> str:
    grid, target = results["grid"], results["targets"][0]
    lines = [
        f"Target epsilon = {target:g}, delta = min(1e-5, n^-1.1); test accuracy of the best cell of the grid "
        f"(loader, epochs in {list(grid)}, step size in {{0.5, 1}}/M) per accountant, mean ± standard deviation "
        f"over {results['seeds']} seeds. Regenerated by `{COMMAND}` ({elapsed / 60:.1f} min on {machine}).",
        "",
        "| task | accountant | relation | protects | tuned loader, E, step | noise multiplier | accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in results["tasks"].items():
        task = entry["task"]
        best_np = max(entry["nonprivate"].values(), key=statistics.fmean)
        for key, samplers, label in HEADLINE_ROWS:
            arm = dataclasses.replace(next(a for a in ARMS if a.key == key), samplers=samplers)
            found = tuned(entry, target, arm, grid)
            if found is None:
                lines.append(f"| {name} | {label} | {RELATION_SHORT[arm.relation]} | - | refused | - | - |")
                continue
            sampler, epochs, fraction, cal, accs = found
            via = "" if arm.bound is None else f" (via {cal.winner})"
            lines.append(
                f"| {name} (n = {task.train_size}) | {label}{via} | {RELATION_SHORT[arm.relation]} | "
                f"{_protects(cal.protects)} | {sampler}, {epochs}, {_step(fraction)} | {cal.noise:.2f} | "
                f"**{_acc(accs)}** |"
            )
        lines.append(
            f"| {name} | non-private SGD (same grid, reshuffle) / scikit-learn logistic regression | - | - | - | 0 | "
            f"{_acc(best_np)} / {entry['sklearn']:.3f} |"
        )
    return "\n".join(lines)


def render_results(results: dict, elapsed: float, machine: str) -> str:
    grid, seeds = results["grid"], results["seeds"]
    t = results["timing"]
    lines = [
        f"Command: `{COMMAND}` ({elapsed / 60:.1f} min on {machine}: calibration {t['calibration'] / 60:.1f} min, "
        f"training {t['training'] / 60:.1f} min, Opacus checks {t['checks'] / 60:.1f} min). Test accuracy, mean ± "
        f"standard deviation over {seeds} seeds, of each (accountant, loader)'s best cell over epochs {list(grid)} "
        "and step size {0.5, 1}/M; z = the calibrated noise multiplier; `certified by` = the bound that gives the "
        "target at that z. **Bold**: the accountant's best loader (the headline).",
        "",
        "| task | eps | accountant | relation | loader | certified by | protects | tuned E, step | z | accuracy | "
        + " | ".join(f"z at E = {e} (1/M)" for e in grid)
        + " |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(grid),
    ]
    for name, entry in results["tasks"].items():
        for target in results["targets"]:
            for arm in ARMS:
                best = tuned(entry, target, arm, grid)
                for sampler in arm.samplers:
                    sub = dataclasses.replace(arm, samplers=(sampler,))
                    found = tuned(entry, target, sub, grid)
                    zs = " | ".join(
                        _z(entry["cells"][(target, arm.key, sampler, e, STEP_FRACTIONS[-1])][0]) for e in grid
                    )
                    head = f"| {name} | {target:g} | {arm.label} | {RELATION_SHORT[arm.relation]} | {LOADER[sampler]}"
                    if found is None:
                        cal = entry["cells"][(target, arm.key, sampler, grid[0], STEP_FRACTIONS[-1])][0]
                        lines.append(f"{head} | {cal.winner} | - | - | - | - | {zs} |")
                        continue
                    _, epochs, fraction, cal, accs = found
                    acc = _acc(accs)
                    if best is not None and len(arm.samplers) > 1 and best[0] == sampler:
                        acc = f"**{acc}**"
                    lines.append(
                        f"{head} | {cal.winner} | {_protects(cal.protects)} | {epochs}, {_step(fraction)} | "
                        f"{cal.noise:.2f} | {acc} | {zs} |"
                    )
    lines += ["", "Checks against Opacus (seed 0, step 1/M, smallest E, first target): the engine's epsilon and "
              "the largest parameter difference between Opacus and the vectorised trainer on the same batches "
              "and noise.", "", "| task | accountant | loader | steps | engine epsilon | max parameter gap |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, entry in results["tasks"].items():
        for (key, sampler), c in entry["checks"].items():
            arm = next(a for a in ARMS if a.key == key)
            lines.append(
                f"| {name} | {arm.label}, {RELATION_SHORT[arm.relation]} | {sampler} | {c['steps']} | "
                f"{c['epsilon']:.4f} | {c['gap']:.1e} |"
            )
    return "\n".join(lines)


def _z(cal: Calibration) -> str:
    return "refused" if cal.noise is None else f"{cal.noise:.2f}"


COLOURS = {"opacus-rdp": "tab:blue", "best-aor": "tab:purple", "best-r1": "tab:green", "every-r1": "tab:orange"}


SHORT_LOADER = {"poisson": "Poisson", "reshuffle": "reshuffle", "shuffle_once": "shuffle once"}


def plot(results: dict, path: Path) -> None:
    """Top: each accountant's tuned accuracy per target (its loader and what it protects written in
    the bar). Bottom: accuracy against epochs at the first target, per (accountant, loader)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid, targets = results["grid"], results["targets"]
    names = list(results["tasks"])
    fig, axes = plt.subplots(2, len(names), figsize=(4.8 * len(names), 9.6), squeeze=False)
    width = 0.8 / len(ARMS)
    for col, name in enumerate(names):
        entry = results["tasks"][name]
        ax = axes[0][col]
        for i, arm in enumerate(ARMS):
            for j, target in enumerate(targets):
                found = tuned(entry, target, arm, grid)
                if found is None:
                    continue
                where, (mean, spread) = j + (i - (len(ARMS) - 1) / 2) * width, _mean_spread(found[4])
                label = f"{arm.label} ({RELATION_SHORT[arm.relation]})" if j == 0 and col == 0 else None
                ax.bar(where, mean, width * 0.92, yerr=spread, capsize=2, color=COLOURS[arm.key], label=label,
                       alpha=1.0 if j == 0 else 0.7)  # fmt: skip
                ax.text(where, mean + spread + 0.01, f"{mean:.2f}", ha="center", va="bottom", fontsize=7)
                ax.text(where, 0.03, f"{SHORT_LOADER[found[0]]}, {_protects(found[3].protects)}", rotation=90,
                        ha="center", va="bottom", fontsize=7, color="white")  # fmt: skip
        best_np = statistics.fmean(max(entry["nonprivate"].values(), key=statistics.fmean))
        ax.axhline(best_np, color="black", linestyle="--", linewidth=1, label="non-private" if col == 0 else None)
        ax.set_xticks(range(len(targets)), [f"epsilon = {t:g}" for t in targets])
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{name} (n = {entry['task'].train_size}): tuned accuracy")
        ax.set_ylabel("test accuracy, best cell (mean ± sd, 3 seeds)" if col == 0 else None)
        ax = axes[1][col]
        for arm in ARMS:
            for sampler, style in zip(("shuffle_once", "reshuffle", "poisson"), ("-", "--", ":"), strict=True):
                if sampler not in arm.samplers:
                    continue
                stats = []
                for e in grid:
                    cells = [entry["cells"][(targets[0], arm.key, sampler, e, f)][1] for f in STEP_FRACTIONS]
                    cells = [c for c in cells if c]
                    stats.append(_mean_spread(max(cells, key=statistics.fmean)) if cells else (math.nan, 0.0))
                protects = _protects(entry["cells"][(targets[0], arm.key, sampler, grid[-1], 1.0)][0].protects)
                ax.errorbar(grid, [s[0] for s in stats], yerr=[s[1] for s in stats], color=COLOURS[arm.key],
                            linestyle=style, marker="o", capsize=2, label=f"{arm.label}, {SHORT_LOADER[sampler]} "
                            f"({RELATION_SHORT[arm.relation]}; {protects})")  # fmt: skip
        ax.axhline(best_np, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(grid, [str(e) for e in grid])
        ax.set_xlabel("epochs")
        ax.set_ylabel(f"test accuracy at epsilon = {targets[0]:g}, best step size" if col == 0 else None)
        ax.set_title(f"{name}: accuracy against epochs, epsilon = {targets[0]:g}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(path, dpi=100)


def write_doc(blocks: dict[str, str], path: Path) -> None:
    text = path.read_text()
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path} has no <!-- {name}:start --> ... <!-- {name}:end --> block")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    path.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, nargs="+", default=[5, 20, 80], help="the epoch grid")
    parser.add_argument(
        "--targets", type=float, nargs="+", default=[1.0, 3.0], help="target epsilons (first: headline)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="smoke run: small data, one seed, epochs 2, epsilon 1; prints only"
    )
    parser.add_argument("--machine", default=None, help="what the doc says it ran on")
    parser.add_argument("--no-write", action="store_true", help="print the tables; write neither doc nor plot")
    args = parser.parse_args(argv)
    tasks, seeds, grid, targets = TASKS, args.seeds, tuple(sorted(set(args.epochs))), tuple(args.targets)
    if args.tiny:
        tasks, seeds, grid, targets = TINY_TASKS, 1, (2,), (1.0,)
    machine = args.machine or (
        f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}, opacus {opacus.__version__}, "
        "one torch thread"
    )
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*full backward hook")
    warnings.filterwarnings("ignore", category=UserWarning, module="opacus")
    torch.set_num_threads(1)
    start = time.time()
    results = run(tasks, targets, grid, seeds)
    elapsed = time.time() - start
    blocks = {
        "headline": render_headline(results, elapsed, machine),
        "results": render_results(results, elapsed, machine),
    }
    print(blocks["headline"], blocks["results"], sep="\n\n")
    if not (args.no_write or args.tiny):
        write_doc(blocks, ROOT / "docs" / "utility.md")
        plot(results, ROOT / "docs" / "utility.png")
        print("wrote docs/utility.md (headline and results blocks) and docs/utility.png", file=sys.stderr)


if __name__ == "__main__":
    main()
