#!/usr/bin/env bash
# Start serving GLM-5.3-Flash: `./start.sh`, `./start.sh restart`, `DRY_RUN=1 ./start.sh`.
# Extra arguments go to `engine serve` on every rank (`./start.sh restart --max-tokens 2048`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/scripts/bootstrap.sh"
bootstrap engine
if [ "${1:-}" = "restart" ]; then
    shift
    exec "$VENV/bin/sparks" restart "$@"
fi
exec "$VENV/bin/sparks" start "$@"
