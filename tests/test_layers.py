"""The layering rules, read from the imports of every module of each package.

``percolake`` (shared protocol and lake code) sits under both ``coordinator`` (the daemon) and
``sparkside`` (the Spark client): the Spark side never imports the daemon, the daemon never
imports Spark, and the shared layer imports neither. Inside ``coordinator`` every top-level
module and subpackage has a layer (docs/design-notes.md, "Layers of the daemon") and imports only
its own layer and those below.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "sparkside": {"coordinator"},
    "coordinator": {"pyspark", "sparkside"},
    "percolake": {"coordinator", "sparkside", "pyspark"},
}

# The layers of coordinator/, from the bottom up: each names its top-level modules and
# subpackages ("__init__" is coordinator/__init__.py).
Layers = tuple[tuple[str, frozenset[str]], ...]
COORDINATOR_LAYERS: Layers = (
    ("foundation", frozenset({"__init__", "auth_records", "validation", "status_codes",
                              "principal", "metrics", "logs"})),
    ("store", frozenset({"store", "oracle"})),
    ("core", frozenset({"core"})),
    ("service", frozenset({"auth", "leadership", "servicer", "limits", "tls", "views",
                           "table_names", "web", "http_serving", "metrics_endpoint", "server"})),
    ("command line", frozenset({"cli", "__main__", "launcher"})),
)


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


def unit_of(source: Path, package_dir: Path) -> str:
    """The top-level module or subpackage of ``package_dir`` that ``source`` belongs to."""
    first = source.relative_to(package_dir).parts[0]
    return first.removesuffix(".py")


def imported_units(source: Path, package_dir: Path) -> set[str]:
    """The top-level modules and subpackages of ``package_dir`` a module of it imports,
    absolutely or relatively, anywhere in it; "__init__" for the package itself."""
    package = package_dir.name
    own_package = [package, *source.parent.relative_to(package_dir).parts]
    units: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = own_package[:len(own_package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            targets = [[*module, alias.name] for alias in node.names]
        else:
            continue
        for parts in targets:
            if parts[0] != package:
                continue
            child = package_dir / parts[1] if len(parts) > 1 else None
            is_unit = child is not None and (child.is_dir() or child.with_suffix(".py").is_file())
            units.add(parts[1] if is_unit else "__init__")
    return units


def units_without_layer(package_dir: Path, layers: Layers) -> list[str]:
    placed = set().union(*(units for _, units in layers))
    present = {unit_of(path, package_dir) for path in package_dir.rglob("*.py")}
    unplaced = [f"{package_dir.name}/{unit} has no layer" for unit in sorted(present - placed)]
    return unplaced + [f"{unit} has a layer but is not in {package_dir.name}/"
                       for unit in sorted(placed - present)]


def upward_imports(package_dir: Path, layers: Layers) -> list[str]:
    """Every import of a module of ``package_dir`` that reaches a higher layer than its own."""
    rank = {unit: index for index, (_, units) in enumerate(layers) for unit in units}
    names = [name for name, _ in layers]
    offences = []
    for path in sorted(package_dir.rglob("*.py")):
        own = rank.get(unit_of(path, package_dir))
        for unit in sorted(imported_units(path, package_dir)):
            if own is not None and rank.get(unit, -1) > own:
                offences.append(f"{path.relative_to(package_dir.parent)} ({names[own]}) imports "
                                f"{package_dir.name}.{unit} ({names[rank[unit]]})")
    return offences


def test_every_coordinator_module_has_a_layer() -> None:
    assert not units_without_layer(ROOT / "coordinator", COORDINATOR_LAYERS), \
        "place it in COORDINATOR_LAYERS and docs/design-notes.md (Layers of the daemon)"


def test_no_coordinator_import_runs_back_up_the_layers() -> None:
    offences = upward_imports(ROOT / "coordinator", COORDINATOR_LAYERS)
    assert not offences, "an import runs back up the layers:\n" + "\n".join(offences)


def test_the_layer_check_finds_an_import_back_up(tmp_path: Path) -> None:
    package = tmp_path / "coordinator"
    for folder in ("store", "cli"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "validation.py").write_text("import coordinator.store.base\n")
    (package / "store" / "base.py").write_text(
        "from coordinator import validation\nfrom . import memory\n"
        "def f():\n    from ..cli import main\n")
    (package / "cli" / "main.py").write_text("from coordinator.store import base\n")
    layers: Layers = (("low", frozenset({"__init__", "validation"})),
                      ("store", frozenset({"store"})), ("top", frozenset({"cli", "web"})))
    assert upward_imports(package, layers) == [
        "coordinator/store/base.py (store) imports coordinator.cli (top)",
        "coordinator/validation.py (low) imports coordinator.store (store)",
    ]
    assert units_without_layer(package, layers[1:]) == [
        "coordinator/__init__ has no layer", "coordinator/validation has no layer",
        "web has a layer but is not in coordinator/"]


def test_the_operators_commands_start_without_the_daemon_or_the_lakes_engines() -> None:
    """``percolake-coordinator status`` and the other commands that only call a coordinator load
    neither the daemon's core nor pyarrow, numpy or delta-rs (they took most of a command's
    start-up); ``serve`` and ``optimize`` load what they run when they run it."""
    heavy = ("coordinator.core", "coordinator.server", "coordinator.store", "pyarrow", "numpy",
             "deltalake")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; import coordinator.cli.program; "
         f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


def _lake_engines_mapped(pid: int) -> set[str]:
    """Which of the lake's native engines (pyarrow's libarrow, delta-rs's extension) the
    process has mapped: loaded, that is."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {name for name, marker in (("pyarrow", "libarrow"), ("deltalake", "/deltalake/"))
            if marker in maps}


def test_a_daemon_serving_no_table_never_loads_the_lakes_engines(daemon_factory) -> None:
    """The daemon loads pyarrow and delta-rs at the first request that needs them (a quarter
    of a daemon's start-up here): one whose transactions write no table never does."""
    from percolake.v1 import coordinator_pb2 as pb
    from tests.daemon_support import table_write, unique

    daemon = daemon_factory.start(name="no-lake")
    stub = daemon.stub
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("p")),
                               timeout=30).transaction
    assert stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                  timeout=30).transaction.state in (pb.COMMITTED, pb.APPLIED)
    assert _lake_engines_mapped(daemon.process.pid) == set()

    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("q")),
                               timeout=30).transaction
    table = str(daemon.warehouse / unique("t"))
    assert stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=[table], writes=[table_write(table, txn.txn_id)]),
        timeout=30).transaction.state in (pb.COMMITTED, pb.APPLIED)  # checked on the table
    assert _lake_engines_mapped(daemon.process.pid) == {"pyarrow", "deltalake"}
