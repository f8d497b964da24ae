# Settings and helpers of Metal3 in a box (hack/e2e-metal3.sh), sourced by
# every script of hack/metal3.
#
# Everything of a run lives in three places: the network namespace $NS (the
# box's 10.216.0.0/16, never routed on the machine), the run directory $W
# (logs, PIDs, the VM's disk, the overlays' upper layers) and the tools
# cache $CACHE (the root filesystems and the IPA ramdisk, keyed by their
# inputs, shared by runs).

export PATH=$PATH:/usr/sbin:/sbin
M3_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$M3_DIR/../.." && pwd)

W=${E2E_METAL3_DIR:-/var/tmp/osimages-e2e-metal3}
NS=${E2E_METAL3_NETNS:-osimages-m3box}
NETNS_FILE=/run/netns/$NS
# OWNER_FILE: "PID MODE" of the run that owns the box (outside $W, which
# `up` empties).
OWNER_FILE=/run/$NS.owner
BOX_CIDR=10.216.0.0/16
BR_IP=10.216.0.1
BR_PREFIX=24
DHCP_RANGE=10.216.0.100,10.216.0.150
CACHE=${OSIMAGES_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/osimages/tools}
SUITE=trixie

# The ports of the box, all on $BR_IP inside the namespace.
IRONIC_PORT=6385
SUSHY_PORT=8001
BOOT_HTTP_PORT=8088 # iPXE scripts, IPA kernel and ramdisk (nginx)
SERVE_PORT=8443     # osimages serve, HTTPS (Ironic's OCI client speaks HTTPS only)
NGINX_PORT=8444     # nginx serving the same file, for bench-metal3
VM_MAC=52:54:00:16:00:10
NODE=node0

# The chart's server runs in the e2e cluster (hack/e2e-cluster.sh: network
# namespace $CLUSTER_NS, node $CLUSTER_NODE_IP, pods 10.214.0.0/16), which
# the box starts in a folder of its own (the logs of a `make e2e` run before
# it stay) and records in $CLUSTER_FILE (outside $W) until it is down, so
# that `down` and the next run stop it after a killed run. A veth pair
# joins the two namespaces, its /30 inside the box's blackholed range: the
# machine's own namespace never holds an address or a route of it.
CLUSTER_NS=osimages-e2e
CLUSTER_DIR=${E2E_METAL3_CLUSTER_DIR:-/var/tmp/osimages-m3box-cluster}
CLUSTER_FILE=/run/$NS.cluster
CLUSTER_NODE_IP=10.213.0.1
CLUSTER_ROUTES="10.213.0.0/24 10.214.0.0/16" # the node, the pods (no NAT on their way out)
LINK_BOX_IP=10.216.255.1                       # m3-e2e, in the box
LINK_CLUSTER_IP=10.216.255.2                   # m3-box, in the cluster's namespace
CHART_NS=sylva-system
CHART_NODEPORT=30443 # the chart's Service (NodePort, HTTPS) on the node
REGISTRY_PORT=5000   # the box's registry, on every address of the box

log() { echo "e2e-metal3: [$(date -u +%H:%M:%S)] $*" >&2; }
fail() {
  log "$*"
  exit 1
}

# shared_dir: ../shared, found as internal/testenv finds it.
shared_dir() { echo "${OSIMAGES_SHARED_DIR:-$(cd "$ROOT/.." && pwd)/shared}"; }

# mirror: the first Debian archive URI of the machine's apt configuration
# (deb822 or one-line format), read at run time and never written down.
mirror() {
  local uri
  uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  [ -n "$uri" ] || fail "no Debian archive in the machine's apt configuration (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list): mmdebstrap needs one to build the $SUITE root filesystems"
  echo "$uri"
}

# key FILE...: the first 12 hex digits of the sha256 of the files' contents.
key() { cat "$@" | sha256sum | cut -c1-12; }

in_ns() { nsenter --net="$NETNS_FILE" "$@"; }

pid_of() { [ -f "$W/run/$1.pid" ] && cat "$W/run/$1.pid"; }
# alive PID: the process runs. A daemon that exited stays a zombie until
# the box's holder (sleep, which reaps nothing) ends: a zombie is not alive.
alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}

# stop_pid NAME: TERM the process of run/NAME.pid, wait up to 20 s, then KILL.
stop_pid() {
  local name=$1 pid
  pid=$(pid_of "$name") || return 0
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do alive "$pid" || break; sleep 0.5; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do alive "$pid" || break; sleep 0.5; done
  fi
  rm -f "$W/run/$name.pid"
}
