#!/bin/sh
# Passwords and ACL users into $STUNNER_SECRETS_DIR (a volume the operator and the CDS read
# their password from), then redis-server with that ACL and the given flags. Passwords already
# in the volume are kept: a restarted Redis accepts the ones the operator and the CDS hold.
set -eu
dir="${STUNNER_SECRETS_DIR:-/secrets}"
python -m stunner_common.redis_acl "$dir"
exec redis-server --aclfile "$dir/users.acl" "$@"
