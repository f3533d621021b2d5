#!/usr/bin/env bash
# Builds a Docker image of a peer program the tests talk to (a syslog
# receiver, an SSH or SMTP server, a browser) from Debian's own packages.
#
# The machines this project runs on have a Docker engine but no image
# registry, so no image can be pulled. Like pgimage/build.sh, debootstrap
# assembles a minimal Debian root holding PACKAGES and `docker import` turns
# it into an image with no entrypoint: the test names the command to run.
# About a minute on a 2-core machine with a warm apt cache.
#
# Usage: testcontainers/peerimage/build.sh IMAGE PACKAGE...
#   e.g. testcontainers/peerimage/build.sh mefor-rsyslog:1 rsyslog rsyslog-gnutls
#        testcontainers/peerimage/build.sh mefor-aiosmtpd:1 python3-aiosmtpd (run with smtpd.py)
# Does nothing when IMAGE already exists; FORCE=1 rebuilds.
set -euo pipefail

if [ $# -lt 2 ]; then
	echo "usage: $0 IMAGE PACKAGE..." >&2
	exit 2
fi
image=$1
shift
packages=$(IFS=,; echo "$*")
suite=${MEFOR_PEER_SUITE:-${MEFOR_PG_SUITE:-bookworm}}
mirror=${MEFOR_PEER_MIRROR:-${MEFOR_PG_MIRROR:-http://deb.debian.org/debian}}
tag=${image//[^A-Za-z0-9]/_}
here=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=../debootstrap.sh
. "$here/../debootstrap.sh"
image_wanted peerimage "$image" "mefor-peerimage-$tag"
debootstrap_root peerimage "$packages"

echo "peerimage: importing as $image" >&2
tar -C "$root" -c . | docker import \
	--change 'ENV LANG=C.UTF-8' \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	- "$image" >/dev/null

echo "peerimage: built $image ($packages) in $(( $(date +%s) - start ))s" >&2
