"""Shared helpers of the benchmark scripts: percentiles, machine facts, limits, reports.

Every number a script prints is measured in that run; nothing here holds a constant result.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_DOC = ROOT / "docs" / "benchmarks.md"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100, nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p99/p999/max/mean of durations in seconds, in milliseconds."""
    return {
        "n": len(values_s),
        "p50": pct(values_s, 50) * 1e3,
        "p99": pct(values_s, 99) * 1e3,
        "p999": pct(values_s, 99.9) * 1e3,
        "max": (max(values_s) * 1e3) if values_s else float("nan"),
        "mean": (statistics.fmean(values_s) * 1e3) if values_s else float("nan"),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, for the CPU share over a window."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return float(sum(parts) - idle), float(sum(parts))


def machine_info() -> dict[str, object]:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("grpcio", "protobuf", "deltalake", "pyspark"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "absent"
    try:
        sqlite_version = __import__("sqlite3").sqlite_version
    except ImportError:
        sqlite_version = "absent"
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit = commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite_version,
        "versions": versions,
        "commit": commit,
        "load_avg_1m": os.getloadavg()[0],
    }


def machine_line(info: dict[str, object]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in dict(info["versions"]).items())  # type: ignore[arg-type]
    return (f"{info['date']} · {info['nproc']} × {info['cpu_model']} · Linux {info['kernel']} · "
            f"Python {info['python']} · SQLite {info['sqlite']} · {versions} · "
            f"commit {info['commit']} · load avg at start {info['load_avg_1m']:.2f}")


def fsync_latency(directory: Path, samples: int, size: int = 1024) -> dict[str, float]:
    """Latency of append + os.fsync on a file in ``directory`` (the store's disk)."""
    path = directory / ".fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lat: list[float] = []
    try:
        payload = b"x" * size
        for _ in range(samples):
            os.write(fd, payload)
            t0 = time.perf_counter()
            os.fsync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    out = summary_ms(lat)
    out["per_s_serial"] = 1.0 / statistics.fmean(lat)
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (also readable as plain text)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            if value != value:  # NaN
                return "–"
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(
                value) < 1 else f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def append_report(title: str, info: dict[str, object], body: str, command: str) -> None:
    """Appends one run's tables to docs/benchmarks.md under the results section."""
    BENCH_DOC.parent.mkdir(parents=True, exist_ok=True)
    if not BENCH_DOC.exists():
        BENCH_DOC.write_text("# Benchmarks\n\n## Results (appended by the scripts)\n")
    with BENCH_DOC.open("a") as out:
        out.write(f"\n### {title} — {info['date']}\n\n")
        out.write(f"Machine: {machine_line(info)}  \nCommand: `{command}`\n\n")
        out.write(body.rstrip() + "\n")


def write_json(path: str | None, data: dict[str, object]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")


def publish(name: str, info: dict[str, object], body: str, result: dict[str, object],
            json_path: str | None, append: bool) -> None:
    """Prints a run's tables, writes its JSON and appends it to docs/benchmarks.md."""
    print()
    print(body)
    write_json(json_path, result)
    if append:
        command = f"python scripts/{name}.py " + " ".join(sys.argv[1:])
        append_report(name, info, body, command.strip())


def ratio_interval(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]],
                   level: float = 0.95, resamples: int = 2000,
                   seed: int = 20261123) -> tuple[float, float, float]:
    """The ratio of medians median(numerator) / median(denominator) of an A/B run, with a
    ``level`` bootstrap interval: (ratio, low, high).

    ``numerator[i]`` and ``denominator[i]`` are the samples of pair i (run back to back). The
    bootstrap resamples pairs (so drift between pairs widens the interval, as it should),
    then samples within each chosen pair (one sample per pair: just the pair). Percentile
    interval, fixed seed: the same samples give the same interval.
    """
    import random

    pairs = [(list(n), list(d)) for n, d in zip(numerator, denominator, strict=True)
             if n and d]
    if not pairs:
        nan = float("nan")
        return nan, nan, nan
    point = (statistics.median(v for n, _ in pairs for v in n)
             / statistics.median(v for _, d in pairs for v in d))
    rng = random.Random(seed)
    ratios: list[float] = []
    for _ in range(resamples):
        num: list[float] = []
        den: list[float] = []
        for _ in pairs:
            n, d = pairs[rng.randrange(len(pairs))]
            num += rng.choices(n, k=len(n)) if len(n) > 1 else n
            den += rng.choices(d, k=len(d)) if len(d) > 1 else d
        ratios.append(statistics.median(num) / statistics.median(den))
    tail = (1 - level) / 2 * 100
    return point, pct(ratios, tail), pct(ratios, 100 - tail)


def interval_text(ratio: float, low: float, high: float) -> str:
    """``1.23 [1.10, 1.40]``: a ratio with its interval."""
    return f"{ratio:.3f} [{low:.3f}, {high:.3f}]"


# ---------------------------------------------------------------- object-store requests

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def moto_requests(log_path: Path, marker: str, start: int = 0) -> list[tuple[str, str]]:
    """(method, path with query) of every request in moto's server log (the werkzeug access
    lines ``MotoServer(log_path=...)`` collects) from byte ``start`` on whose line holds
    ``marker`` (e.g. a run's own key prefix)."""
    found: list[tuple[str, str]] = []
    with open(log_path, "rb") as log:
        log.seek(start)
        for raw in log:
            line = _ANSI.sub("", raw.decode("utf-8", "replace"))
            if marker not in line or '"' not in line:
                continue
            request = line.split('"', 2)[1].split()
            if len(request) >= 2:
                found.append((request[0], request[1]))
    return found


def request_kinds(requests: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Counts of S3 API calls by kind, from (method, path) pairs of moto's log: ``LIST``,
    ``GET`` (object reads, ranged or not), ``HEAD``, ``PUT`` (single-request uploads and
    server-side copies alike: the log does not tell them apart), ``multipart`` (create, part,
    complete), ``DELETE``, ``POST`` (other)."""
    kinds: dict[str, int] = {}
    for method, path in requests:
        if method == "GET" and "list-type=" in path:
            kind = "LIST"
        elif "uploadId=" in path or (method == "POST" and "?uploads" in path):
            kind = "multipart"
        else:
            kind = method
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


# ---------------------------------------------------------------------- bulk-loaded history

HISTORY_SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "day", "type": "string", "nullable": True, "metadata": {}},
]})
HISTORY_STATS = json.dumps({"numRecords": 1000, "minValues": {"id": 0},
                            "maxValues": {"id": 999}, "nullCount": {"id": 0}})


def history_table_entry(table: str, txn_id: str, created_ms: int, written: bool,
                        version: int | None) -> str:
    """One table entry of a bulk-loaded transaction record (4 files of 100 kB when
    ``written``), in the JSON form TableEntry.json_text gives it."""
    write = "null"
    if written:
        files = ",".join(
            f'{{"path":"_percolake/{txn_id}/part-{f:05d}.parquet","size":100000,'
            f'"partition_values":{{}},"modification_time":{created_ms},'
            f'"stats":{json.dumps(HISTORY_STATS)}}}' for f in range(4))
        write = (f'{{"table":"{table}","mode":"append","add_files":[{files}],'
                 f'"schema_json":{json.dumps(HISTORY_SCHEMA_JSON)},"partition_by":[],'
                 f'"replace_partitions":[]}}')
    return (f'{{"table":"{table}","write_location":"{table}/_percolake/{txn_id}",'
            f'"write":{write},"delta_version":{"null" if version is None else version}}}')
