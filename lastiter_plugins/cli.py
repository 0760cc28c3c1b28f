r"""The ``lastiter`` command line: a thin layer over the keyword API.

    lastiter rdp [--bound ID] --orders 2,4,8 <pipeline> [--format json]
    lastiter epsilon [--bound ID] [--delta 1e-5] <pipeline> [--format json]
    lastiter bounds <pipeline> [--delta 1e-5] [--format json]
    lastiter calibrate [--bound ID] --target-epsilon 1 [--delta 1e-5] <pipeline> [--format json]
    lastiter advise [--delta 1e-5] [--top K] <pipeline> [--format json]
    lastiter compare [<pipeline>] [...]  (see ``lastiter compare --help``)
    lastiter --version

<pipeline> is ``--config FILE`` (a TOML scenario, as in examples/scenarios/),
one flag per keyword-API parameter (``--dataset-size``, ...,
``--clipped-loss-convex-smooth``), or both: flags given as well override the
file. The hosts' names are taken too: ``--sigma`` is ``--noise-multiplier``, and
``--sample-rate Q`` (Poisson) replaces ``--batch-size`` by
:func:`lastiter_plugins.config.poisson_batch_size` (and ``--epochs`` counts
:func:`lastiter_plugins.config.poisson_steps`). Every subcommand has the same
defaults: ``--bound best``, delta from ``--delta``, else the file, else
:data:`lastiter_plugins.defaults.DEFAULT_DELTA`, and the relation from
``--relation``, else the file, else the sampling scheme's
(:data:`lastiter_plugins.config.DEFAULT_RELATION`). Every subcommand takes
``--format json`` (``--json`` is its deprecated spelling). User errors (a value
out of range, a file that cannot be read or written) exit with status 2 and one
line on stderr; warnings go to stderr, each once; output into a closed pipe ends
quietly. JSON output never contains NaN or Infinity (non-finite numbers are
written as null).

The parser imports no numerics: ``lastiter --help`` and every subcommand's help
are answered without numpy, scipy, dp-accounting or matplotlib, which the
subcommands import when they run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lastiter_plugins import __version__
from lastiter_plugins.config import DEFAULT_RELATION, Relation, Sampling, Update
from lastiter_plugins.defaults import BEST, DEFAULT_DELTA, FORMATS

EXIT_USAGE = 2
_WIDTH = 120  # free text (references, footers) is wrapped to this width
#: A closed output pipe (``lastiter bounds ... | head -1``): the status of a process ended by SIGPIPE
#: (128 + 13), as shells report for other tools; nothing is printed.
EXIT_BROKEN_PIPE = 141


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise UsageError(message)


class _DeprecatedJson(argparse.Action):
    """``--json``, the old spelling of ``--format json``: still works, with a warning on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        warnings.warn(
            "--json is deprecated: use --format json (--json goes in lastiter-plugins 0.4.0).",
            DeprecationWarning,
            stacklevel=2,
        )
        namespace.format = "json"


class _Renamed(argparse.Action):
    """A flag that was renamed: refused with the new name."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(
            f"{option_string} was renamed: use --gradient-norms-within-clip, which asserts that every "
            "per-example gradient norm is <= C on the whole domain (clipping never active)."
        )


def _orders(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"orders must be comma-separated numbers > 1, e.g. 2,4,8. Found {text!r}."
        ) from None


def _positive_int(text: str) -> int:
    """A count >= 1 (``--top``): 0 and negative numbers are refused, not read as "none" or "all but one"."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1. Found {text!r}.")
    return value


def _unproven_id(text: str) -> str:
    """An ``--unproven`` value: the id of a bound whose proof status is unproven."""
    from lastiter_plugins import registry

    unproven = [bid for bid, spec in registry.BOUNDS.items() if not spec.proof.proven]
    if text not in unproven:
        raise argparse.ArgumentTypeError(f"must name an unproven bound ({', '.join(unproven)}). Found {text!r}.")
    return text


def _default_relations() -> str:
    """``add_or_remove_one for poisson; replace_one for cyclic, ...``: the rule, as the help states it."""
    schemes: dict[Relation, list[str]] = {}
    for sampling, relation in DEFAULT_RELATION.items():
        schemes.setdefault(relation, []).append(sampling.value)
    ordered = sorted(schemes.items(), key=lambda item: len(item[1]))
    return "; ".join(f"{relation.value} for {', '.join(names)}" for relation, names in ordered)


#: One command-line flag per keyword-API parameter (the keys are ``lastiter_plugins.api.PARAMETERS``, in
#: its order: tests/core/test_cli.py checks it), as (group, argparse keywords). No defaults here: a flag not given
#: leaves the value to the --config file, else to the API's default (named in the help).
_TRAINING, _ASSUMPTIONS = "training run", "declared loss assumptions"
PARAMETER_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "dataset_size": (_TRAINING, {"type": int, "metavar": "N", "help": "n, number of examples"}),
    "batch_size": (_TRAINING, {"type": int, "metavar": "B", "help": "b, the (expected) batch size"}),
    "noise_multiplier": (
        _TRAINING,
        {
            "type": float,
            "metavar": "Z",
            "help": "z: the noise std on the clipped-gradient sum is z*C (also --sigma, Opacus' and dp-accounting's "
            "name)",
        },
    ),
    "learning_rate": (_TRAINING, {"type": float, "metavar": "ETA", "help": "eta, constant plain-SGD step size"}),
    "clip_norm": (_TRAINING, {"type": float, "metavar": "C", "help": "C, per-example clipping norm (default 1)"}),
    "sampling": (
        _TRAINING,
        {"choices": [s.value for s in Sampling], "help": "what the data pipeline does (docs/sampling.md)"},
    ),
    "relation": (
        _TRAINING,
        {
            "choices": [r.value for r in Relation],
            "help": f"neighbouring relation (default: the sampling scheme's, {_default_relations()})",
        },
    ),
    "update": (
        _TRAINING,
        {
            "choices": [u.value for u in Update],
            "help": "what the optimizer does with the noisy clipped sums: sgd (plain SGD, constant learning rate; "
            "default) or any (Adam, momentum, a schedule: only the every-iterate bounds hold)",
        },
    ),
    "allocations_per_epoch": (
        _TRAINING,
        {
            "type": int,
            "metavar": "K",
            "help": "k, with --sampling random_allocation: each example joins k of an epoch's ceil(n*k/b) steps "
            "(default 1)",
        },
    ),
    "order_secret": (
        _TRAINING,
        {
            "action": argparse.BooleanOptionalAction,
            "help": "the batches are drawn from a secret seed (default yes); --no-order-secret: the order or the "
            "batches are public, and only the bounds proven for every fixed batch sequence hold",
        },
    ),
    "max_batch_size": (
        _TRAINING,
        {
            "type": int,
            "metavar": "L",
            "help": "L, with --sampling random_allocation: every batch is cut (and padded) to at most L examples; "
            "delta then carries the probability that one exceeded L (docs/derivations/fixed-length-batches.md); "
            "--batch-size stays b, and a host dividing by its L rows at step size eta needs --learning-rate "
            "eta * b / L",
        },
    ),
    "steps": (_TRAINING, {"type": int, "metavar": "T", "help": "T, optimizer steps (or --epochs)"}),
    "epochs": (
        _TRAINING,
        {"type": int, "metavar": "E", "help": "E passes = E*ceil(n/b) steps, E*ceil(n*k/b) with k (or --steps)"},
    ),
    "smoothness": (
        _ASSUMPTIONS,
        {"type": float, "metavar": "M", "help": "M, smoothness (upper curvature) of every per-example loss"},
    ),
    "weak_convexity": (_ASSUMPTIONS, {"type": float, "metavar": "m", "help": "m >= 0 (default 0 = convex)"}),
    "strong_convexity": (_ASSUMPTIONS, {"type": float, "metavar": "LAM", "help": "lam >= 0 (default 0)"}),
    "diameter": (
        _ASSUMPTIONS,
        {"type": float, "metavar": "D", "help": "D of the set the iterates are projected onto (default: none)"},
    ),
    "gradient_norms_within_clip": (
        _ASSUMPTIONS,
        {
            "action": argparse.BooleanOptionalAction,
            "help": "assert that every per-example gradient norm is <= C on the whole domain (clipping never "
            "active); default no",
        },
    ),
    "clipped_loss_convex_smooth": (
        _ASSUMPTIONS,
        {
            "action": argparse.BooleanOptionalAction,
            "help": "assert that the clipped per-example update is the gradient step of convex losses with the "
            "declared constants (linear models with a scalar loss: the GLM route, "
            "lastiter_plugins.glm.certify_linear_model); default no",
        },
    ),
    "l2_outside_clip": (
        _ASSUMPTIONS,
        {
            "action": argparse.BooleanOptionalAction,
            "help": "assert that strong_convexity is an l2 term added after clipping and averaging (torch "
            "SGD(weight_decay=w) under Opacus), so it does not grow with the batch size (Poisson sampling); "
            "default no",
        },
    ),
}


#: Other spellings of a flag: the names Opacus' and dp-accounting's users know.
_ALIASES = {"noise_multiplier": ("--sigma",)}


def _sample_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"must be a number in (0, 1], e.g. 0.004 or 1/len(data_loader). Found {text!r}."
        )
    return value


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``, one flag per keyword-API parameter (see :data:`PARAMETER_FLAGS`) and the hosts'
    spellings: ``--sigma`` and ``--sample-rate``."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML scenario (keys: the keyword-API parameters, delta, name, description; see "
        "examples/scenarios/); flags given as well override it",
    )
    groups = {name: parser.add_argument_group(name) for name in (_TRAINING, _ASSUMPTIONS)}
    steps_or_epochs = groups[_TRAINING].add_mutually_exclusive_group()
    batch_or_rate = groups[_TRAINING].add_mutually_exclusive_group()
    for key, (group, options) in PARAMETER_FLAGS.items():
        target = (
            steps_or_epochs if key in ("steps", "epochs") else batch_or_rate if key == "batch_size" else groups[group]
        )
        flags = ("--" + key.replace("_", "-"), *_ALIASES.get(key, ()))
        target.add_argument(*flags, dest=key, default=None, **options)
    batch_or_rate.add_argument(
        "--sample-rate",
        type=_sample_rate,
        metavar="Q",
        help="Poisson sampling at rate Q (Opacus' sample_rate, 1/len(data_loader); dp-accounting's "
        "PoissonSampledDpEvent probability) instead of --batch-size: b = ceil(n Q), so b/n >= Q; --epochs E "
        "counts E*L steps when Q = 1/L (else give --steps); --learning-rate is the step on the noisy sum "
        "divided by that b (Opacus with loss_reduction='mean' divides by int(n Q): scale its lr by b/int(n Q))",
    )
    groups[_ASSUMPTIONS].add_argument("--no-clipping", action=_Renamed, nargs=0, help=argparse.SUPPRESS)


def params_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword-API parameters given as flags (those not given are absent)."""
    out = {}
    for key in PARAMETER_FLAGS:
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out


def _flag(key: str) -> str:
    return "--steps or --epochs" if key == "steps" else "--" + key.replace("_", "-")


def _missing(params: dict[str, Any], required: Sequence[str], sample_rate: float | None = None) -> list[str]:
    """The flags of the ``required`` keys (``steps``: steps or epochs; ``batch_size``: or a sample rate)
    that ``params`` lacks."""
    missing = [key for key in required if key not in ("steps", "batch_size") and key not in params]
    if "steps" in required and "steps" not in params and "epochs" not in params:
        missing.append("steps")
    if "batch_size" in required and "batch_size" not in params and sample_rate is None:
        missing.append("batch_size")
    flags = {"steps": "--steps or --epochs", "batch_size": "--batch-size or --sample-rate"}
    return [flags.get(key) or _flag(key) for key in sorted(missing, key=list(required).index)]


def _hosts_dialect(params: dict[str, Any], sample_rate: float | None) -> dict[str, Any]:
    """The keyword-API params with ``--sample-rate`` turned into the core's batch size (and ``--epochs`` into
    the steps of that many epochs at rate 1/L), by the core's definitions; and the relation resolved once, by
    the core's rule (the sampling scheme's default when left out, warning in the command line's spelling)."""
    from lastiter_plugins.config import poisson_batch_size, poisson_steps, resolve_relation

    if "sampling" not in params:
        return params  # the API names what is missing
    sampling = Sampling.parse(params["sampling"])
    if sample_rate is not None:
        if sampling is not Sampling.POISSON:
            raise UsageError(
                f"--sample-rate needs --sampling poisson (each example joins each step with probability Q); give "
                f"--batch-size for sampling {sampling.value}. Found --sample-rate {sample_rate!r}."
            )
        if "dataset_size" not in params:
            raise UsageError("--sample-rate needs --dataset-size (b = ceil(n Q)). Found none.")
        params = {k: v for k, v in params.items() if k != "batch_size"}  # the flag replaces the file's
        params["batch_size"] = poisson_batch_size(params["dataset_size"], sample_rate)
        if "epochs" in params:
            params["steps"] = poisson_steps(params.pop("epochs"), sample_rate)
    return {**params, "relation": resolve_relation(params.get("relation"), sampling, name="--relation").value}


_PIPELINE_KEYS = ("dataset_size", "batch_size", "noise_multiplier", "steps", "sampling")


def _pipeline(args: argparse.Namespace, *, needs_noise: bool = True) -> tuple[str, dict[str, Any], float]:
    """(name, keyword-API params, delta) from ``--config`` and the flags; flags override the file.

    ``delta`` is ``--delta``, else the file's ``delta``, else :data:`DEFAULT_DELTA` (every subcommand,
    as compare). Without ``--config`` the flags must describe the whole pipeline (a missing one is
    named, as argparse names a missing argument).
    """
    from lastiter_plugins import scenarios
    from lastiter_plugins.validation import validate_delta

    given = params_from_args(args)
    rate = getattr(args, "sample_rate", None)
    delta = DEFAULT_DELTA
    if args.config:
        scenario = scenarios.load_scenario(args.config)
        name, params, delta = scenarios.split_scenario(scenario)  # the file's delta, else DEFAULT_DELTA
        if name == "custom scenario":
            name = Path(args.config).stem
        if "steps" in given or "epochs" in given:  # the flags' steps/epochs replace the file's
            params.pop("steps", None)
            params.pop("epochs", None)
        params.update(given)
    else:
        required = [key for key in _PIPELINE_KEYS if needs_noise or key != "noise_multiplier"]
        missing = _missing(given, required, rate)
        if missing:
            raise UsageError(
                f"the following arguments are required: {', '.join(missing)} (or --config FILE, a TOML scenario "
                "that sets them; see examples/scenarios/)"
            )
        name, params = "custom scenario", given
    if getattr(args, "delta", None) is not None:
        delta = validate_delta(args.delta)
    return name, _hosts_dialect(params, rate), delta


def _bound_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bound",
        default=BEST,
        metavar="ID",
        help=f"a bound id (`lastiter bounds <pipeline>` lists them, with whether each applies), composition (the "
        f"standard baseline) or {BEST}, the smallest epsilon of the proven bounds that apply (default {BEST})",
    )


def _delta_argument(parser: argparse.ArgumentParser, what: str = "target delta in (0, 1)") -> None:
    parser.add_argument("--delta", type=float, help=f"{what} (default: the --config file's, else {DEFAULT_DELTA:g})")


def _checked_bound(bound: str) -> str:
    """``--bound``, refused (one line, exit 2) unless it is a bound id, composition or best."""
    from lastiter_plugins import registry

    if bound not in registry.BOUND_IDS:
        raise UsageError(f"argument --bound: must be one of {', '.join(registry.BOUND_IDS)}. Found {bound!r}.")
    return bound


def _orders_argument(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    help_ = "Renyi orders > 1, comma-separated, e.g. 2,4,8"
    if not required:
        help_ += " (default: the library's grid 1.01 .. 1e4, with its lossless conversion)"
    parser.add_argument("--orders", type=_orders, required=required, metavar="A1,A2,...", help=help_)


def _format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="output format: text (default) or json (strict: no NaN or Infinity)",
    )
    parser.add_argument("--json", action=_DeprecatedJson, nargs=0, help="deprecated: use --format json")


def _published_only_argument(parser: argparse.ArgumentParser, what: str = "a named bound must be one") -> None:
    parser.add_argument(
        "--published-only",
        action="store_true",
        help=f"best over bounds whose proof is a published theorem only (not this library's derivations; "
        f"docs/bounds.md); {what}",
    )


def _host_argument(parser: argparse.ArgumentParser) -> None:
    from lastiter_plugins.defaults import HOSTS

    parser.add_argument(
        "--host",
        choices=HOSTS,
        default="none",
        help="the library you train with: advice is worded in its terms, and changes it cannot make are left out "
        "(default none: every change, in the core's terms)",
    )


def _explain_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--explain",
        action="store_true",
        help="text: after the answer, what is behind it (the derivations and checks, the rows that do not apply, "
        "the references); --format json always has every field",
    )


def _unproven_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--unproven",
        action="append",
        default=[],
        type=_unproven_id,
        metavar="ID",
        help="also compute this unproven bound (marked, never in best); repeatable",
    )


def _fmt(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.6g}"


def _cmd_rdp(args) -> str:
    from lastiter_plugins import api, registry
    from lastiter_plugins.jsonout import dump_json

    _checked_bound(args.bound)
    _, params, _ = _pipeline(args)
    config, assumptions = api.build(**params)
    values = api.rdp(
        args.bound, args.orders, published_only=args.published_only, config=config, assumptions=assumptions
    )
    relation, protects, proof = config.relation, registry.Protects.FINAL_MODEL, registry.PROVEN
    if args.bound != registry.BEST:
        spec = registry.BOUNDS[args.bound]
        native = spec.relation_for(config.sampling)
        assert native is not None  # rdp returned: the bound applies, so it covers this sampling
        relation, protects, proof = native, spec.protects, spec.proof
    if args.format == "json":
        return dump_json(
            {
                "bound": args.bound,
                "orders": args.orders,
                "rdp": values.tolist(),
                "relation": relation.value,
                "protects": protects.value,
                "proof": str(proof),
            }
        )
    flag = "" if proof.proven else f"; {proof}"
    lines = [f"RDP of {args.bound} ({relation.value} neighbours; protects {protects.value}{flag}), nats:"]
    lines += [f"  order {a:g}: {_fmt(v)}" for a, v in zip(args.orders, values, strict=True)]
    return "\n".join(lines)


def _cmd_epsilon(args) -> str:
    from lastiter_plugins import advice, api, evaluation
    from lastiter_plugins.feasibility import impossible_declaration
    from lastiter_plugins.jsonout import dump_json
    from lastiter_plugins.summary import Answer, answer_lines

    _checked_bound(args.bound)
    _, params, delta = _pipeline(args)
    best = args.bound == BEST
    result = api.epsilon(args.bound, delta, args.orders, lower_bound=best, published_only=args.published_only, **params)
    if args.format == "json":
        return dump_json(result.to_dict())
    config, assumptions = api.build(**params)
    published = evaluation.published_best(result, config, assumptions, args.orders) if best else None
    answer = Answer.of(
        result,
        published=published,
        published_checked=best and not args.published_only,
        impossible=impossible_declaration(config, assumptions),
    )
    lines = answer_lines(answer)
    if args.explain:
        lines += result.details()
    if best and advice.is_standard_baseline(result):
        lines += ["", advice.baseline_note(result, advice.advise(result.delta, top=3, host=args.host, **params))]
    return "\n".join(lines)


def _cmd_advise(args) -> str:
    from lastiter_plugins import advice, api
    from lastiter_plugins.jsonout import dump_json

    _, params, delta = _pipeline(args)
    current = api.epsilon(BEST, delta, **params)
    suggestions = advice.advise(delta, top=args.top, host=args.host, **params)
    if args.format == "json":
        rows = [
            {
                "change": s.change,
                "parameters": {k: getattr(v, "value", v) for k, v in s.parameters.items()},
                "epsilon": s.epsilon,
                "winner": s.winner,
                "changes_training": s.changes_training,
                "relation": s.result.relation.value,
                "protects": s.result.protects.value,
            }
            for s in suggestions
        ]
        return dump_json({"best": current.to_dict(), "suggestions": rows})
    head = str(current)
    if not suggestions:
        return f"{head}\nNo single change from the list (docs/choosing.md) lowers it."
    return "\n".join([head, "Single changes that lower it, best first:", *(f"  {s}" for s in suggestions)])


def _conditions(e, short: bool) -> str:
    """The failed conditions of an evaluation without its reference (each reference is cited once, at the end)."""
    if not e.unmet:
        return e.reason
    return "; ".join(u.short if short else u.condition for u in e.unmet)


def _cmd_bounds(args) -> str:
    from lastiter_plugins import api, evaluation, registry
    from lastiter_plugins.errors import NotApplicableError
    from lastiter_plugins.jsonout import dump_json

    _, params, delta = _pipeline(args, needs_noise=False)
    only = args.published_only
    with_numbers = "noise_multiplier" in params
    params.setdefault("noise_multiplier", 1.0)  # no precondition depends on it
    config, assumptions = api.build(**params)
    evaluations = evaluation.evaluate_all(
        config, assumptions, delta if with_numbers else None, args.orders, unproven=args.unproven
    )
    rows = []
    for bid, e in evaluations.items():
        rows.append(
            {
                "bound": bid,
                "applies": e.applies,
                "relation": e.relation.value if e.relation else None,
                "proof": str(e.proof),
                "provenance": e.provenance,
                "protects": e.protects.value,
                "kind": e.kind.value,
                "reason": _conditions(e, short=args.format != "json") or None,
                "reference": e.reference,
                "epsilon": e.epsilon,
                "order": e.order,
            }
        )
    if with_numbers:
        try:
            best = api.epsilon(BEST, delta, args.orders, published_only=only, config=config, assumptions=assumptions)
        except NotApplicableError as exc:
            rows.append({"bound": BEST, "applies": False, "reason": str(exc), "epsilon": None})
        else:
            rows.append(
                {"bound": BEST, "applies": True, "relation": best.relation.value, "proof": "proven"}
                | {"provenance": best.provenance, "published": best.published}
                | {"protects": best.protects.value, "epsilon": best.epsilon, "order": best.order}
                | {"winner": best.winner, "reference": best.reference, "reason": None}
            )
    if args.format == "json":
        return dump_json({"delta": delta if with_numbers else None, "bounds": rows})
    from lastiter_plugins.feasibility import impossible_declaration
    from lastiter_plugins.summary import warning_lines

    return "\n".join([*warning_lines(impossible_declaration(config, assumptions)), _bounds_text(rows, registry.DOCS)])


def _bounds_text(rows: list[dict[str, Any]], docs: str) -> str:
    """The ``bounds`` table: one short line per bound, then each reference once."""
    numbers: dict[str, int] = {}  # reference -> its number
    for row in rows:
        if row["bound"] != BEST:
            numbers.setdefault(row["reference"], len(numbers) + 1)

    def name(row: dict[str, Any]) -> str:
        return row["bound"] if row["bound"] == BEST else f"{row['bound']} [{numbers[row['reference']]}]"

    from lastiter_plugins.registry import provenance_word

    def proof(row: dict[str, Any]) -> str:
        """The provenance vocabulary: published, derived here or unproven (compare's proof column)."""
        if not row.get("provenance"):
            return "-"
        return provenance_word(row["provenance"], row.get("proof", "proven") == "proven")

    width = max(len(name(row)) for row in rows)
    lines = [f"{'bound':{width}} {'applies':7} {'relation':17} {'proof':12} {'epsilon':>12}  note"]
    for row in rows:
        eps = "" if row.get("epsilon") is None else _fmt(row["epsilon"])
        if not row["applies"]:
            note = row["reason"]
        else:
            note = f"order {row['order']:g}" if row.get("order") else ""
            if row.get("winner"):
                winner = next(r for r in rows if r["bound"] == row["winner"])
                note = ", ".join(filter(None, (note, f"via {name(winner)}")))
            if row.get("proof", "proven") != "proven":
                note = f"{row['proof']}" + (f"; {note}" if note else "")
        relation = row.get("relation") or "-"
        applies = "yes" if row["applies"] else "no"
        lines.append(f"{name(row):{width}} {applies:7} {relation:17} {proof(row):12} {eps:>12}  {note}")
    lines += ["", "References:"]
    for reference, number in numbers.items():
        lines += textwrap.wrap(
            f"[{number}] {reference}", _WIDTH, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False
        )
    footer = (
        "Epsilons protect the final model only (composition: every iterate); never mix relations. "
        f"Unproven bounds have numbers only with --unproven ID. See {docs}."
    )
    return "\n".join([*lines, *textwrap.wrap(footer, _WIDTH)])


def _cmd_calibrate(args) -> str:
    from lastiter_plugins.calibration import calibrate_noise
    from lastiter_plugins.jsonout import dump_json

    _checked_bound(args.bound)
    _, params, delta = _pipeline(args, needs_noise=False)
    params.pop("noise_multiplier", None)  # the unknown
    only = args.published_only
    found = calibrate_noise(args.bound, args.target_epsilon, delta, orders=args.orders, published_only=only, **params)
    if args.format == "json":
        return dump_json(found.to_dict())
    return f"{found}\nachieved: {found.result}"


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``compare`` subcommand's own arguments (the pipeline's are added by :func:`add_pipeline_arguments`)."""
    parser.description = (
        "Every accountant side by side for one pipeline. With no parameters, a built-in scenario; "
        "--config FILE reads a TOML scenario (keys: the keyword-API parameters and delta); "
        "flags given on the command line override the file."
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    _delta_argument(parser)
    _published_only_argument(parser, "the other rows are still shown")
    parser.add_argument(
        "--all",
        action="store_true",
        help="table and markdown: also list the bounds that do not apply, each with its first failed condition "
        "(by default one line counts them; json and csv always list every row)",
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also write a PNG of epsilon against epochs (.png is added to a bare name)"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print what the host libraries logged while their accountants ran (hidden by default)",
    )
    _explain_argument(parser)
    _unproven_argument(parser)


#: The last two lines of a first run (no --config, no pipeline flags): how to go on.
NEXT_STEPS = (
    "Your pipeline: lastiter compare --config FILE.toml (copy examples/scenarios/) or --dataset-size N ... (--help); "
    "then docs/choosing.md",
)


def _scenario_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], float]:
    """(name, params, delta) for compare: the built-in scenario, a --config file, and/or the flags."""
    from lastiter_plugins import scenarios
    from lastiter_plugins.validation import validate_delta

    given = params_from_args(args)
    if not args.config and not given and args.sample_rate is None:
        name, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
        if args.delta is not None:
            delta = validate_delta(args.delta)
        return name, params, delta
    if not args.config:
        # Flags never fill in from the built-in scenario: its loss assumptions
        # (gradient_norms_within_clip=True, ...) are true of its model, not of yours.
        missing = _missing(given, (*scenarios.REQUIRED_KEYS, "steps"), args.sample_rate)
        if missing:
            raise ValueError(
                f"{missing[0]} is required when compare is given flags without --config (flags describe your whole "
                "pipeline; they do not modify the built-in scenario). Give it, or put the scenario in a TOML "
                "file and pass --config FILE (see examples/scenarios/)."
            )
    return _pipeline(args)


def _cmd_compare(args: argparse.Namespace) -> str:
    """The ``lastiter compare`` command: the table in the chosen format (and the plot)."""
    from lastiter_plugins import compare, plot

    name, params, delta = _scenario_from_args(args)
    plot_path = None if args.plot is None else plot.check_can_plot(args.plot)  # before the (slow) sweep
    only = args.published_only
    comparison = compare.compare(delta, name=name, unproven=args.unproven, published_only=only, **params)
    output = compare.format_comparison(
        comparison, args.format, verbose=args.verbose, every_row=args.all, explain=args.explain
    )
    if plot_path is not None:
        with compare.host_log() as log:  # the sweep's host-library log, printed with --verbose only
            written = compare.write_plot(params, delta, plot_path, title=name, unproven=args.unproven)
        if args.format == "table":
            output += f"\n\nPlot written to {written}"
        if args.verbose and log:
            print("\n".join(["Host library log of the plot's sweep:", *log]), file=sys.stderr)
    if args.format == "table" and not args.config and not params_from_args(args) and args.sample_rate is None:
        output += "\n" + "\n".join(NEXT_STEPS)
    return output


def build_parser() -> argparse.ArgumentParser:
    """The whole command line. Light: it imports no numerics (each subcommand does when it runs)."""
    parser = _Parser(
        prog="lastiter",
        description="Last-iterate privacy accountants for DP-SGD (Renyi-DP and f-DP bounds, and the standard "
        "baselines beside them).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("rdp", help="RDP epsilon (nats) at given orders")
    _bound_argument(p)
    _orders_argument(p, required=True)
    _published_only_argument(p)
    _format_argument(p)
    p.set_defaults(run=_cmd_rdp)

    p = sub.add_parser("epsilon", help="(epsilon, delta) of one bound, or of best")
    _bound_argument(p)
    _delta_argument(p)
    _orders_argument(p)
    _published_only_argument(p)
    _explain_argument(p)
    _host_argument(p)
    _format_argument(p)
    p.set_defaults(run=_cmd_epsilon)

    p = sub.add_parser("bounds", help="every bound: applies or why not, relation, proof status, epsilon")
    _delta_argument(p, "compute each epsilon at this delta (needs --noise-multiplier)")
    _orders_argument(p)
    _unproven_argument(p)
    _published_only_argument(p, "every row is still listed")
    _format_argument(p)
    p.set_defaults(run=_cmd_bounds)

    p = sub.add_parser("calibrate", help="smallest noise multiplier reaching a target epsilon")
    _bound_argument(p)
    p.add_argument("--target-epsilon", type=float, required=True, help="the epsilon to reach, > 0")
    _delta_argument(p)
    _orders_argument(p)
    _published_only_argument(p)
    _format_argument(p)
    p.set_defaults(run=_cmd_calibrate)

    p = sub.add_parser("advise", help="single changes to the pipeline that would lower best, best first")
    _delta_argument(p)
    p.add_argument(
        "--top", type=_positive_int, default=None, metavar="K", help="show at most K >= 1 suggestions (default: all)"
    )
    _host_argument(p)
    _format_argument(p)
    p.set_defaults(run=_cmd_advise)

    p = sub.add_parser("compare", help="side-by-side comparison of every accountant")
    _compare_arguments(p)
    p.set_defaults(run=_cmd_compare)

    for command in sub.choices.values():
        add_pipeline_arguments(command)
    return parser


def _is_negative_value(token: str) -> bool:
    """A token that starts with one '-' and is a number (-3, -1e-5, -inf) or a list of them (``--orders -2,4``)."""
    if len(token) < 2 or not token.startswith("-") or token.startswith("--"):
        return False
    try:
        [float(piece) for piece in token.split(",") if piece]
    except ValueError:
        return False
    return True


def _negative_values_joined(argv: Sequence[str]) -> list[str]:
    """``--delta -1e-5`` as ``--delta=-1e-5``: argparse reads a token after an option that starts with '-' as
    another option unless it looks like -3 or -.5, and answers "expected one argument" without naming the value;
    joined, a negative value (-1e-5, -inf, -3) reaches the library's check and its one-line message naming the
    parameter and the value."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _is_negative_value(token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _leads_output(caught: warnings.WarningMessage, output: str) -> bool:
    """A warning the output already starts with (a declaration no loss meets, in text): not repeated on stderr."""
    from lastiter_plugins.errors import ImpossibleDeclarationWarning

    return issubclass(caught.category, ImpossibleDeclarationWarning) and output.startswith("WARNING: ")


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = _negative_values_joined(sys.argv[1:] if argv is None else argv)
    output = ""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                args = parser.parse_args(argv)
                output = args.run(args)
            finally:  # each warning once, also before an error
                for message in dict.fromkeys(str(w.message) for w in caught if not _leads_output(w, output)):
                    print(f"lastiter: warning: {message}", file=sys.stderr)
    except UsageError as exc:
        print(f"lastiter: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # NotApplicableError, CalibrationError and invalid values
        print(f"lastiter: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE
    if output:
        print(output)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lastiter`` console script. Returns the exit status.

    Output into a closed pipe (``lastiter bounds ... | head -1``) ends quietly with
    :data:`EXIT_BROKEN_PIPE`, as Python's documentation of SIGPIPE advises: stdout is pointed at
    os.devnull so that the interpreter's final flush does not fail again.
    """
    try:
        try:
            status = _run(argv)
        finally:  # also after --help and --version (SystemExit): a closed pipe is seen here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return status


if __name__ == "__main__":
    sys.exit(main())
