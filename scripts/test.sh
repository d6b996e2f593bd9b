#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, the slow real tier included.
#   scripts/test.sh                 everything
#   scripts/test.sh -m 'not slow'   the fast tier only (any pytest arguments pass through)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export NODEPREP_TEST_CACHE=${NODEPREP_TEST_CACHE:-/var/cache/nodeprep-tests}
exec .venv/bin/python -m pytest "$@"
