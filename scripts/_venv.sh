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
  echo "percolake: installing dependencies into $VENV (first run takes a minute or two)" >&2
  # uv (from PyPI) installs the same packages as pip in a third of pip's time on a clean
  # machine (parallel downloads, one build of PySpark's sdist); pip where uv cannot be had or
  # cannot install them (uv reads neither pip's configuration files nor its PIP_* variables;
  # it trusts the system's certificates, as pip configured with them does). Both compile the
  # packages' bytecode at install, as Python cannot where PYTHONDONTWRITEBYTECODE is set: each
  # process would compile what it imports again.
  if ! { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "uv>=0.9,<1" \
      && UV_NATIVE_TLS=1 "$VENV/bin/uv" pip install --quiet --compile-bytecode \
        --python "$VENV/bin/python" -e "$ROOT[dev]"; }; then
    echo "percolake: uv could not install the dependencies; installing with pip" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  fi
  touch "$stamp"
fi
# delta-spark's jars and Hadoop's S3 connector come from Maven Central through Spark's Ivy
# (spark.jars.packages) on first use; fetched here once, saying so, so that the demo and the
# tests do not pause silently.
jars_conf='from sparkside.session import S3_CONNECTOR as p, S3_CONNECTOR_EXCLUDES as x
conf = {"spark.jars.packages": ",".join(p), "spark.jars.excludes": ",".join(x)}'
notice="$("$VENV/bin/python" -c "$jars_conf"'
from sparkside.session import first_fetch_notice as n; print(n(conf) or "")')"
if [[ -n "$notice" ]]; then
  echo "$notice" >&2
  log="$VENV/.percolake-jars.log"
  started=$SECONDS
  if ! "$VENV/bin/python" -c "$jars_conf"'
from sparkside import local_spark; local_spark("percolake-jars", 1, conf).stop()' \
      >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "percolake: could not download Spark's jars from Maven Central (log: $log)" >&2
    exit 1
  fi
  echo "percolake: Spark's jars downloaded in $((SECONDS - started)) s" >&2
fi
# The project's own modules (an editable install is not compiled): the daemons, drivers and
# command-line runs the tests start import them anew, 0.3 CPU-seconds a daemon without bytecode.
# Only what changed is compiled again; a module that does not compile is left to ruff and
# pytest to report (compileall prints it too).
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/percolake" "$ROOT/coordinator" \
  "$ROOT/sparkside" "$ROOT/tests" || true
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
