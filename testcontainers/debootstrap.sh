# Sourced by the image builders (pgimage/build.sh, peerimage/build.sh): the
# steps every image built from Debian packages shares. The caller sets
# `set -euo pipefail`, and `suite` and `mirror`.

# image_wanted exits the builder when image is already present (unless
# FORCE=1). Two builds of one image at once (two shells, or parallel test
# packages, on a fresh machine) would both debootstrap for minutes: the
# second waits on the image's lock file and then finds the image.
image_wanted() {
	local who=$1 image=$2 lock=$3
	if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
		echo "$who: $image already present"
		exit 0
	fi
	if command -v flock >/dev/null 2>&1; then
		exec 9>"/tmp/$lock-$(id -u).lock"
		flock 9
		if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
			echo "$who: $image already present (built while waiting)"
			exit 0
		fi
	fi
}

# ensure_debootstrap installs debootstrap with apt when it is missing.
#
# `task test` builds the PostgreSQL and the peer images at once, so on a
# fresh machine two builders reach this together; apt refuses a second
# apt-get while one holds its locks. One lock file shared by every builder
# serialises the install, and the second finds debootstrap installed.
ensure_debootstrap() {
	local who=$1
	command -v debootstrap >/dev/null 2>&1 && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "$who: debootstrap is missing and this is not root; run: sudo apt-get install debootstrap" >&2
		return 1
	fi
	(
		if command -v flock >/dev/null 2>&1; then
			exec 8>"/tmp/mefor-apt-$(id -u).lock"
			flock 8
		fi
		command -v debootstrap >/dev/null 2>&1 && exit 0
		echo "$who: installing debootstrap" >&2
		# Waits for a dpkg lock held by anything else (unattended upgrades).
		apt-get -o DPkg::Lock::Timeout=300 update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq debootstrap >/dev/null
	)
}

# debootstrap_root assembles a minimal Debian root with packages (comma
# separated) in a fresh temporary directory, removed when the builder
# exits, and sets root (that root), work (its directory) and start (when
# the build began, for the builder's closing line).
debootstrap_root() {
	local who=$1 packages=$2
	ensure_debootstrap "$who"
	work=$(mktemp -d "/tmp/mefor-$who.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	root=$work/root
	start=$(date +%s)
	echo "$who: debootstrap $suite with $packages into $root" >&2
	debootstrap --variant=minbase --include="$packages" \
		"$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
		tail -n 30 "$work/debootstrap.log" >&2
		exit 1
	}
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
}
