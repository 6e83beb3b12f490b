#!/bin/sh
# A node of the compose mesh. The seed node (GPUFLEX_SEED=1) writes its bootstrap address
# (its container address and peer id) to the shared seed volume; the others wait for that file,
# then join through it. After the first start each node also knows its peers from its address
# book. Extra arguments go to `gpuflex node start`.
set -eu
home="${GPUFLEX_HOME:-/var/lib/gpuflex}"
ip="${GPUFLEX_IP:?set GPUFLEX_IP to this container's address}"
seed_file="${GPUFLEX_SEED_FILE:-/run/gpuflex-seed/bootstrap}"
peer_id="$(gpuflex keygen --home "$home" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["peer_id"])')"
set -- --home "$home" --listen /ip4/0.0.0.0/tcp/4001 --announce "/ip4/$ip/tcp/4001" --no-mdns "$@"
if [ "${GPUFLEX_SEED:-0}" = 1 ]; then
    echo "/ip4/$ip/tcp/4001/p2p/$peer_id" > "$seed_file.tmp"
    mv "$seed_file.tmp" "$seed_file"
    exec gpuflex node start "$@"
fi
tries=0
until [ -s "$seed_file" ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 120 ]; then
        echo "no bootstrap address in $seed_file after 120 s: is the seed node running?" >&2
        exit 1
    fi
    sleep 1
done
exec gpuflex node start --bootstrap "$(cat "$seed_file")" "$@"
