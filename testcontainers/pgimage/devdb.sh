#!/usr/bin/env bash
# Starts (or reuses) a local PostgreSQL container for running mefor by hand,
# building the image first if needed, and prints its DATABASE_URL.
#
# Usage: testcontainers/pgimage/devdb.sh [start|stop|url]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
image=${MEFOR_PG_IMAGE:-mefor-postgres:15}
name=${MEFOR_DEV_PG_NAME:-mefor-dev-postgres}
port=${MEFOR_DEV_PG_PORT:-55432}
url="postgres://postgres:mefor@127.0.0.1:$port/mefor?sslmode=disable"

case "${1:-start}" in
url)
	echo "$url"
	exit 0
	;;
stop)
	docker rm -f "$name" >/dev/null 2>&1 || true
	echo "devdb: removed $name (data kept in volume $name-data; docker volume rm $name-data to drop it)" >&2
	exit 0
	;;
start) ;;
*)
	echo "usage: $0 [start|stop|url]" >&2
	exit 2
	;;
esac

if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
	docker rm -f "$name" >/dev/null 2>&1 || true
	bash "$here/build.sh" "$image" >&2
	docker run -d --name "$name" -p "127.0.0.1:$port:5432" \
		-e POSTGRES_PASSWORD=mefor -e POSTGRES_DB=mefor \
		-v "$name-data:/var/lib/postgresql/data" "$image" >/dev/null
	echo "devdb: started $name on 127.0.0.1:$port" >&2
fi

for _ in $(seq 1 120); do
	if docker exec "$name" pg_isready -q -h 127.0.0.1 -U postgres -d mefor 2>/dev/null; then
		echo "$url"
		exit 0
	fi
	sleep 0.5
done
echo "devdb: $name did not become ready; see: docker logs $name" >&2
exit 1
