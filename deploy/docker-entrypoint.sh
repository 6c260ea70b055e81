#!/bin/sh
# hpu-entrypoint: the entry point of the hputrain image (deploy/Dockerfile).
#
# Run by every container of tests/integration/test_containers.c (through
# deploy/podman-cluster.sh). See deploy/README.md.
#
# Installs the cluster secret from a mounted secret file as hpud's key file,
# then runs the command (default: hpud -c /etc/hpud/hpud.conf). Without a
# valid secret it refuses to start: there is no default key, and an image
# must never carry one.
#
#   HPU_KEY_SECRET  the mounted secret (default /run/secrets/hpu_cluster_key,
#                   where compose's `secrets:` puts it)
#   HPU_KEY         where to install it (default /etc/hpud/secret.key, the
#                   `key =` of /etc/hpud/hpud.conf)
#
# The secret must be what proto/auth.h demands of a key file: 64 hex digits
# and at most a trailing newline. The installed copy belongs to the
# container's root with mode 0600, whatever owner and mode the mount had.
set -eu

secret=${HPU_KEY_SECRET:-/run/secrets/hpu_cluster_key}
key=${HPU_KEY:-/etc/hpud/secret.key}

refuse() {
	echo "hpu-entrypoint: $*; refusing to start" >&2
	exit 1
}

[ -e "$secret" ] ||
	refuse "no cluster secret at $secret (mount one: compose 'secrets:', or docker run -v FILE:$secret:ro)"
[ -f "$secret" ] || refuse "$secret is not a regular file"
[ -r "$secret" ] ||
	refuse "cannot read $secret (owner uid $(stat -c %u "$secret"), mode $(stat -c %a "$secret")); on the host make the file root-owned, mode 0400 (deploy/README.md)"
size=$(wc -c <"$secret")
lines=$(wc -l <"$secret")
if { [ "$size" -ne 64 ] && [ "$size" -ne 65 ]; } || [ "$lines" -gt 1 ] ||
	! grep -Eqx '[0-9a-fA-F]{64}' "$secret"; then
	refuse "$secret is not a cluster key: 64 hex digits (32 bytes) and at most a newline are expected (make one with 'hpud --gen-key FILE' or 'openssl rand -hex 32')"
fi

umask 077
mkdir -p "$(dirname "$key")"
tmp=$key.tmp.$$
cp "$secret" "$tmp"
chmod 0600 "$tmp"
mv -f "$tmp" "$key"

[ $# -gt 0 ] || set -- hpud -c /etc/hpud/hpud.conf
exec "$@"
