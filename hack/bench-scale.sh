#!/usr/bin/env bash
# Scale-out benchmark (issues 16 and 26): `osimages serve` replicas behind
# one registry (behind a byte-counting proxy) and an envtest apiserver, in
# scenarios: orderly start (1, 2, 3 replicas; clients' aggregate
# throughput), simultaneous start, the registry-pulling replica killed at
# half of the layer, clients from the selection on (fill and serving
# overlap), and 5 replicas whose origin's NIC cannot feed four followers.
# Runs in a network namespace of its own, whose loopback tc shapes: each
# replica's ports (its NIC) and the registry's port (a WAN link). Each case
# runs 3 times; prints medians with the replicas' CPU time and the load,
# and exits non-zero when a target is missed. docs/development.md#the-scale-out-benchmark
# says how to read it.
#
#   hack/bench-scale.sh [-scenarios orderly,simultaneous,failover,overlap,fanout] [-runs 3] [-size BYTES] [-keep-logs] ...
#
# Needs root (ip netns add, tc). Where the network namespace or tc is
# refused, it says so and exits non-zero: it never prints unshaped numbers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "bench-scale: $*" >&2; }

export PATH=$PATH:/usr/sbin:/sbin
if [ "$(id -u)" -ne 0 ]; then
  log "needs root: it creates a network namespace (ip netns add) and shapes its loopback with tc; run it as root (sudo make bench-scale)"
  exit 1
fi
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    log "ip and tc are missing: install iproute2"
    exit 1
  fi
  log "installing Debian's iproute2 (ip, tc)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
fi

eval "$(hack/tools.sh env)"
go build -o bin/osimages ./cmd/osimages
go build -o bin/bench-scale ./bench/scale

ns=osimages-bench-scale-$$
if ! out=$(ip netns add "$ns" 2>&1); then
  log "the machine refuses a network namespace (ip netns add: $out); the benchmark does not run without one"
  exit 1
fi
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# kube-apiserver (envtest) takes the address it advertises from the
# interface of the default route, and refuses to start without one: the
# default route goes to lo, which carries a documentation address
# (192.0.2.1, RFC 5737) for it to advertise. lo stays the only interface:
# the replicas, the registry, envtest and the clients reach nothing else.
if ! out=$(ip netns exec "$ns" sh -c 'ip link set lo up && ip addr add 192.0.2.1/32 dev lo && ip route add default dev lo' 2>&1); then
  log "cannot set up the namespace's loopback: $out"
  exit 1
fi
ip netns exec "$ns" bin/bench-scale -osimages "$PWD/bin/osimages" "$@" &
pid=$!
status=0
wait "$pid" || status=$?
pid=
exit "$status"
