#!/bin/sh
# The Debian 12 build root as nodeprep creates it (nodeprep/build/buildroot.py, mmdebstrap_argv):
#   images/debian-12/mmdebstrap.sh TARGET_DIR [MIRROR] [SECURITY_MIRROR]
# nodeprep itself runs the same command and caches the result under <cache>/buildroots/.
set -eu
target=${1:?usage: $0 TARGET_DIR [MIRROR] [SECURITY_MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
security=${3:-http://deb.debian.org/debian-security}
here=$(dirname "$0")
include=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/packages.list" | paste -sd, -)
exec mmdebstrap --variant=minbase --mode=root --format=directory --include="$include" \
    --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/locale/* \
    --dpkgopt=path-exclude=/usr/share/doc/* \
    bookworm "$target" \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main"
