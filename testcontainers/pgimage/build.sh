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

# shellcheck source=../debootstrap.sh
. "$here/../debootstrap.sh"
image_wanted pgimage "$image" mefor-pgimage
debootstrap_root pgimage postgresql

pgbin=$(ls -d "$root"/usr/lib/postgresql/*/bin | head -n 1)
pgver=$(basename "$(dirname "$pgbin")")

# The packaged cluster is not used: every container initialises its own data
# directory so it starts empty, like the public image does.
rm -rf "$root"/var/lib/postgresql/"$pgver" "$root"/etc/postgresql/"$pgver"

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
