#!/usr/bin/env bash
# Runs the whole test suite (installs what it needs into ./.venv first). Extra args go to pytest.
#   scripts/test.sh --quick   the inner loop: no Spark, no Spark cluster, no slow kill-and-restart
#                             tests (a few minutes at most)
# The tests run on PERCOLAKE_TEST_WORKERS pytest-xdist workers (default 4: most tests wait on
# child processes more than they compute); tests/conftest.py groups the tests that share a
# SparkSession, the Spark cluster or a module's daemon onto one worker. `-n 0` runs them in this
# process, one after another.
quick=0
args=()
for arg in "$@"; do
  if [[ "$arg" == "--quick" ]]; then quick=1; else args+=("$arg"); fi
done
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
if (( quick )); then
  ruff check .
  exec python -m pytest -q -p no:cacheprovider --durations=25 \
    -n "${PERCOLAKE_TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder \
    -m "not spark and not slow" --ignore=tests/spark ${args[@]+"${args[@]}"}
fi
# The web view's test loads each page in headless Chromium (Debian's package); without it that
# test is skipped, saying so.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [[ "$(id -u)" == 0 ]]; then
  echo "percolake: installing Debian's chromium for the web view test (apt-get, once)" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      >/tmp/percolake-chromium-install.log 2>&1; then
    echo "percolake: could not install chromium (log: /tmp/percolake-chromium-install.log);" \
         "the web view's browser test will be skipped" >&2
  fi
fi
ruff check .
exec python -m pytest -q -p no:cacheprovider --durations=25 \
  -n "${PERCOLAKE_TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder ${args[@]+"${args[@]}"}
