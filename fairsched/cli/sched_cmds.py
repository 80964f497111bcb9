"""`fairsched explain` and `fairsched simulate`: the scheduling weights and policies, measured.

Thin layers over fairsched.sched; every error is one line on stderr with the exit code of
the README (1: the operation failed, 2: bad usage, bad configuration or a bad trace).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import click

from fairsched import core
from fairsched.cli import main
from fairsched.cli.common import (
    bound_database_waits,
    output,
    parse_job_id,
    reports_errors,
    require_stdout,
)
from fairsched.config import DEFAULT_CONFIG, load_config, read_config, resolve_config_path
from fairsched.errors import path_name


def _finite(value):
    """JSON has no infinity or NaN: an infinite time (age_weight 0) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@main.command()
@click.option("--config", "config_path", metavar="PATH",
              help="workers.toml (default: $FAIRSCHED_CONFIG or ./workers.toml; without one, "
                   "the default weights).")
@click.option("--job", "job_id", metavar="ID", help="Break down a pending job's current score.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--plot", "plot_path", metavar="PNG", help="Also draw the score lines to a file.")
@reports_errors
def explain(config_path, job_id, as_json, plot_path):
    """The scoring weights in effect and what they mean in time."""
    from fairsched.sched import explain as ex

    require_stdout()
    job_id = parse_job_id(job_id, "--job") if job_id is not None else None
    plots = _plots_for(plot_path)  # before the database is asked: the plot is what was wanted
    from fairsched.store.database import ENV_URL

    path = resolve_config_path(config_path)
    implicit = config_path is None and not os.environ.get("FAIRSCHED_CONFIG")
    # A job needs a database: a workers.toml's, or, on a host that only queues work (as
    # `jobs` and `submit` there), FAIRSCHED_DATABASE_URL's.
    if (implicit and not Path(DEFAULT_CONFIG).exists()
            and (job_id is None or os.environ.get(ENV_URL))):
        config, weights, source = None, core.Weights(), "defaults: no ./workers.toml"
    else:
        config = load_config(path)
        weights, source = config.scoring, f"[scoring] of {path_name(config.path)}"
        if "scoring" not in read_config(config.path):
            source = f"defaults: {path_name(config.path)} has no [scoring]"
    if job_id is not None:
        bound_database_waits()
    job = ex.explain_job(config, job_id) if job_id is not None else None
    if plots:
        plots.plot_score_lines(weights, plot_path)
    if as_json:
        w = weights
        out = {
            "source": source,
            "weights": {"priority_weight": w.priority, "age_weight": w.age,
                        "rarity_weight": w.rarity, "on_demand_bonus": w.on_demand,
                        "on_demand_age_weight": w.on_demand_age, "tenant_weight": w.tenant},
            "priority_crossovers": [{"gap": g, "seconds": s}
                                    for g, s in ex.priority_crossovers(w)],
            "on_demand_crossover": ex.on_demand_crossover(w),
            "rarity_bonuses": [{"free_slots": n, "points": p} for n, p in ex.rarity_bonuses(w)],
        }
        if job is not None:
            out["job"] = job.as_dict()
        output(json.dumps(_finite(out), indent=2))
        return
    if job is not None:
        output(ex.job_report(job, weights))
    else:
        output(ex.weights_report(weights, source))
    if plot_path:
        output(f"score lines drawn to {path_name(plot_path)}")


@main.command(short_help="Replay a job trace against the configured slots, per policy.")
@click.argument("trace_path", metavar="TRACE")
@click.option("--policy", "policies", multiple=True, metavar="NAME",
              help="fairsched, fifo, priority or optimal; repeat to compare "
                   "(default: fairsched, fifo and priority).")
@click.option("--workers", "--config", "config_path", metavar="PATH",
              help="workers.toml with the slots and [scoring] (default: $FAIRSCHED_CONFIG or "
                   "./workers.toml).")
@click.option("--tick", metavar="S", default="0",
              help="Plan only every S seconds, as a polling supervisor would (default 0: after "
                   "every event).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--plot", "plot_path", metavar="PNG", help="Also draw waits over time to a file.")
@reports_errors
def simulate(trace_path, policies, config_path, tick, as_json, plot_path):
    """Replay a JSON-lines job TRACE ('-': standard input) against the configured slots,
    policy by policy."""
    from fairsched.sched import report, traces
    from fairsched.sched import simulate as sim

    require_stdout()  # before a replay that may take a while
    policies = [name.lower() for name in policies]  # --policy FIFO is fifo
    for name in policies:
        if name not in sim.POLICIES:
            raise click.BadParameter(f"unknown policy {name!r} (known: {', '.join(sim.POLICIES)})",
                                     param_hint="--policy")
    try:
        tick = float(tick)
    except ValueError:
        tick = -1.0
    if not (tick == 0 or traces.MIN_TICK <= tick <= traces.MAX_SECONDS):
        raise click.BadParameter(f"must be 0 or a number of seconds from {traces.MIN_TICK:g} to "
                                 f"{traces.MAX_SECONDS:g}", param_hint="--tick")
    policies = list(dict.fromkeys(policies)) or list(sim.DEFAULT_POLICIES)
    plots = _plots_for(plot_path)  # before a replay that may take a while, not after it
    config = load_config(resolve_config_path(config_path))
    type_ids = sim.type_ids_of(config)
    trace = traces.read_trace(trace_path, type_ids)
    slots = sim.slot_layout(config, type_ids)
    results = [sim.simulate(trace, slots, config.scoring, name, tick, config.matching,
                            config.usage_half_life)
               for name in policies]
    # With tenants: per-tenant waits and the fairness index, against each tenant alone.
    alone = (dict(zip(trace.tenant_names, sim.tenant_alone(trace, slots), strict=True))
             if len(trace.tenant_names) > 1 else None)
    if plots:
        plots.plot_waits(trace, results, plot_path)
    if as_json:
        output(json.dumps(_finite(report.report_json(trace, len(slots), results, alone)),
                          indent=2))
    else:
        output(report.report_table(trace, len(slots), results))
        if alone is not None:
            output("\n" + report.tenant_table(trace, results, alone))
        if plot_path:
            output(f"waits drawn to {path_name(plot_path)}")


def _plots_for(plot_path):
    """The plots module when a plot is asked for, checked first to be able to draw (matplotlib
    installed, a folder to write to): a missing extra or folder is said before any work is
    done. None otherwise."""
    if plot_path is None:
        return None
    if not plot_path:  # `--plot "$OUT"` with OUT unset: no file to draw to, not "no plot"
        raise click.BadParameter("must be a file name, got ''", param_hint="--plot")
    from fairsched.sched import plots

    plots.require(plot_path)
    return plots
