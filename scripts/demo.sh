#!/usr/bin/env bash
# Runs the demo: coordinator + a streaming bank-transfer job over three Delta tables.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec python scripts/demo.py "$@"
