#!/usr/bin/env bash
# Prints a directory holding promtool, for PATH, taking the binary out of
# Debian's prometheus package the first time. The package is unpacked, not
# installed: installing it would also start a Prometheus server on this
# machine. The suite runs the shipped alert rules' unit tests
# (examples/monitoring/rules_test.yml) only when promtool is on the PATH.
#
# Usage: export PATH="$(bash .ci/promtool.sh):$PATH"
# The binary is kept in ${XDG_CACHE_HOME:-$HOME/.cache}/mefor/promtool.
set -euo pipefail

dir=${XDG_CACHE_HOME:-$HOME/.cache}/mefor/promtool
if [ -x "$dir/usr/bin/promtool" ]; then
	echo "$dir/usr/bin"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "promtool: no apt-get on this machine; install Prometheus's promtool and put it on the PATH" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# apt-get download fetches as the caller; a fresh machine may have no
# package lists yet, so update them once when the first try fails.
if ! apt-get download prometheus >/dev/null 2>&1; then
	echo "promtool: updating the package lists" >&2
	apt-get update -qq >&2
	apt-get download prometheus >/dev/null
fi
mkdir -p "$dir.tmp"
dpkg-deb -x prometheus_*.deb "$dir.tmp"
# Only promtool is kept; the server binary is as large and not needed.
rm -f "$dir.tmp/usr/bin/prometheus"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "promtool: unpacked $("$dir/usr/bin/promtool" --version 2>&1 | head -1)" >&2
echo "$dir/usr/bin"
