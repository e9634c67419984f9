#!/usr/bin/env bash
# Like ./start.sh, across three Sparks (TP=3: WORKER and WORKER2 in scripts/local.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TP=3
exec "$here/start.sh" "$@"
