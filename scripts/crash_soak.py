#!/usr/bin/env python
"""Long mode of the fault-injection suite (issue 5): loops random crash points for M minutes.

Each trial is one scenario of ``tests/crash/scenarios.py`` in a fresh folder (real coordinator,
Spark driver and reader processes; C9 uses light participants), with a random crash moment, and
is verified by the checker. At the end (and on Ctrl-C) it prints a table:

    crash point | trials | batches verified | snapshot reads checked | violations | errors

``violations`` are broken invariants; ``errors`` are trials that could not be staged (a process
hung, a failpoint was never reached). Folders of failed trials are kept for inspection.

    python scripts/crash_soak.py --minutes 30 [--points C1,C9] [--seed 7] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.crash.scenarios import CRASH_POINTS, SPARK_FREE  # noqa: E402


@dataclass
class Row:
    trials: int = 0
    batches: int = 0
    reads: int = 0
    violations: int = 0
    errors: int = 0
    seconds: float = 0.0
    failed_dirs: list[str] = field(default_factory=list)


def spark_available() -> bool:
    try:
        from sparkside import Participant  # noqa: F401
    except ImportError:
        return False
    return shutil.which("java") is not None


def table(rows: dict[str, Row]) -> str:
    header = ("crash point", "trials", "batches verified", "snapshot reads checked",
              "violations", "errors", "seconds")
    lines = [header]
    total = Row()
    for point in sorted(rows, key=lambda p: (int(re.match(r"C(\d+)", p).group(1)), p)):
        r = rows[point]
        lines.append((point, str(r.trials), str(r.batches), str(r.reads), str(r.violations),
                      str(r.errors), f"{r.seconds:.0f}"))
        for name in ("trials", "batches", "reads", "violations", "errors", "seconds"):
            setattr(total, name, getattr(total, name) + getattr(r, name))
    lines.append(("total", str(total.trials), str(total.batches), str(total.reads),
                  str(total.violations), str(total.errors), f"{total.seconds:.0f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True))
                   + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--points", default="",
                        help="comma-separated crash points (default: all available)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", default=None, help="where trial folders go")
    args = parser.parse_args(argv)

    points = [p.strip() for p in args.points.split(",") if p.strip()] or list(CRASH_POINTS)
    unknown = [p for p in points if p not in CRASH_POINTS]
    if unknown:
        parser.error(f"unknown crash points {unknown}; known: {', '.join(CRASH_POINTS)}")
    if not spark_available():
        skipped = [p for p in points if p not in SPARK_FREE]
        points = [p for p in points if p in SPARK_FREE]
        if skipped:
            print(f"no Spark participant (sparkside.Participant) or Java: skipping {skipped}",
                  flush=True)
        if not points:
            print("nothing to run", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.minutes} min over {', '.join(points)}; seed {seed}; in {workdir}",
          flush=True)
    rows = {p: Row() for p in points}
    deadline = time.monotonic() + args.minutes * 60
    trial = 0
    try:
        while time.monotonic() < deadline:
            point = rng.choice(points)
            trial += 1
            folder = workdir / f"{trial:04d}-{point}"
            folder.mkdir()
            started = time.monotonic()
            row = rows[point]
            row.trials += 1
            try:
                outcome = CRASH_POINTS[point](folder, random.Random(rng.randrange(1 << 30)))
            except Exception:
                row.errors += 1
                row.failed_dirs.append(str(folder))
                (folder / "error.txt").write_text(traceback.format_exc())
                print(f"[{trial}] {point}: ERROR (kept {folder})\n{traceback.format_exc()}",
                      flush=True)
            else:
                report = outcome.report
                row.batches += report.batches_verified
                row.reads += report.snapshot_reads_checked
                row.violations += len(report.violations)
                status = "ok" if not report.violations else "VIOLATIONS"
                print(f"[{trial}] {point}: {status} {report.batches_verified} batches, "
                      f"{report.snapshot_reads_checked} reads, {time.monotonic() - started:.0f} s",
                      flush=True)
                if outcome.notes.get("events"):  # what was killed when (C11 among the kills)
                    print("    " + "; ".join(outcome.notes["events"]), flush=True)
                if report.violations:
                    row.failed_dirs.append(str(folder))
                    (folder / "violations.txt").write_text(outcome.summary())
                    print(outcome.summary(), flush=True)
                else:
                    shutil.rmtree(folder, ignore_errors=True)
            row.seconds += time.monotonic() - started
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(table(rows), flush=True)
    kept = [d for r in rows.values() for d in r.failed_dirs]
    if kept:
        print("kept for inspection:\n  " + "\n  ".join(kept))
    return 1 if any(r.violations or r.errors for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
