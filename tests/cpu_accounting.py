"""CPU-seconds per test, child processes included: ``pytest -p tests.cpu_accounting``.

The suite is CPU-bound on CI's two cores, so a test's cost is its CPU, not its wall time under
load. Each test's CPU is that of the worker process, of every live descendant (Spark's JVM, a
daemon, a driver) and of the children reaped meanwhile, from ``/proc``; at the end the slowest
are printed, and written as JSON lines to ``PERCOLAKE_TEST_CPU`` if that names a file.
Processes a killed parent leaves behind (a crash test's Spark driver JVM) leave that tree: run
the tests with ``-n 0`` inside a cgroup and name its ``cpuacct.usage`` in
``PERCOLAKE_TEST_CPUACCT`` to count them too.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")
_spent: dict[str, float] = {}


def _processes() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Each process's children and CPU-seconds (with its reaped children's), one pass over
    ``/proc``."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = sum(int(x) for x in fields[11:15]) / _TICKS  # utime stime cutime cstime
    return children, cpu


def _cpu_now() -> float:
    usage = os.environ.get("PERCOLAKE_TEST_CPUACCT")
    if usage:  # a cgroup's cpuacct.usage (ns), with -n 0: orphaned and reparented ones too
        return int(Path(usage).read_text()) / 1e9
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    children, cpu = _processes()
    stack = list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
    before = _cpu_now()
    yield
    _spent[item.nodeid] = _cpu_now() - before
    out = os.environ.get("PERCOLAKE_TEST_CPU")
    if out:
        with open(out, "a") as lines:
            lines.write(json.dumps({"test": item.nodeid, "cpu_s": _spent[item.nodeid]}) + "\n")


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    if not _spent:
        return
    total = sum(_spent.values())
    terminalreporter.section(f"CPU-seconds (with child processes), {total:.0f} in all")
    for nodeid, spent in sorted(_spent.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{spent:8.1f}  {nodeid}")
