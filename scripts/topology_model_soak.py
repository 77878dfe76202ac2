"""Soak of the topology's stateful model (tests/topology_model.py): many random sequences of
topology operations against an in-process coordinator, each checked against the reference
model (T1-T4, every change delivered once downstream, the lineage refusals).

    python scripts/topology_model_soak.py --examples 5000 --steps 60

Prints what the runs exercised; exits 1 with hypothesis's shrunk failing sequence(s) if the
model found a defect (give each its own regression test). No Spark, no daemon."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.topology_model import TopologyModel, model_settings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000,
                        help="random operation sequences to run (default 2000)")
    parser.add_argument("--steps", type=int, default=60,
                        help="operations per sequence at most (default 60)")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.steps < 1:
        parser.error("--examples and --steps are at least 1")
    TopologyModel.TestCase.settings = model_settings(args.examples, args.steps,
                                                     derandomize=False)
    started = time.monotonic()
    outcome = "FAILED"
    try:
        TopologyModel.TestCase().runTest()  # a defect: hypothesis prints the shrunk sequence
        outcome = "passed"
    finally:
        exercised = ", ".join(f"{n} {what}" for what, n in sorted(TopologyModel.stats.items()))
        print(f"{outcome}: {args.examples} examples of up to {args.steps} steps in "
              f"{time.monotonic() - started:.0f} s; {exercised}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
