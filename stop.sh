#!/usr/bin/env bash
# Stop every rank; each rank's log is saved (gzipped) under LOG_DIR.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/scripts/bootstrap.sh"
bootstrap engine
exec "$VENV/bin/sparks" stop "$@"
