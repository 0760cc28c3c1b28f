r"""The ``lastiter`` command line: a thin layer over the keyword API.

    lastiter rdp --bound ID --orders 2,4,8 <params> [--json]
    lastiter epsilon --bound ID --delta 1e-5 <params> [--json]
    lastiter bounds <params> [--delta 1e-5] [--json]
    lastiter calibrate --bound ID --target-epsilon 1 --delta 1e-5 <params> [--json]
    lastiter compare [...]            (see ``lastiter compare --help``)

User errors exit with status 2 and one line on stderr. JSON output never
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

from lastiter_plugins import api, compare, registry
from lastiter_plugins.calibration import calibrate_noise
from lastiter_plugins.config import Relation, Sampling
from lastiter_plugins.conversion import validate_delta
from lastiter_plugins.jsonout import dump_json

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


def add_training_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The training-configuration and loss-assumption flags (mirroring the keyword API)."""
    g = parser.add_argument_group("training run")
    g.add_argument("--dataset-size", type=int, required=required, help="n, number of examples")
    g.add_argument("--batch-size", type=int, required=required, help="b, (expected) batch size")
    g.add_argument("--noise-multiplier", type=float, help="z: noise std on the clipped-gradient sum is z*C")
    g.add_argument("--clip-norm", type=float, default=1.0, help="C, per-example clipping norm (default 1)")
    g.add_argument("--learning-rate", type=float, help="eta, constant plain-SGD step size")
    steps = g.add_mutually_exclusive_group(required=required)
    steps.add_argument("--steps", type=int, help="T, optimizer steps")
    steps.add_argument("--epochs", type=int, help="E passes = E*ceil(n/b) steps")
    g.add_argument(
        "--sampling", choices=[s.value for s in Sampling], required=required, help="what the data pipeline does"
    )
    g.add_argument(
        "--relation",
        choices=[r.value for r in Relation],
        default=Relation.REPLACE_ONE.value,
        help="neighbouring relation (default replace_one)",
    )
    a = parser.add_argument_group("declared loss assumptions")
    a.add_argument("--smoothness", type=float, help="M, smoothness (upper curvature) of every per-example loss")
    a.add_argument("--weak-convexity", type=float, default=0.0, help="m >= 0 (0 = convex)")
    a.add_argument("--strong-convexity", type=float, default=0.0, help="lam >= 0")
    a.add_argument("--diameter", type=float, help="D of the set the iterates are projected onto (default: none)")
    a.add_argument(
        "--gradient-norms-within-clip",
        action="store_true",
        default=False,
        help="assert that every per-example gradient norm is <= C on the whole domain (clipping never active)",
    )
    a.add_argument("--no-clipping", action=_Renamed, nargs=0, help=argparse.SUPPRESS)


def params_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword-API parameters carried by parsed arguments."""
    out = {}
    for key in api.PARAMETERS:
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out


def _bound_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bound", required=True, choices=registry.BOUND_IDS, metavar="ID", help="bound id or best")


def _fmt(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.6g}"


def _cmd_rdp(args) -> str:
    params = params_from_args(args)
    config, assumptions = api.build(**params)
    values = api.compute_rdp(args.bound, config, assumptions, args.orders)
    relation, protects, proof = config.relation, registry.Protects.FINAL_MODEL, registry.PROVEN
    if args.bound != registry.BEST:
        spec = registry.BOUNDS[args.bound]
        relation = spec.relation_for(Sampling.parse(params["sampling"]))
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
    result = api.epsilon(args.bound, args.delta, args.orders, **params_from_args(args))
    return dump_json(result.to_dict()) if args.json else str(result)


def _cmd_bounds(args) -> str:
    params = params_from_args(args)
    params.setdefault("noise_multiplier", 1.0)  # no precondition depends on it
    config, assumptions = api.build(**params)
    with_numbers = args.delta is not None and "noise_multiplier" in params_from_args(args)
    evaluations = api.evaluate_all(
        config, assumptions, args.delta if with_numbers else None, args.orders, unproven=args.unproven
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
            best = api.compute_epsilon(registry.BEST, config, assumptions, args.delta, args.orders)
        except api.NotApplicableError as exc:
            rows.append({"bound": registry.BEST, "applies": False, "reason": str(exc), "epsilon": None})
        else:
            rows.append(
                {"bound": registry.BEST, "applies": True, "relation": best.relation.value, "proof": "proven"}
                | {"protects": best.protects.value, "epsilon": best.epsilon, "order": best.order}
                | {"winner": best.winner, "reference": best.reference, "reason": None}
            )
    if args.json:
        return dump_json({"delta": args.delta, "bounds": rows})
    lines = [f"{'bound':28} {'applies':7} {'relation':17} {'epsilon':>12}  note"]
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
        lines.append(f"{row['bound']:28} {'yes' if row['applies'] else 'no':7} {relation:17} {eps:>12}  {note}")
    lines.append(
        "Epsilons protect the final model only (composition: every iterate); never mix relations. "
        f"Unproven bounds have numbers only with --unproven ID. See {registry.DOCS}."
    )
    return "\n".join(lines)


def _cmd_calibrate(args) -> str:
    params = params_from_args(args)
    z = calibrate_noise(args.bound, args.target_epsilon, args.delta, orders=args.orders, **params)
    if args.json:
        return dump_json({"bound": args.bound, "noise_multiplier": z, "target_epsilon": args.target_epsilon})
    target = f"epsilon <= {args.target_epsilon:g} at delta = {args.delta:g}"
    return f"noise_multiplier = {z:.6g} reaches {target} ({args.bound})"


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``compare`` subcommand's arguments."""
    parser.description = (
        "Every accountant side by side for one pipeline. With no parameters, a built-in scenario; "
        "--config FILE reads a TOML scenario (keys: the keyword-API parameters and delta); "
        "flags given on the command line override the file."
    )
    parser.add_argument("--config", metavar="FILE", help="TOML scenario, e.g. examples/scenarios/*.toml")
    parser.add_argument("--format", choices=compare.FORMATS, default="table", help="output format (default table)")
    parser.add_argument(
        "--delta", type=float, help=f"target delta (default: the scenario's, else {compare.DEFAULT_DELTA:g})"
    )
    parser.add_argument("--plot", metavar="PATH", help="also write a PNG of epsilon against epochs")
    parser.add_argument(
        "--unproven",
        action="append",
        default=[],
        metavar="ID",
        help="also compute this unproven bound (marked, never in best); repeatable",
    )
    add_training_arguments(parser, required=False)
    # No defaults here, so that only the flags actually given override a scenario.
    parser.set_defaults(
        clip_norm=None, relation=None, weak_convexity=None, strong_convexity=None, gradient_norms_within_clip=None
    )


def _scenario_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], float]:
    """(name, params, delta): the built-in scenario, a --config file, and/or the flags."""
    given = params_from_args(args)
    if args.config:
        scenario = compare.load_scenario(args.config)
        name, params, delta = compare.split_scenario(scenario)
        if name == "custom scenario":
            name = Path(args.config).stem
        if "steps" in given or "epochs" in given:  # the flags' steps/epochs replace the file's
            params.pop("steps", None)
            params.pop("epochs", None)
        params.update(given)
    elif given:
        # Flags never fill in from the built-in scenario: its loss assumptions
        # (gradient_norms_within_clip=True, ...) are true of its model, not of yours.
        missing = [key for key in compare.REQUIRED_KEYS if key not in given]
        if "steps" not in given and "epochs" not in given:
            missing.append("steps")
        if missing:
            flag = "--steps or --epochs" if missing[0] == "steps" else "--" + missing[0].replace("_", "-")
            raise ValueError(
                f"{flag} is required when compare is given flags without --config (flags describe your whole "
                "pipeline; they do not modify the built-in scenario). Give it, or put the scenario in a TOML "
                "file and pass --config FILE (see examples/scenarios/)."
            )
        name, params, delta = "custom scenario", given, compare.DEFAULT_DELTA
    else:
        name, params, delta = compare.split_scenario(compare.BUILTIN_SCENARIO)
    if args.delta is not None:
        delta = validate_delta(args.delta)
    return name, params, delta


def _cmd_compare(args: argparse.Namespace) -> str:
    """The ``lastiter compare`` command: the table in the chosen format (and the plot)."""
    name, params, delta = _scenario_from_args(args)
    comparison = compare.compare(delta, name=name, unproven=args.unproven, **params)
    output = compare.format_comparison(comparison, args.format)
    if args.plot:
        path = compare.write_plot(params, delta, args.plot, title=name, unproven=args.unproven)
        if args.format == "table":
            output += f"\n\nPlot written to {path}"
    return output


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lastiter", description="Last-iterate Renyi-DP accountants for DP-SGD.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("rdp", help="RDP epsilon (nats) at given orders")
    _bound_argument(p)
    p.add_argument("--orders", type=_orders, required=True, help="comma-separated, e.g. 2,4,8")
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_rdp)

    p = sub.add_parser("epsilon", help="(epsilon, delta) of one bound, or of best")
    _bound_argument(p)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--orders", type=_orders, help="default: the library's grid 1.01 .. 1e4")
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_epsilon)

    p = sub.add_parser("bounds", help="every bound: applies or why not, relation, proof status, epsilon")
    p.add_argument("--delta", type=float, help="also compute epsilon at this delta (needs --noise-multiplier)")
    p.add_argument("--orders", type=_orders)
    p.add_argument("--unproven", action="append", default=[], metavar="ID", help="also compute this unproven bound")
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_bounds)

    p = sub.add_parser("calibrate", help="smallest noise multiplier reaching a target epsilon")
    _bound_argument(p)
    p.add_argument("--target-epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--orders", type=_orders)
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_calibrate)

    p = sub.add_parser("compare", help="side-by-side comparison of every accountant")
    _compare_arguments(p)
    p.set_defaults(run=_cmd_compare)
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
