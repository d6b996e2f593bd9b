#!/bin/sh
# The Debian 13 build root as nodeprep creates it: images/mmdebstrap-debian.sh for trixie.
#   images/debian-13/mmdebstrap.sh TARGET_DIR [MIRROR] [SECURITY_MIRROR]
here=$(dirname "$0")
exec "$here/../mmdebstrap-debian.sh" trixie "$here/packages.list" "$@"
