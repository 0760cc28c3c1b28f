r"""Every accountant side by side for one DP-SGD pipeline (``lastiter compare``).

One row per bound of the registry (read from the one evaluation path,
:func:`lastiter_plugins.evaluation.evaluate_bound`, the standard baselines included)
and per host accountant a user would otherwise run (display only, never counted).
Every row says whether it is valid for the declared pipeline (and if not, why), the
sampling schemes it covers, its neighbouring relation, the assumptions it uses,
epsilon at delta, the optimal Renyi order (RDP rows only) and what it protects (the
final model only, or every iterate). The best line of each relation is the
registry's ``best`` for it (:func:`lastiter_plugins.evaluation.best_of`): for the
declared relation, the number ``lp.epsilon("best")``, the CLI and the adapters report.

Modules, one job each: :mod:`.rows` (the data), :mod:`.table` (rows and best lines
from the registry), :mod:`.hosts` (what host libraries report), :mod:`.render`
(table, Markdown, JSON, CSV), :mod:`.sweep` (epsilon against epochs, the plot).
Scenario files live in :mod:`lastiter_plugins.scenarios`; the command line in
:mod:`lastiter_plugins.cli`.
"""

from lastiter_plugins.compare.hosts import HOST_ACCOUNTANTS, HostAccountant, host_versions
from lastiter_plugins.compare.render import (
    CSV_FIELDS,
    FORMATS,
    format_comparison,
    format_csv,
    format_markdown,
    format_table,
)
from lastiter_plugins.compare.rows import EVERY_ITERATE, FINAL_MODEL, BestLine, Comparison, Row, host_log
from lastiter_plugins.compare.sweep import DEFAULT_POINTS, epsilon_curves, sweep_epochs, write_plot
from lastiter_plugins.compare.table import best_lines, compare, compare_rows

__all__ = [
    "CSV_FIELDS",
    "DEFAULT_POINTS",
    "EVERY_ITERATE",
    "FINAL_MODEL",
    "FORMATS",
    "HOST_ACCOUNTANTS",
    "BestLine",
    "Comparison",
    "HostAccountant",
    "Row",
    "best_lines",
    "compare",
    "compare_rows",
    "epsilon_curves",
    "format_comparison",
    "format_csv",
    "format_markdown",
    "format_table",
    "host_log",
    "host_versions",
    "sweep_epochs",
    "write_plot",
]
