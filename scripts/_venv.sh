# Sourced by scripts/demo.sh and scripts/test.sh: makes ./.venv with percolake and its dev extras.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PERCOLAKE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if ! command -v java >/dev/null 2>&1; then
  echo "percolake: Java 17+ is needed by PySpark; install it (apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "percolake: creating virtualenv $VENV" >&2
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.percolake-installed"
if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" ]]; then
  echo "percolake: installing dependencies into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
