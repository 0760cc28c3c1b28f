r"""The ``lastiter`` command line: a thin layer over the keyword API.

    lastiter rdp --bound ID --orders 2,4,8 <pipeline> [--json]
    lastiter epsilon --bound ID --delta 1e-5 <pipeline> [--json]
    lastiter bounds <pipeline> [--delta 1e-5] [--json]
    lastiter calibrate --bound ID --target-epsilon 1 --delta 1e-5 <pipeline> [--json]
    lastiter compare [<pipeline>] [...]  (see ``lastiter compare --help``)
    lastiter --version

<pipeline> is ``--config FILE`` (a TOML scenario, as in examples/scenarios/),
one flag per keyword-API parameter (``--dataset-size``, ...,
``--clipped-loss-convex-smooth``), or both: flags given as well override the
file. User errors exit with status 2 and one line on stderr. JSON output never
contains NaN or Infinity (non-finite numbers are written as null).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lastiter_plugins
from lastiter_plugins import advice, api, compare, plot, registry, scenarios
from lastiter_plugins.calibration import calibrate_noise
from lastiter_plugins.config import Relation, Sampling
from lastiter_plugins.jsonout import dump_json
from lastiter_plugins.validation import validate_delta

EXIT_USAGE = 2


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise UsageError(message)


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


def _unproven_id(text: str) -> str:
    """An ``--unproven`` value: the id of a bound whose proof status is unproven."""
    unproven = [bid for bid, spec in registry.BOUNDS.items() if not spec.proof.proven]
    if text not in unproven:
        raise argparse.ArgumentTypeError(f"must name an unproven bound ({', '.join(unproven)}). Found {text!r}.")
    return text


#: One command-line flag per keyword-API parameter: (group, argparse keywords). No defaults here:
#: a flag not given leaves the value to the --config file, else to the API's default (named in the help).
_TRAINING, _ASSUMPTIONS = "training run", "declared loss assumptions"
PARAMETER_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "dataset_size": (_TRAINING, {"type": int, "metavar": "N", "help": "n, number of examples"}),
    "batch_size": (_TRAINING, {"type": int, "metavar": "B", "help": "b, the (expected) batch size"}),
    "noise_multiplier": (
        _TRAINING,
        {"type": float, "metavar": "Z", "help": "z: the noise std on the clipped-gradient sum is z*C"},
    ),
    "learning_rate": (_TRAINING, {"type": float, "metavar": "ETA", "help": "eta, constant plain-SGD step size"}),
    "clip_norm": (_TRAINING, {"type": float, "metavar": "C", "help": "C, per-example clipping norm (default 1)"}),
    "sampling": (
        _TRAINING,
        {"choices": [s.value for s in Sampling], "help": "what the data pipeline does (docs/sampling.md)"},
    ),
    "relation": (
        _TRAINING,
        {"choices": [r.value for r in Relation], "help": "neighbouring relation (default replace_one)"},
    ),
    "steps": (_TRAINING, {"type": int, "metavar": "T", "help": "T, optimizer steps (or --epochs)"}),
    "epochs": (_TRAINING, {"type": int, "metavar": "E", "help": "E passes = E*ceil(n/b) steps (or --steps)"}),
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


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and one flag per keyword-API parameter (see :data:`PARAMETER_FLAGS`)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML scenario (keys: the keyword-API parameters, delta, name, description; see "
        "examples/scenarios/); flags given as well override it",
    )
    groups = {name: parser.add_argument_group(name) for name in (_TRAINING, _ASSUMPTIONS)}
    steps_or_epochs = groups[_TRAINING].add_mutually_exclusive_group()
    for key in api.PARAMETERS:
        group, options = PARAMETER_FLAGS[key]
        target = steps_or_epochs if key in ("steps", "epochs") else groups[group]
        target.add_argument("--" + key.replace("_", "-"), dest=key, default=None, **options)
    groups[_ASSUMPTIONS].add_argument("--no-clipping", action=_Renamed, nargs=0, help=argparse.SUPPRESS)


def params_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword-API parameters given as flags (those not given are absent)."""
    out = {}
    for key in api.PARAMETERS:
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out


def _flag(key: str) -> str:
    return "--steps or --epochs" if key == "steps" else "--" + key.replace("_", "-")


def _missing(params: dict[str, Any], required: Sequence[str]) -> list[str]:
    """The flags of the ``required`` keys (``steps``: steps or epochs) that ``params`` lacks."""
    missing = [key for key in required if key != "steps" and key not in params]
    if "steps" in required and "steps" not in params and "epochs" not in params:
        missing.append("steps")
    return [_flag(key) for key in sorted(missing, key=list(required).index)]


_PIPELINE_KEYS = ("dataset_size", "batch_size", "noise_multiplier", "steps", "sampling")


def _pipeline(args: argparse.Namespace, *, needs_noise: bool = True) -> tuple[str, dict[str, Any], float | None]:
    """(name, keyword-API params, delta) from ``--config`` and the flags; flags override the file.

    ``delta`` is ``--delta``, else the file's ``delta``, else None. Without ``--config`` the flags must
    describe the whole pipeline (a missing one is named, as argparse names a missing argument).
    """
    given = params_from_args(args)
    delta = None
    if args.config:
        scenario = scenarios.load_scenario(args.config)
        name, params, file_delta = scenarios.split_scenario(scenario)
        if "delta" in scenario:
            delta = file_delta
        if name == "custom scenario":
            name = Path(args.config).stem
        if "steps" in given or "epochs" in given:  # the flags' steps/epochs replace the file's
            params.pop("steps", None)
            params.pop("epochs", None)
        params.update(given)
    else:
        required = [key for key in _PIPELINE_KEYS if needs_noise or key != "noise_multiplier"]
        missing = _missing(given, required)
        if missing:
            raise UsageError(
                f"the following arguments are required: {', '.join(missing)} (or --config FILE, a TOML scenario "
                "that sets them; see examples/scenarios/)"
            )
        name, params = "custom scenario", given
    if getattr(args, "delta", None) is not None:
        delta = validate_delta(args.delta)
    return name, params, delta


def _required_delta(delta: float | None) -> float:
    if delta is None:
        raise UsageError("--delta is required: give it, or set delta in the --config file.")
    return delta


def _bound_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bound",
        required=True,
        choices=registry.BOUND_IDS,
        metavar="ID",
        help=f"a bound id, composition (the standard baseline) or best; one of: {', '.join(registry.BOUND_IDS)}",
    )


def _orders_argument(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    help_ = "Renyi orders > 1, comma-separated, e.g. 2,4,8"
    if not required:
        help_ += " (default: the library's grid 1.01 .. 1e4, with its lossless conversion)"
    parser.add_argument("--orders", type=_orders, required=required, metavar="A1,A2,...", help=help_)


def _json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (strict: no NaN or Infinity) instead of text")


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
    _, params, _ = _pipeline(args)
    config, assumptions = api.build(**params)
    values = api.compute_rdp(args.bound, config, assumptions, args.orders)
    relation, protects, proof = config.relation, registry.Protects.FINAL_MODEL, registry.PROVEN
    if args.bound != registry.BEST:
        spec = registry.BOUNDS[args.bound]
        relation = spec.relation_for(config.sampling)
        protects, proof = spec.protects, spec.proof
    if args.json:
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
    _, params, delta = _pipeline(args)
    best = args.bound == registry.BEST
    result = api.epsilon(args.bound, _required_delta(delta), args.orders, lower_bound=best, **params)
    if args.json:
        return dump_json(result.to_dict())
    head = f"{result}\n{result.tightness_line}" if best else str(result)
    if not best or not advice.is_standard_baseline(result):
        return head
    return f"{head}\n\n{advice.baseline_note(result, advice.advise(result.delta, top=3, **params))}"


def _cmd_advise(args) -> str:
    _, params, delta = _pipeline(args)
    delta = _required_delta(delta)
    current = api.epsilon(registry.BEST, delta, **params)
    suggestions = advice.advise(delta, top=args.top, **params)
    if args.json:
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
    head = f"best: {current}"
    if not suggestions:
        return f"{head}\nNo single change from the list (docs/choosing.md) lowers it."
    return "\n".join([head, "Single changes that lower it, best first:", *(f"  {s}" for s in suggestions)])


def _cmd_bounds(args) -> str:
    _, params, delta = _pipeline(args, needs_noise=False)
    with_numbers = delta is not None and "noise_multiplier" in params
    params.setdefault("noise_multiplier", 1.0)  # no precondition depends on it
    config, assumptions = api.build(**params)
    evaluations = api.evaluate_all(
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
                "protects": e.protects.value,
                "kind": e.kind.value,
                "reason": e.reason or None,
                "reference": e.reference,
                "epsilon": e.epsilon,
                "order": e.order,
            }
        )
    if with_numbers:
        try:
            best = api.compute_epsilon(registry.BEST, config, assumptions, delta, args.orders)
        except api.NotApplicableError as exc:
            rows.append({"bound": registry.BEST, "applies": False, "reason": str(exc), "epsilon": None})
        else:
            rows.append(
                {"bound": registry.BEST, "applies": True, "relation": best.relation.value, "proof": "proven"}
                | {"protects": best.protects.value, "epsilon": best.epsilon, "order": best.order}
                | {"winner": best.winner, "reference": best.reference, "reason": None}
            )
    if args.json:
        return dump_json({"delta": delta, "bounds": rows})
    lines = [f"{'bound':36} {'applies':7} {'relation':17} {'epsilon':>12}  note"]
    for row in rows:
        eps = "" if row.get("epsilon") is None else _fmt(row["epsilon"])
        if not row["applies"]:
            note = row["reason"]
        else:
            note = f"order {row['order']:g}" if row.get("order") else ""
            if row.get("winner"):
                note += f", via {row['winner']}"
            if row.get("proof", "proven") != "proven":
                note = f"{row['proof']}" + (f"; {note}" if note else "")
        relation = row.get("relation") or "-"
        lines.append(f"{row['bound']:36} {'yes' if row['applies'] else 'no':7} {relation:17} {eps:>12}  {note}")
    lines.append(
        "Epsilons protect the final model only (composition: every iterate); never mix relations. "
        f"Unproven bounds have numbers only with --unproven ID. See {registry.DOCS}."
    )
    return "\n".join(lines)


def _cmd_calibrate(args) -> str:
    _, params, delta = _pipeline(args, needs_noise=False)
    delta = _required_delta(delta)
    params.pop("noise_multiplier", None)  # the unknown
    z = calibrate_noise(args.bound, args.target_epsilon, delta, orders=args.orders, **params)
    achieved = api.epsilon(args.bound, delta, args.orders, noise_multiplier=z, **params)  # as calibration computed it
    if args.json:
        return dump_json({"noise_multiplier": z, "target_epsilon": args.target_epsilon} | achieved.to_dict())
    return (
        f"noise_multiplier = {z:.6g} reaches epsilon = {achieved.epsilon:.6g} <= {args.target_epsilon:g} at delta = "
        f"{delta:g} ({achieved.relation.value} neighbours), for {achieved.protects.value}, via {achieved.winner}\n"
        f"achieved: {achieved}"
    )


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``compare`` subcommand's own arguments (the pipeline's are added by :func:`add_pipeline_arguments`)."""
    parser.description = (
        "Every accountant side by side for one pipeline. With no parameters, a built-in scenario; "
        "--config FILE reads a TOML scenario (keys: the keyword-API parameters and delta); "
        "flags given on the command line override the file."
    )
    parser.add_argument("--format", choices=compare.FORMATS, default="table", help="output format (default table)")
    parser.add_argument(
        "--delta", type=float, help=f"target delta (default: the scenario's, else {scenarios.DEFAULT_DELTA:g})"
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also write a PNG of epsilon against epochs (.png is added to a bare name)"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print what the host libraries logged while their accountants ran (hidden by default)",
    )
    _unproven_argument(parser)


#: The last two lines of a first run (no --config, no pipeline flags): how to go on.
NEXT_STEPS = (
    "Your own pipeline: lastiter compare --config FILE.toml (copy one of examples/scenarios/), or flags: "
    "lastiter compare --dataset-size N --batch-size B --noise-multiplier Z --sampling S --epochs E ...",
    "Read next: docs/choosing.md (which accountant fits your pipeline, and what each assumes).",
)


def _scenario_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], float]:
    """(name, params, delta) for compare: the built-in scenario, a --config file, and/or the flags."""
    given = params_from_args(args)
    if not args.config and not given:
        name, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
        if args.delta is not None:
            delta = validate_delta(args.delta)
        return name, params, delta
    if not args.config:
        # Flags never fill in from the built-in scenario: its loss assumptions
        # (gradient_norms_within_clip=True, ...) are true of its model, not of yours.
        missing = _missing(given, (*scenarios.REQUIRED_KEYS, "steps"))
        if missing:
            raise ValueError(
                f"{missing[0]} is required when compare is given flags without --config (flags describe your whole "
                "pipeline; they do not modify the built-in scenario). Give it, or put the scenario in a TOML "
                "file and pass --config FILE (see examples/scenarios/)."
            )
    name, params, delta = _pipeline(args)
    return name, params, scenarios.DEFAULT_DELTA if delta is None else delta


def _cmd_compare(args: argparse.Namespace) -> str:
    """The ``lastiter compare`` command: the table in the chosen format (and the plot)."""
    name, params, delta = _scenario_from_args(args)
    plot_path = plot.check_can_plot(args.plot) if args.plot else None  # before the (slow) sweep
    comparison = compare.compare(delta, name=name, unproven=args.unproven, **params)
    output = compare.format_comparison(comparison, args.format, verbose=args.verbose)
    if plot_path is not None:
        with compare.host_log() as log:  # the sweep's host-library log, printed with --verbose only
            written = compare.write_plot(params, delta, plot_path, title=name, unproven=args.unproven)
        if args.format == "table":
            output += f"\n\nPlot written to {written}"
        if args.verbose and log:
            print("\n".join(["Host library log of the plot's sweep:", *log]), file=sys.stderr)
    if args.format == "table" and not args.config and not params_from_args(args):
        output += "\n\n" + "\n".join(NEXT_STEPS)
    return output


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lastiter", description="Last-iterate Renyi-DP accountants for DP-SGD.")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {lastiter_plugins.__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("rdp", help="RDP epsilon (nats) at given orders")
    _bound_argument(p)
    _orders_argument(p, required=True)
    _json_argument(p)
    p.set_defaults(run=_cmd_rdp)

    p = sub.add_parser("epsilon", help="(epsilon, delta) of one bound, or of best")
    _bound_argument(p)
    p.add_argument("--delta", type=float, help="target delta in (0, 1) (required unless the --config file sets it)")
    _orders_argument(p)
    _json_argument(p)
    p.set_defaults(run=_cmd_epsilon)

    p = sub.add_parser("bounds", help="every bound: applies or why not, relation, proof status, epsilon")
    p.add_argument(
        "--delta", type=float, help="also compute epsilon at this delta (default: the --config file's; needs z)"
    )
    _orders_argument(p)
    _unproven_argument(p)
    _json_argument(p)
    p.set_defaults(run=_cmd_bounds)

    p = sub.add_parser("calibrate", help="smallest noise multiplier reaching a target epsilon")
    _bound_argument(p)
    p.add_argument("--target-epsilon", type=float, required=True, help="the epsilon to reach, > 0")
    p.add_argument("--delta", type=float, help="target delta in (0, 1) (required unless the --config file sets it)")
    _orders_argument(p)
    _json_argument(p)
    p.set_defaults(run=_cmd_calibrate)

    p = sub.add_parser("advise", help="single changes to the pipeline that would lower best, best first")
    p.add_argument("--delta", type=float, help="target delta in (0, 1) (required unless the --config file sets it)")
    p.add_argument("--top", type=int, default=None, help="show at most this many suggestions (default: all)")
    _json_argument(p)
    p.set_defaults(run=_cmd_advise)

    p = sub.add_parser("compare", help="side-by-side comparison of every accountant")
    _compare_arguments(p)
    p.set_defaults(run=_cmd_compare)

    for command in sub.choices.values():
        add_pipeline_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lastiter`` console script. Returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            output = args.run(args)
        for w in caught:
            print(f"lastiter: warning: {w.message}", file=sys.stderr)
    except UsageError as exc:
        print(f"lastiter: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # NotApplicableError, CalibrationError and invalid values
        print(f"lastiter: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE
    if output:
        print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
