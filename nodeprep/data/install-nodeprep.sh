#!/bin/sh
# nodeprep first-boot installer, written by `nodeprep cloud-init`.
#   install-nodeprep PYTHON store URL SHA256   wheel from the artifact store; sha256 checked before use
#   install-nodeprep PYTHON index REQUIREMENT  from the package index (pip resolves the dependencies)
# Installs into /opt/nodeprep/venv (system site-packages visible: in store mode the distribution's
# python3-* packages are the dependencies) and links /usr/local/bin/nodeprep last. Nothing is touched
# before the arguments are checked and (store) the wheel is downloaded and verified.
set -eu
usage() { echo "usage: install-nodeprep PYTHON store URL SHA256 | PYTHON index REQUIREMENT" >&2; exit 2; }
[ "$#" -ge 3 ] || usage
python=$1 mode=$2
case $mode in
store) [ "$#" -eq 4 ] || usage ;;
index) [ "$#" -eq 3 ] || usage ;;
*) usage ;;
esac
prefix=/opt/nodeprep
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$mode" = store ]; then
    url=$3 sha=$4
    wheel="$tmp/${url##*/}"
    case $url in
    /*) cp "$url" "$wheel" ;;
    file://*) cp "${url#file://}" "$wheel" ;;
    *)
        n=0
        get='import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])'
        until "$python" -c "$get" "$url" "$wheel"; do
            n=$((n + 1))
            [ "$n" -lt 5 ] || { echo "install-nodeprep: cannot download $url" >&2; exit 1; }
            sleep $((n * 3))
        done
        ;;
    esac
    if ! echo "$sha  $wheel" | sha256sum -c --strict - >&2; then
        echo "install-nodeprep: sha256 mismatch for $url" >&2
        exit 1
    fi
fi
rm -f /usr/local/bin/nodeprep
rm -rf "$prefix/venv"
mkdir -p "$prefix"
"$python" -m venv --system-site-packages "$prefix/venv"
if [ "$mode" = store ]; then
    "$prefix/venv/bin/python" -m pip install --quiet --no-index --no-deps "$wheel"
else
    "$prefix/venv/bin/python" -m pip install --quiet "$3"
fi
"$prefix/venv/bin/nodeprep" --version >&2
ln -sfn "$prefix/venv/bin/nodeprep" /usr/local/bin/nodeprep
