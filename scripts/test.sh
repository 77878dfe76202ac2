#!/usr/bin/env bash
# Runs the whole test suite (installs what it needs into ./.venv first). Extra args go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
ruff check .
exec python -m pytest -q -p no:cacheprovider "$@"
