#!/usr/bin/env bash
# The GPU acceptance check lives in acceptance/gpu/ (README.md there); operators call it by this path.
exec "$(dirname "$0")/../acceptance/gpu/gpu-check.sh" "$@"
