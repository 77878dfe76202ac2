"""The layering rules, read from the imports of every module of each package.

``percolake`` (shared protocol and lake code) sits under both ``coordinator`` (the daemon) and
``sparkside`` (the Spark client): the Spark side never imports the daemon, the daemon never
imports Spark, and the shared layer imports neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "sparkside": {"coordinator"},
    "coordinator": {"pyspark", "sparkside"},
    "percolake": {"coordinator", "sparkside", "pyspark"},
}


def imported_packages(source: Path) -> set[str]:
    """Top-level package names a module imports, anywhere in it (also inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules_of(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_layer_may(package: str) -> None:
    modules = modules_of(package)
    assert modules, f"no modules found under {package}/"
    offences = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules
        for name in sorted(imported_packages(path) & FORBIDDEN[package])
    ]
    assert not offences, "layering broken:\n" + "\n".join(offences)


def test_the_reader_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from coordinator.core import X\n    import pyspark.sql\n")
    assert imported_packages(module) == {"coordinator", "pyspark"}
