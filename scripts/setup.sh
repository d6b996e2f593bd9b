#!/usr/bin/env bash
# Set up a fresh Debian 12 machine (as root) for nodeprep: the Debian packages every concern needs
# (listed one per line in scripts/deps/*.apt) and a virtual environment .venv with nodeprep and its
# Python dependencies. Idempotent: a second run only checks.
#   scripts/setup.sh            runtime + test dependencies
#   NODEPREP_SETUP_NO_APT=1     skip the Debian packages (they are already there)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${NODEPREP_SETUP_NO_APT:-0}" != 1 ]; then
    mapfile -t pkgs < <(cat scripts/deps/*.apt | sed -e 's/#.*//' -e 's/[[:space:]]//g' | grep -v '^$' | sort -u)
    missing=()
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "setup: installing Debian packages: ${missing[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
fi

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
fi
stamp=.venv/.nodeprep-setup
want=$(cat pyproject.toml scripts/deps/*.pip 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
    extra=$(cat scripts/deps/*.pip 2>/dev/null | sed -e 's/#.*//' | grep -v '^[[:space:]]*$' || true)
    if [ -n "$extra" ]; then
        # shellcheck disable=SC2086
        .venv/bin/python -m pip install -q $extra
    fi
    echo "$want" > "$stamp"
fi
echo "setup: ready (.venv/bin/nodeprep)" >&2
