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
# SeaweedFS's S3 gateway, the real S3 server the object-store semantic tests run on beside moto
# (tests/seaweed_support.py): built once per version with Go from the Go module proxy into a
# cache outside the venv (a few minutes of CPU, niced). Not `go install module@version`: the
# module's go.mod has a replace directive, which go install refuses; so its source is fetched
# with `go mod download` and built as the main module. Without Go, or if the build fails, those
# tests are skipped, saying so. Only the test command asks for it (PERCOLAKE_SETUP_SEAWEEDFS=1):
# the demo does not wait for a build it does not use.
if [[ "${PERCOLAKE_SETUP_SEAWEEDFS:-0}" == 1 ]]; then
weed="$(cd "$ROOT" && "$VENV/bin/python" -c \
  'from tests.seaweed_support import weed_cache_path as w, WEED_MODULE as m, WEED_VERSION as v
print(w()); print(f"{m}@{v}")')"
weed_path="$(sed -n 1p <<<"$weed")"
weed_module="$(sed -n 2p <<<"$weed")"
if [[ ! -x "$weed_path" && -z "${PERCOLAKE_WEED:-}" ]]; then
  if command -v go >/dev/null 2>&1; then
    echo "percolake: building SeaweedFS ($weed_module) into $weed_path (once, a few minutes)" >&2
    mkdir -p "$(dirname "$weed_path")"
    log="$(dirname "$weed_path")/build.log"
    started=$SECONDS
    if (set -e
        source_dir="$(go mod download -json "$weed_module" \
          | "$VENV/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
        cd "$source_dir"
        GOFLAGS=-buildvcs=false nice -n 10 go build -trimpath -ldflags "-s -w" \
          -o "$weed_path.partial" ./weed
        mv "$weed_path.partial" "$weed_path") >"$log" 2>&1; then
      echo "percolake: SeaweedFS built in $((SECONDS - started)) s" >&2
    else
      tail -n 20 "$log" >&2
      echo "percolake: could not build SeaweedFS (log: $log); its S3 tests will be skipped" >&2
    fi
  else
    echo "percolake: no Go on this machine: the SeaweedFS S3 tests will be skipped" >&2
  fi
fi
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
