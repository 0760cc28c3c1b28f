"""The code blocks of README.md and docs/*.md, what each one is, and the one command that rewrites their outputs.

Every fenced block of README.md and docs/*.md (docs/derivations/ holds math, not code) is one of these, said by the
HTML comment on the line above it (the marker; a reader of the Markdown source sees it, a reader of the rendered
page does not):

* a ``python`` block: run, in page order, in one namespace per page, as a reader pasting the page's blocks into one
  session would. A number with two or more decimals in a comment of such a block (``# e.g. "... to 1.333"``) is a
  claim about what the block prints, and must appear in its output;
* a ``bash`` block: every command in it is a ``lastiter`` command, run (exit status 0) in a scratch folder where
  ``examples/`` is the repository's;
* ``<!-- not run: REASON -->``: a block the tests do not run, with the reason. A python fragment of a training loop
  (your data and model) names the ``examples/`` script that is its complete run, which a test runs;
* ``<!-- output of: COMMAND -->`` on a block without a language: the output of the ``lastiter`` command (or of
  ``python examples/NAME.py``, the example's ``main()``), as a fresh run prints it. Options after ``;``: ``abridged`` (the block shows some of the output's lines, ``...`` for those
  left out: each shown line, with the more-indented lines that continue it, is the fresh line with the same key,
  its text before two spaces with numbers and ``[n]`` left out), ``without opacus`` (the run without Opacus'
  accountants, as after the README's first command, which installs no Opacus);
* ``<!-- signature of: MODULE.NAME -->`` on a block without a language: the call signature of that object, checked
  (parameter names, kinds and defaults) against the code.

``<!-- numbers of: COMMAND -->`` above a paragraph of text: every decimal number in the paragraph appears in the
command's output. ``<!-- page: output of: COMMAND -->`` on the first line of a page: the rest of the page is the
command's output (docs/compare.md).

``python -m tests.stories.docs_blocks`` (from the repository root, in the test environment) rewrites every output
block and generated page from fresh runs; ``tests/stories/test_docs_samples.py`` fails while one differs. Paragraphs
under ``numbers of`` are prose and are edited by hand.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import importlib
import importlib.util
import inspect
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from tests.support import ROOT

#: the pages whose code blocks are checked: README.md and docs/*.md (docs/derivations/ holds math)
PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*(.*?)\s*-->")
_PAGE_MARKER = re.compile(r"\A<!--\s*page: output of:\s*(.*?)\s*-->\n")
_NUMBERS_MARKER = re.compile(r"^<!--\s*numbers of:\s*(.*?)\s*-->\n(.*?)(?:\n\n|\Z)", re.M | re.S)
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
_CLAIMED = re.compile(r"(?<![\w.])\d+\.\d{2,}(?![\w.])")  # in a code comment: a number the block prints
KINDS = ("not run", "output of", "signature of")


class DocsError(AssertionError):
    """A block of the docs that does not run, or whose text differs from what the code gives."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, its text and its marker."""

    page: str
    line: int  # of the opening fence, 1-based
    lang: str  # "python", "bash", or "" (an output or a signature)
    text: str
    kind: str  # one of KINDS, or "" (no marker: run)
    argument: str  # what follows the marker's kind: a reason, a command with options, an object's name
    start: int  # offsets of ``text`` in the page
    end: int

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` (relative to the repository root), each with the marker on the line above."""
    text = (ROOT / page).read_text(encoding="utf-8")
    out = []
    for match in _FENCE.finditer(text):
        above = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.fullmatch(above.strip())
        kind, argument = "", ""
        if marker:
            kind, _, argument = marker.group(1).partition(":")
            kind, argument = kind.strip(), argument.strip()
            if kind not in KINDS:
                raise DocsError(f"{page}:{text.count(chr(10), 0, match.start()) + 1}: unknown marker {above!r}")
        out.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2), kind,
                         argument, match.start(2), match.end(2)))  # fmt: skip
    return out


def paragraphs_with_numbers(page: str) -> list[tuple[str, str]]:
    """The (command, paragraph) pairs of ``page``'s ``numbers of`` markers."""
    return _NUMBERS_MARKER.findall((ROOT / page).read_text(encoding="utf-8"))


def decimals(text: str) -> list[str]:
    """The decimal numbers written in ``text`` (versions such as 0.4.3 left out)."""
    return _DECIMAL.findall(text)


def claimed_numbers(code: str) -> list[str]:
    """The numbers with two or more decimals in the comments of a python block."""
    comments = [line.split("#", 1)[1] for line in code.splitlines() if "#" in line]
    return [n for comment in comments for n in _CLAIMED.findall(comment)]


# ---------------------------------------------------------------- running lastiter


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    """A temporary working folder where ``examples/`` is the repository's and ``docs/`` an empty folder (a command
    that writes docs/compare.png writes it there)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder)
        (path / "examples").symlink_to(ROOT / "examples")
        (path / "docs").mkdir()
        before = os.getcwd()
        os.chdir(path)
        try:
            yield path
        finally:
            os.chdir(before)


def lastiter_argv(command: str) -> list[str]:
    """The arguments of one ``lastiter`` command line (a trailing ``# comment`` left out)."""
    argv = shlex.split(command, comments=True)
    if not argv or argv[0] != "lastiter":
        raise DocsError(f"not a lastiter command: {command!r}")
    return argv[1:]


def lastiter(command: str, without_opacus: bool = False) -> str:
    """What ``command`` (a ``lastiter`` command line) prints, run in this process in a scratch folder; raises
    DocsError when it exits with a status other than 0. Runs once per process: the blocks that show one command
    (however spelt) share one run."""
    return _lastiter(tuple(lastiter_argv(command)), without_opacus)


@functools.cache
def _lastiter(argv: tuple[str, ...], without_opacus: bool) -> str:
    from lastiter_plugins.cli import main
    from lastiter_plugins.compare import hosts

    out, err = io.StringIO(), io.StringIO()
    hidden = mock.patch.object(hosts, "_host_available", lambda host: host == "dp-accounting")
    hosts_shown = hidden if without_opacus else contextlib.nullcontext()
    with scratch_folder(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), hosts_shown:
        try:
            status = main(list(argv))
        except SystemExit as done:  # --version, --help: argparse exits
            status = done.code if isinstance(done.code, int) else 1
    if status != 0:
        raise DocsError(f"`{shlex.join(['lastiter', *argv])}` exited with status {status}: {err.getvalue().strip()}")
    return out.getvalue()


def shell_commands(block: Block) -> list[str]:
    """The command lines of a bash block (a line ending in ``\\`` continues on the next)."""
    return [c for c in block.text.replace("\\\n", " ").splitlines() if shlex.split(c, comments=True)]


# ---------------------------------------------------------------- output blocks


def _options(argument: str) -> tuple[str, set[str]]:
    command, *options = (part.strip() for part in argument.split(";"))
    unknown = set(options) - {"abridged", "without opacus"}
    if unknown:
        raise DocsError(f"unknown options {sorted(unknown)} in {argument!r}")
    return command, set(options)


def _key(line: str) -> str:
    """What identifies a line of lastiter's output across runs: its text before two spaces, without ``[n]``,
    numbers, or the length of a rule of dashes."""
    first = re.split(r"\s{2,}", re.sub(r" \[\d+\]", "", line.strip()))[0]
    return re.sub(r"-+", "-", re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", first))


def _units(lines: list[str]) -> list[list[str]]:
    """``lines`` grouped: a line with the more-indented lines that continue it."""
    units: list[list[str]] = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if units and line.strip() and units[-1][0].strip() and indent > len(units[-1][0]) - len(units[-1][0].lstrip()):
            units[-1].append(line)
        else:
            units.append([line])
    return units


def abridge(shown: str, fresh: str) -> str:
    """``shown`` (lines of an earlier output, ``...`` for lines left out) with each line replaced by the fresh line
    of the same key, found in order, with the fresh lines that continue it."""
    fresh_units = _units(fresh.splitlines())
    out: list[str] = []
    position = 0
    for unit in _units(shown.splitlines()):
        if unit[0].strip() == "...":
            out.append(unit[0])
            continue
        key = _key(unit[0])
        found = next((i for i in range(position, len(fresh_units)) if _key(fresh_units[i][0]) == key), None)
        if found is None:
            raise DocsError(f"the fresh output has no line like {unit[0]!r} (after the lines shown before it)")
        out.extend(fresh_units[found])
        position = found + 1
    return "\n".join(out) + "\n"


def regenerated(block: Block) -> str:
    """The text an ``output of`` block should have: from a fresh run of its command."""
    command, options = _options(block.argument)
    if command.startswith("python examples/"):
        return example_output(command)
    fresh = lastiter(command, without_opacus="without opacus" in options)
    return abridge(block.text, fresh) if "abridged" in options else fresh


@dataclass(frozen=True)
class GeneratedPage:
    """A page written whole by a command: its text is ``make()``'s. ``slow``: minutes (checked with --runslow)."""

    page: str
    command: str  # what a reader runs to regenerate it, as the page says
    make: Callable[[], str]
    slow: bool = False

    def committed(self) -> str:
        return (ROOT / self.page).read_text(encoding="utf-8")


@functools.cache
def example_output(command: str) -> str:
    """What ``python examples/NAME.py`` (no arguments) prints: its ``main()``, run in this process."""
    argv = shlex.split(command)
    if len(argv) != 2 or not argv[1].startswith("examples/"):
        raise DocsError(f"an example's output is that of `python examples/NAME.py` alone. Found {command!r}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _script(argv[1]).main()
    return out.getvalue()


def _script(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_output(head: str, command: str) -> str:
    return head + lastiter(command)


def _tightness() -> str:
    from lastiter_plugins.verification import tightness

    return tightness.to_markdown(
        tightness.compute(), 0.0, "python -m lastiter_plugins.verification.tightness --out docs"
    )


def generated_pages() -> list[GeneratedPage]:
    """The pages written whole: those whose first line is ``<!-- page: output of: COMMAND -->``, and the tables
    that scripts write (docs/anchor-table.md; docs/how-tight.md and docs/tightness.md, which take a minute or
    more, only with --runslow)."""
    out = []
    for page in PAGES:
        marker = _PAGE_MARKER.match((ROOT / page).read_text(encoding="utf-8"))
        if marker:
            out.append(GeneratedPage(page, marker.group(1), functools.partial(_with_output, *marker.group(0, 1))))
    out += [
        GeneratedPage("docs/anchor-table.md", "python scripts/anchor_table.py",
                      lambda: _script("scripts/anchor_table.py").page()),
        GeneratedPage("docs/how-tight.md", "python benchmarks/bench_lower_bounds.py > docs/how-tight.md",
                      lambda: _script("benchmarks/bench_lower_bounds.py").page(), slow=True),  # ~40 s of lower ends
        GeneratedPage("docs/tightness.md", "python -m lastiter_plugins.verification.tightness --out docs", _tightness,
                      slow=True),
    ]  # fmt: skip
    return out


def comparable(text: str) -> str:
    """``text`` without what changes from run to run: the durations of "Generated by ... in N s" lines and the cells
    of a table column headed ``seconds``."""
    out, column = [], None
    for line in text.splitlines():
        if line.startswith("Generated by"):
            line = re.sub(r" in \d+(?:\.\d+)? s\b", " in N s", line)
        cells = line.split("|")
        if line.startswith("|") and "seconds" in (c.strip() for c in cells):
            column = [c.strip() for c in cells].index("seconds")
        elif not line.startswith("|"):
            column = None
        elif column is not None and not set(line) <= set("|-: "):
            cells[column] = " N "
            line = "|".join(cells)
        out.append(line)
    return "\n".join(out)


def rewrite(slow: bool = False) -> list[str]:
    """Rewrite every output block, and every generated page (the slow ones only with ``slow``) whose text differs
    beyond timings, from fresh runs; return the pages changed."""
    changed = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        new = text
        for block in reversed(blocks(page)):
            if block.kind == "output of":
                new = new[: block.start] + regenerated(block) + new[block.end :]
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(page)
    for generated in generated_pages():
        if generated.slow and not slow:
            continue
        fresh = generated.make()
        if comparable(fresh) != comparable(generated.committed()):
            (ROOT / generated.page).write_text(fresh, encoding="utf-8")
            changed.append(generated.page)
    return changed


# ---------------------------------------------------------------- signatures


def _resolve(name: str) -> object:
    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def documented_parameters(block: Block) -> list[tuple[str, str, str | None]]:
    """(name, kind, default source) of each parameter a signature block shows."""
    text = " ".join(block.text.split())
    inside = text[text.index("(") + 1 : text.rindex(")")]
    function = ast.parse(f"def f({inside}): pass").body[0]
    assert isinstance(function, ast.FunctionDef)
    args = function.args
    out: list[tuple[str, str, str | None]] = []
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults, strict=True):
        out.append((arg.arg, "positional", None if default is None else ast.unparse(default)))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append((arg.arg, "keyword", None if kw_default is None else ast.unparse(kw_default)))
    return out


def _default_matches(source: str, value: object) -> bool:
    """A default shown as a literal equals the code's (an enum member's value: "sgd" for UpdateRule.SGD), one shown
    as a name is the enum member of that name (NeighboringRelation.REPLACE_ONE)."""
    try:
        shown = ast.literal_eval(source)
    except ValueError:
        return source == f"{type(value).__name__}.{getattr(value, 'name', value)}"
    return bool(shown == value or (isinstance(value, enum.Enum) and shown == value.value))


def _signature(obj: object) -> list[inspect.Parameter]:
    """The parameters a call of ``obj`` takes (a class: its ``__init__``'s, ``self`` and ``*args``/``**kwargs`` left
    out; an attrs class with a ``__new__`` of its own shows the generated ``__init__`` that way)."""
    function = obj.__init__ if inspect.isclass(obj) else obj  # type: ignore[misc]
    parameters = list(inspect.signature(function).parameters.values())[1 if inspect.isclass(obj) else 0 :]
    return [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def signature_differences(block: Block) -> list[str]:
    """How a signature block differs from the signature of the object its marker names (empty: it agrees)."""
    real = {p.name: p for p in _signature(_resolve(block.argument))}
    shown = documented_parameters(block)
    problems = []
    if [name for name, *_ in shown] != list(real):
        problems.append(f"parameters {[name for name, *_ in shown]} shown, {list(real)} in the code")
    for name, kind, default in shown:
        if name not in real:
            continue
        parameter = real[name]
        keyword_only = parameter.kind == parameter.KEYWORD_ONLY
        if (kind == "keyword") != keyword_only:
            problems.append(f"{name}: keyword-only in the code: {keyword_only}")
        if (default is None) != (parameter.default is parameter.empty) or (
            default is not None and not _default_matches(default, parameter.default)
        ):
            problems.append(f"{name}: default {default} shown, {parameter.default!r} in the code")
    return problems


if __name__ == "__main__":
    os.chdir(ROOT)
    pages = rewrite(slow="--runslow" in sys.argv[1:])
    print("rewritten: " + ", ".join(pages) if pages else "every output block is what a fresh run prints")
    sys.exit(0)
