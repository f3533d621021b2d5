#!/usr/bin/env bash
# Builds a PostgreSQL Docker image from Debian's own postgresql package.
#
# The machines this project runs on have a Docker engine but no image registry,
# so the public postgres image cannot be pulled. debootstrap assembles a minimal
# Debian root with postgresql from Debian's archive and `docker import` turns it
# into an image. Takes about a minute on a 2-core machine with a warm apt cache.
#
# Usage: testcontainers/pgimage/build.sh [IMAGE]   (default: $MEFOR_PG_IMAGE or mefor-postgres:15)
# Does nothing when the image already exists; FORCE=1 rebuilds.
set -euo pipefail

image=${1:-${MEFOR_PG_IMAGE:-mefor-postgres:15}}
suite=${MEFOR_PG_SUITE:-bookworm}
mirror=${MEFOR_PG_MIRROR:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")" && pwd)

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
	echo "pgimage: $image already present"
	exit 0
fi

# Two builds at once (two shells running the tests on a fresh machine) would
# both debootstrap for minutes; the second waits and then finds the image.
if command -v flock >/dev/null 2>&1; then
	exec 9>"/tmp/mefor-pgimage-$(id -u).lock"
	flock 9
	if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
		echo "pgimage: $image already present (built while waiting)"
		exit 0
	fi
fi

# shellcheck source=../debootstrap.sh
. "$here/../debootstrap.sh"
ensure_debootstrap pgimage

work=$(mktemp -d /tmp/mefor-pgimage.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
start=$(date +%s)

echo "pgimage: debootstrap $suite with postgresql into $root" >&2
debootstrap --variant=minbase --include=postgresql \
	"$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
	tail -n 30 "$work/debootstrap.log" >&2
	exit 1
}

pgbin=$(ls -d "$root"/usr/lib/postgresql/*/bin | head -n 1)
pgver=$(basename "$(dirname "$pgbin")")

# The packaged cluster is not used: every container initialises its own data
# directory so it starts empty, like the public image does.
rm -rf "$root"/var/lib/postgresql/"$pgver" "$root"/etc/postgresql/"$pgver"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

install -m 0755 "$here/entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
sed -i "s|@PGBIN@|/usr/lib/postgresql/$pgver/bin|" "$root/usr/local/bin/docker-entrypoint.sh"
mkdir -p "$root/var/run/postgresql"
chroot "$root" chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql

echo "pgimage: importing as $image" >&2
tar -C "$root" -c . | docker import \
	--change 'ENV PGDATA=/var/lib/postgresql/data LANG=C.UTF-8' \
	--change "ENV PATH=/usr/lib/postgresql/$pgver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
	--change 'EXPOSE 5432' \
	--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
	--change 'CMD ["postgres"]' \
	- "$image" >/dev/null

echo "pgimage: built $image (PostgreSQL $pgver) in $(( $(date +%s) - start ))s" >&2
