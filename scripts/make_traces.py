"""Write the classic scheduling scenarios as traces for `fairsched simulate`.

    .venv/bin/python scripts/make_traces.py [--out DIR] [--seed N] [NAME ...]
    .venv/bin/fairsched simulate DIR/starvation.jsonl --workers DIR/starvation.workers.toml

Each scenario gives NAME.jsonl (one job a line) and NAME.workers.toml (the slots it was
designed for). Names: starvation, office_day, on_demand_burst, noisy_neighbour (default: all
four), and
random_load (with --jobs N: N jobs at 0.95 of capacity, for benchmarks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairsched.sched import traces


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="scenarios to write (default: the four classic ones)")
    parser.add_argument("--out", default="traces", help="directory to write to (default: traces)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for the random ones")
    parser.add_argument("--jobs", type=int, default=1_000_000,
                        help="jobs in random_load (default: 1,000,000)")
    args = parser.parse_args(argv)
    known = [*traces.SCENARIOS, "random_load"]
    names = args.names or list(traces.SCENARIOS)
    for name in names:
        if name not in known:
            parser.error(f"unknown scenario {name!r} (known: {', '.join(known)})")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    out = Path(args.out)
    for name in names:
        seeded = {} if args.seed is None else {"seed": args.seed}
        if name == "random_load":
            scenario = traces.random_load(args.jobs, **seeded)
        elif name == "starvation":
            scenario = traces.starvation()
        else:
            scenario = traces.SCENARIOS[name](**seeded)
        try:
            trace, workers = scenario.write(out)
        except OSError as exc:
            print(f"make_traces: cannot write to {out}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"{trace}: {len(scenario.jobs)} jobs ({scenario.description}); slots in {workers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
