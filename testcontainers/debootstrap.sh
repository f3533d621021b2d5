# Sourced by the image builders (pgimage/build.sh, peerimage/build.sh):
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
