#!/bin/sh
# A Debian build root as nodeprep creates it (nodeprep/builder/buildroot.py, mmdebstrap_argv), for
# the suite and package list an images/<os>/mmdebstrap.sh wrapper passes:
#   images/mmdebstrap-debian.sh SUITE PACKAGES_LIST TARGET_DIR [MIRROR] [SECURITY_MIRROR]
# MIRROR defaults to NODEPREP_DEBIAN_MIRROR, else the archive URI in the host's apt sources (as
# nodeprep does); SECURITY_MIRROR likewise (NODEPREP_DEBIAN_SECURITY_MIRROR, .../debian-security).
# nodeprep itself runs the same command and caches the result under <cache>/buildroots/.
set -eu
suite=${1:?usage: $0 SUITE PACKAGES_LIST TARGET_DIR [MIRROR] [SECURITY_MIRROR]}
packages=${2:?usage: $0 SUITE PACKAGES_LIST TARGET_DIR [MIRROR] [SECURITY_MIRROR]}
shift 2
target=${1:?usage: $0 SUITE PACKAGES_LIST TARGET_DIR [MIRROR] [SECURITY_MIRROR]}
host_uri() { # first URI in the host's apt sources ending in $1
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
        grep -oE '(https?|file)://[^ ]*' | grep -E "$1/?\$" | head -n 1
}
mirror=${2:-${NODEPREP_DEBIAN_MIRROR:-$(host_uri /debian)}}
security=${3:-${NODEPREP_DEBIAN_SECURITY_MIRROR:-$(host_uri /debian-security)}}
[ -n "$mirror" ] || { echo "$0: no Debian mirror: pass MIRROR or set NODEPREP_DEBIAN_MIRROR" >&2; exit 2; }
[ -n "$security" ] || security="${mirror%/debian}/debian-security"
include=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$packages" | paste -sd, -)
exec mmdebstrap --variant=minbase --mode=root --format=directory --include="$include" \
    --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/locale/* \
    --dpkgopt=path-exclude=/usr/share/doc/* \
    "$suite" "$target" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
