#!/bin/sh
# Entry point of the image built by build.sh. Accepts the same POSTGRES_USER,
# POSTGRES_PASSWORD and POSTGRES_DB variables as the public postgres image so the
# test harness can use either image unchanged.
set -eu
PGBIN=@PGBIN@
: "${PGDATA:=/var/lib/postgresql/data}"

# Started as root (like the public image) so that a data directory on a fresh
# volume or tmpfs can be handed to postgres; everything else runs as postgres.
if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	pwfile=$(mktemp)
	printf '%s\n' "${POSTGRES_PASSWORD:-postgres}" >"$pwfile"
	"$PGBIN/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
		--auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
	rm -f "$pwfile"
	echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
	echo "host all all ::/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
	if [ "$POSTGRES_DB" != postgres ]; then
		"$PGBIN/postgres" --single -D "$PGDATA" postgres <<SQL >/dev/null
CREATE DATABASE "$POSTGRES_DB";
SQL
	fi
fi

if [ "${1:-postgres}" = postgres ]; then
	[ $# -gt 0 ] && shift
	exec "$PGBIN/postgres" -D "$PGDATA" -c listen_addresses='*' \
		-c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
