#!/usr/bin/env bash
# Runs the demo: coordinator + a streaming bank-transfer job over three Delta tables.
# --ha: two coordinators on an embedded PostgreSQL, the leader SIGKILLed half-way (see
# docs/high-availability.md); --s3, --cluster, --warehouse: see scripts/demo.py --help.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec python scripts/demo.py "$@"
