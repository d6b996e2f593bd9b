#!/bin/sh
# The Debian 12 build root as nodeprep creates it: images/mmdebstrap-debian.sh for bookworm.
#   images/debian-12/mmdebstrap.sh TARGET_DIR [MIRROR] [SECURITY_MIRROR]
here=$(dirname "$0")
exec "$here/../mmdebstrap-debian.sh" bookworm "$here/packages.list" "$@"
