#!/usr/bin/env bash
# Runs the whole test suite (installs what it needs into ./.venv first). Extra args go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
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
exec python -m pytest -q -p no:cacheprovider --durations=25 "$@"
