"""The ``controller-regret`` report: the learning controller against every other policy.

The analysis (the regret ratio per setting, its table, claim and figure) lives with the other
regret tools in :mod:`bastion.sim.regret`; this module is its entry in the report registry.

What this module does not do: anything of its own.
"""

from __future__ import annotations

from pathlib import Path

from bastion.guard import public
from bastion.sim.reporting import Row, report_guard

__all__ = ["report"]


@public
@report_guard("controller-regret")
def report(rows: list[Row], out: Path) -> str:
    from bastion.sim.regret import regret_report

    return regret_report(rows, out)
