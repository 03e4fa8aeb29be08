"""The plans of `serving.plan` drawn: each priced plan that fits, hours against cost, the
Pareto front joined, the deadline and the budget."""

from __future__ import annotations

from collections.abc import Sequence

from mdot_jax.errors import RequestError
from mdot_jax.serving import figures
from mdot_jax.serving.plan import Option, Plan, pareto


def plot(options: Sequence[Option], path: str, request: Plan | None = None) -> None:
    """Hours against cost of every priced option that fits (feasible ones in colour), the
    Pareto front joined, the deadline and the budget drawn."""
    fits = [o for o in options if o.cost_usd is not None and o.hours is not None
            and not any("does not fit" in r for r in o.reasons)]
    if not fits:
        raise RequestError("prices: no plan that fits has a price to plot", "prices")
    front, feasible = pareto(fits), [o for o in fits if o.feasible]
    fig, ax = figures.pyplot().subplots(figsize=(7, 4.5))
    late = [o for o in fits if not o.feasible]
    if late:
        ax.scatter(*_xy(late), s=14, color="0.7", label="past the deadline or the budget")
    if feasible:
        ax.scatter(*_xy(feasible), s=18, color="C0", label="feasible")
    if front:
        ax.plot(*_xy(front), "o-", color="C3", label="Pareto front")
    named = front or pareto(fits, feasible=False)  # none feasible: the nearest trade-offs
    for o, x, y in zip(named, *_xy(named)):
        ax.annotate(f"{o.gpus} x {o.device.removeprefix('nvidia-')}", (x, y), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    hours, costs = _xy(fits)  # the axes' ranges, the deadline's and budget's lines in them
    if request and request.deadline_h:
        ax.axvline(request.deadline_h, ls="--", color="0.4", lw=1)
        hours.append(request.deadline_h)
    if request and request.budget_usd:
        ax.axhline(request.budget_usd, ls="--", color="0.4", lw=1)
        costs.append(request.budget_usd)
    figures.plain_log(ax.xaxis, hours)
    figures.plain_log(ax.yaxis, costs)
    ax.set(xlabel="job time (h)", ylabel="cost (USD)", title="plans that fit: time against cost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    figures.save(fig, path)


def _xy(options: Sequence[Option]) -> tuple[list[float], list[float]]:
    """Hours and costs of priced options."""
    return [float(o.hours or 0.0) for o in options], [float(o.cost_usd or 0.0) for o in options]
