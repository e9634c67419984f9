#!/usr/bin/env bash
# The whole test suite, set-up included: `./test.sh` (arguments go to pytest, e.g. `./test.sh -k plan`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/scripts/bootstrap.sh"
bootstrap engine,dev
cd "$here"
exec "$VENV/bin/python" -m pytest -q "$@"  # no path given: pyproject's testpaths (tests/)
