#!/usr/bin/env bash
# The one-node Kubernetes cluster of the end-to-end tests (make e2e): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd, the
# kubelet and kube-proxy, each a process of this machine, all in a network
# namespace of their own. Pod and Service addresses exist only in that
# namespace; while the cluster runs, blackhole routes in the machine's own
# namespace make a client started outside it by mistake fail locally.
#
#   hack/e2e-cluster.sh up            start it (binaries: $E2E_BIN, images: $E2E_IMAGES)
#   hack/e2e-cluster.sh down          stop it; only the logs stay
#   hack/e2e-cluster.sh kubectl ...   kubectl inside the namespace, as cluster admin
#   hack/e2e-cluster.sh exec CMD ...  any command inside the namespace (KUBECONFIG set)
#   hack/e2e-cluster.sh import TAR... import image tarballs into the node's
#                                     containerd (what a pull would bring)
#   hack/e2e-cluster.sh crash-node    SIGKILL the kubelet, containerd and every
#                                     container, as a power cut of the node would
#   hack/e2e-cluster.sh start-node    start containerd and the kubelet again
#   hack/e2e-cluster.sh check-clean   fail when a process, mount, network
#                                     namespace, route or iptables rule of the
#                                     cluster is left
#
# Needs root. Every process is started here and stopped here by its PID.
set -euo pipefail

export PATH=$PATH:/usr/sbin:/sbin
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

W=${E2E_DIR:-/var/tmp/osimages-e2e}
NS=${E2E_NETNS:-osimages-e2e}
NETNS_FILE=/run/netns/$NS
NODE=osimages-e2e
# Three ranges of their own: the node's link, the pods, the Services.
NODE_CIDR=10.213.0.0/24
NODE_IP=10.213.0.1
POD_CIDR=10.214.0.0/16
NODE_POD_CIDR=10.214.0.0/24 # the first /24: what the controller-manager gives the only node
SERVICE_CIDR=10.215.0.0/24
API_SERVICE_IP=10.215.0.1
PAUSE_IMAGE=docker.io/local/pause:e2e
BIN=${E2E_BIN:-}
IMAGES=${E2E_IMAGES:-}
CNI_BIN=/usr/lib/cni
SOCK=$W/containerd/containerd.sock
KUBECONFIG_ADMIN=$W/admin.kubeconfig

log() { echo "e2e-cluster: $*" >&2; }
fail() { log "$*"; exit 1; }
elapsed() { echo "$(($(date +%s%N) / 1000000 - T0))" | awk '{printf "%.1f", $1/1000}'; }
step() { log "[$(elapsed) s] $*"; }

in_ns() { nsenter --net="$NETNS_FILE" "$@"; }
kc() { in_ns "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }

need_root() {
  [ "$(id -u)" = 0 ] || fail "needs root: it makes a network namespace, mounts and iptables rules (run make e2e as root)"
}

# start NAME CMD...: CMD inside the namespace, in a session of its own (a
# Ctrl-C of make reaches the test, not the cluster, which `down` then stops
# in order), its output in logs/NAME.log, its PID in run/NAME.pid. nsenter
# and setsid each exec the next (neither forks here), so $! is CMD's PID.
start() {
  local name=$1 pid exe
  shift
  nsenter --net="$NETNS_FILE" setsid "$@" >>"$W/logs/$name.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$W/run/$name.pid"
  for _ in $(seq 1 20); do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || fail "$name exited at once: see $W/logs/$name.log"
    case "$exe" in */nsenter | */setsid) sleep 0.05 ;; *) return 0 ;; esac
  done
  fail "$name: PID $pid is still $exe, not $1"
}

pid_of() { [ -f "$W/run/$1.pid" ] && cat "$W/run/$1.pid"; }

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# stop NAME [SIGNAL]: signal the process, wait up to 30 s, then SIGKILL.
stop() {
  local name=$1 sig=${2:-TERM} pid
  pid=$(pid_of "$name") || return 0
  if alive "$pid"; then
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do alive "$pid" || break; sleep 0.5; done
    if alive "$pid"; then
      log "$name ($pid) still runs 30 s after SIG$sig: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do alive "$pid" || break; sleep 0.5; done
    fi
  fi
  rm -f "$W/run/$name.pid"
}

# The containerd shims of this cluster: the processes whose command line
# names its socket (never the machine's other containerd, if any).
shims() {
  local p
  for p in /proc/[0-9]*; do
    if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $SOCK "; then
      basename "$p"
    fi
  done
}

# kill_containers: SIGKILL every container of this cluster (each shim's
# children: the init of a container, whose death ends its PID namespace),
# then the shims.
kill_containers() {
  local shim child
  for shim in $(shims); do
    for child in $(ps -o pid= --ppid "$shim" 2>/dev/null); do kill -KILL "$child" 2>/dev/null || true; done
  done
  sleep 0.5
  for shim in $(shims); do kill -KILL "$shim" 2>/dev/null || true; done
}

write_pki() {
  local d=$W/pki
  mkdir -p "$d"
  (
    cd "$d"
    key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
    key ca
    openssl req -x509 -new -key ca.key -out ca.crt -days 7 -subj "/CN=osimages-e2e-ca" 2>/dev/null
    # cert NAME SUBJECT EXTENSIONS
    cert() {
      key "$1"
      printf '%s\n' "$3" >"$1.ext"
      openssl req -new -key "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 7 -extfile "$1.ext" 2>/dev/null
    }
    local client="extendedKeyUsage=clientAuth"
    cert apiserver "/CN=kube-apiserver" "subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$API_SERVICE_IP
extendedKeyUsage=serverAuth"
    cert kubelet-serving "/CN=system:node:$NODE" "subjectAltName=DNS:$NODE,IP:$NODE_IP
extendedKeyUsage=serverAuth"
    cert admin "/O=system:masters/CN=osimages-e2e-admin" "$client"
    cert controller-manager "/CN=system:kube-controller-manager" "$client"
    cert scheduler "/CN=system:kube-scheduler" "$client"
    cert proxy "/CN=system:kube-proxy" "$client"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE" "$client"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    key sa
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext ca.srl
  )
  local n
  for n in admin controller-manager scheduler proxy kubelet; do
    cat >"$W/$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: osimages-e2e, cluster: {server: "https://$NODE_IP:6443", certificate-authority: $W/pki/ca.crt}}]
users: [{name: $n, user: {client-certificate: $W/pki/$n.crt, client-key: $W/pki/$n.key}}]
contexts: [{name: osimages-e2e, context: {cluster: osimages-e2e, user: $n}}]
current-context: osimages-e2e
EOF
  done
}

write_configs() {
  # Only writes by the components of the chart are of interest: the
  # controller scenario reads who wrote what, and when.
  cat >"$W/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
  userGroups: ["system:serviceaccounts"]
  resources:
  - {group: "", resources: [configmaps, secrets, events]}
  - {group: events.k8s.io, resources: [events]}
  - {group: coordination.k8s.io, resources: [leases]}
- level: None
EOF
  cat >"$W/containerd/config.toml" <<EOF
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  # No registry to pull from: the pause image is imported.
  sandbox_image = "$PAUSE_IMAGE"
  # In a container, a sandbox may not lower its oom_score_adj; without this
  # runc fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$W/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = "$W/containerd/runc"
EOF
  cat >"$W/cni/net.d/10-osimages-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "osimages-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$W/cni/ipam",
        "ranges": [[{"subnet": "$NODE_POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # Pods resolve no name: nothing in the cluster needs DNS (the image
  # server's URL, the registry and the apiserver are addresses), and no
  # query may leave for the machine's resolver.
  echo "nameserver 127.0.0.1" >"$W/resolv.conf"
  cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine: cgroup v1, inside a container, swap unknown.
failCgroupV1: false
cgroupDriver: cgroupfs
# Pods' cgroups at the top of each hierarchy would stay on the machine
# after the cluster; without QoS cgroups there are none to clean.
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
localStorageCapacityIsolation: false
containerRuntimeEndpoint: unix://$SOCK
podLogsDir: $W/pod-logs
resolvConf: $W/resolv.conf
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $W/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $W/pki/kubelet-serving.crt
tlsPrivateKeyFile: $W/pki/kubelet-serving.key
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# The imported images are all there is: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# ConfigMap volumes follow changes within seconds, not a minute.
syncFrequency: 10s
EOF
  cat >"$W/proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $W/proxy.kubeconfig}
hostnameOverride: $NODE
bindAddress: $NODE_IP
clusterCIDR: $POD_CIDR
nodePortAddresses: [primary]
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# The sysctls of conntrack are the machine's: leave them alone.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

start_containerd() {
  start containerd containerd --config "$W/containerd/config.toml"
  for _ in $(seq 1 120); do
    ctr_ version >/dev/null 2>&1 && return 0
    alive "$(pid_of containerd)" || fail "containerd exited: see $W/logs/containerd.log"
    sleep 0.25
  done
  fail "containerd did not answer on $SOCK within 30 s: see $W/logs/containerd.log"
}

start_kubelet() {
  start kubelet "$BIN/kubelet" --config="$W/kubelet.yaml" --kubeconfig="$W/kubelet.kubeconfig" \
    --root-dir="$W/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP"
}

# wait_for WHAT SECONDS CMD...: poll CMD every half second.
wait_for() {
  local what=$1 secs=$2
  shift 2
  for _ in $(seq 1 $((secs * 2))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  fail "$what: not within $secs s (logs: $W/logs)"
}

has_pod_cidr() { [ -n "$(kc get node "$NODE" -o jsonpath='{.spec.podCIDR}')" ]; }

node_ready() {
  [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

up() {
  need_root
  [ -n "$BIN" ] && [ -x "$BIN/kubelet" ] || fail "E2E_BIN must name the folder of the cluster's binaries (hack/e2e.sh builds them)"
  [ -n "$IMAGES" ] && [ -f "$IMAGES/pause.tar" ] || fail "E2E_IMAGES must name the folder of the image tarballs, pause.tar among them (hack/e2e.sh builds them)"
  for c in containerd ctr runc iptables nsenter ip openssl; do
    command -v "$c" >/dev/null || fail "$c is missing (hack/e2e.sh installs Debian's containerd, runc, containernetworking-plugins and iptables)"
  done
  [ -x "$CNI_BIN/bridge" ] || fail "the CNI plugins are missing from $CNI_BIN (Debian's containernetworking-plugins)"
  if [ -e "$NETNS_FILE" ]; then
    fail "network namespace $NS exists: a cluster runs, or one was not stopped (hack/e2e-cluster.sh down)"
  fi
  if [ -d "$W" ] && grep -q " $W" /proc/self/mountinfo; then
    fail "mounts remain under $W from an earlier cluster (hack/e2e-cluster.sh down)"
  fi
  local r
  for r in $NODE_CIDR $POD_CIDR $SERVICE_CIDR; do
    if [ -n "$(ip route show to match "${r%/*}" | grep -v '^default')" ]; then
      fail "this machine already routes $r ($(ip route show to match "${r%/*}" | grep -v '^default' | head -1)): the cluster's ranges would clash with it"
    fi
  done

  T0=$(($(date +%s%N) / 1000000))
  rm -rf "$W"
  mkdir -p "$W"/{logs,run,pki,containerd,cni/net.d,cni/ipam,kubelet,pod-logs,pv}
  if ! out=$(ip netns add "$NS" 2>&1); then
    fail "the machine refuses a network namespace (ip netns add: $out): the cluster cannot run here"
  fi
  echo "$BIN" >"$W/run/bin"
  # containerd's shims, the CNI library and the kubelet make these whatever their
  # configuration says; `down` removes them when they were not there.
  local d
  for d in /run/containerd /var/lib/cni /var/log/containers; do
    [ -e "$d" ] || echo "$d" >>"$W/run/made-dirs"
  done
  touch "$W/run/up-stamp"
  # From here on, a failure stops what has started.
  trap 'log "up failed: stopping what started"; down' EXIT
  for r in $NODE_CIDR $POD_CIDR $SERVICE_CIDR; do ip route add blackhole "$r"; done
  # No dummy links here: a veth pair with both ends inside gives the node
  # its address, and a default route that leads nowhere outside.
  ip -n "$NS" link set lo up
  ip -n "$NS" link add eth0 type veth peer name eth0p
  ip -n "$NS" addr add "$NODE_IP/${NODE_CIDR#*/}" dev eth0
  ip -n "$NS" link set eth0 up
  ip -n "$NS" link set eth0p up
  ip -n "$NS" route add default dev eth0
  in_ns sysctl -qw net.ipv4.ip_forward=1
  write_pki
  write_configs
  step "network namespace $NS, PKI and configuration written"

  start etcd "$BIN/etcd" --name osimages-e2e --data-dir "$W/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster osimages-e2e=http://127.0.0.1:2380 --log-level warn
  start apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --tls-cert-file="$W/pki/apiserver.crt" --tls-private-key-file="$W/pki/apiserver.key" \
    --client-ca-file="$W/pki/ca.crt" \
    --kubelet-client-certificate="$W/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$W/pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$W/pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-key-file="$W/pki/sa.pub" --service-account-signing-key-file="$W/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --audit-policy-file="$W/audit-policy.yaml" --audit-log-path="$W/logs/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup=1 --profiling=false
  wait_for "the apiserver's /readyz" 60 kc get --raw /readyz
  step "apiserver ready"

  start controller-manager "$BIN/kube-controller-manager" --kubeconfig="$W/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$W/controller-manager.kubeconfig" --authorization-kubeconfig="$W/controller-manager.kubeconfig" \
    --service-account-private-key-file="$W/pki/sa.key" --root-ca-file="$W/pki/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$W/pki/ca.crt" --cluster-signing-key-file="$W/pki/ca.key" \
    --allocate-node-cidrs=true --cluster-cidr="$POD_CIDR" --node-cidr-mask-size=24 --service-cluster-ip-range="$SERVICE_CIDR" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
  start scheduler "$BIN/kube-scheduler" --kubeconfig="$W/scheduler.kubeconfig" \
    --authentication-kubeconfig="$W/scheduler.kubeconfig" --authorization-kubeconfig="$W/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
  start_containerd
  local tar
  for tar in "$IMAGES"/*.tar; do
    ctr_ images import "$tar" >>"$W/logs/images.log" 2>&1 || fail "importing $tar failed: see $W/logs/images.log"
  done
  step "containerd up, images imported: $(ctr_ images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
  start_kubelet
  wait_for "node $NODE Ready" 120 node_ready
  step "node Ready"
  start proxy "$BIN/kube-proxy" --config="$W/proxy.yaml"

  # Node Ready comes before the node's podCIDR and the default
  # ServiceAccount: a pod created then is refused.
  wait_for "the node's podCIDR" 60 has_pod_cidr
  local cidr
  cidr=$(kc get node "$NODE" -o jsonpath='{.spec.podCIDR}')
  [ "$cidr" = "$NODE_POD_CIDR" ] || fail "node podCIDR is $cidr, but the CNI configuration gives $NODE_POD_CIDR"
  wait_for "the default ServiceAccount" 60 kc get serviceaccount default

  # Storage: local volumes prepared here, bound by the scheduler to the
  # first consumer (no provisioner), the cluster's default class.
  {
    cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
    local i
    for i in $(seq 1 "${E2E_LOCAL_PVS:-6}"); do
      mkdir -p "$W/pv/local-$i"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: local-$i}
spec:
  capacity: {storage: 4Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {path: $W/pv/local-$i}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]
EOF
    done
  } | kc apply -f - >/dev/null
  step "ready for workloads: podCIDR $cidr, default ServiceAccount, StorageClass local with ${E2E_LOCAL_PVS:-6} local volumes"
  trap - EXIT
  cat >"$W/cluster.env" <<EOF
E2E_DIR=$W
E2E_NETNS=$NS
E2E_NETNS_FILE=$NETNS_FILE
E2E_NODE=$NODE
E2E_NODE_IP=$NODE_IP
E2E_SERVICE_CIDR=$SERVICE_CIDR
E2E_POD_CIDR=$POD_CIDR
KUBECONFIG=$KUBECONFIG_ADMIN
E2E_CONTAINERD_SOCKET=$SOCK
EOF
  log "cluster up: hack/e2e-cluster.sh kubectl get pods -A (logs in $W/logs, pod logs in $W/pod-logs)"
}

crash_node() {
  need_root
  local pid
  for name in kubelet containerd; do
    pid=$(pid_of "$name") || continue
    kill -KILL "$pid" 2>/dev/null || true
  done
  kill_containers
  for name in kubelet containerd; do
    pid=$(pid_of "$name") || continue
    for _ in $(seq 1 20); do alive "$pid" || break; sleep 0.25; done
    rm -f "$W/run/$name.pid"
  done
  log "node crashed: kubelet, containerd and every container killed"
}

start_node() {
  need_root
  alive "$(pid_of containerd)" || start_containerd
  alive "$(pid_of kubelet)" || start_kubelet
  log "containerd and kubelet started"
}

down() {
  trap - EXIT
  set +e
  [ -z "$BIN" ] && BIN=$(cat "$W/run/bin" 2>/dev/null)
  if [ -e "$NETNS_FILE" ] && alive "$(pid_of apiserver)" && alive "$(pid_of kubelet)" && [ -x "$BIN/kubectl" ]; then
    # Let the kubelet stop the pods while everything runs: it unmounts
    # their volumes and releases their addresses.
    kc delete statefulsets,deployments,daemonsets,replicasets,jobs,pods --all -A --wait=false >/dev/null 2>&1
    local n=0 i
    for i in $(seq 1 120); do
      n=$(ctr_ tasks ls -q 2>/dev/null | wc -l)
      [ "$n" = 0 ] && break
      sleep 0.5
    done
    log "containers left after deleting every pod: $n"
  fi
  local name
  for name in proxy kubelet scheduler controller-manager apiserver etcd; do stop "$name"; done
  if alive "$(pid_of containerd)"; then
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s KILL "$t" >/dev/null 2>&1; done
    sleep 1
  fi
  stop containerd
  kill_containers
  # Mounts under the work directory (kubelet root, volumes, rootfs, pod
  # network namespaces), deepest first.
  local m
  for m in $(awk -v w="$W" '$5 == w || index($5, w "/") == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
  done
  [ -e "$NETNS_FILE" ] && ip netns del "$NS"
  for r in $NODE_CIDR $POD_CIDR $SERVICE_CIDR; do
    ip route del blackhole "$r" 2>/dev/null
  done
  # The kubelet links every container's log into /var/log/containers, and
  # the CNI library caches results in /var/lib/cni, whatever their
  # configuration says: remove ours.
  local l
  for l in /var/log/containers/*.log; do
    [ -L "$l" ] && case "$(readlink "$l")" in "$W"/*) rm -f -- "$l" ;; esac
  done
  # The CNI library caches every result under /var/lib/cni, and a shim
  # killed with the node leaves its socket under /run/containerd/s: remove
  # those the cluster made (since it started; a socket only when nothing
  # listens on it), then the folders, when the cluster made them.
  if [ -f "$W/run/up-stamp" ]; then
    find /var/lib/cni/results -maxdepth 1 -type f \( -name 'osimages-e2e-*' -o -name 'cni-loopback-*' \) -newer "$W/run/up-stamp" -delete 2>/dev/null
    local listening sock
    listening=$(ss -xlH 2>/dev/null | awk '{print $5}')
    for sock in $(find /run/containerd/s -maxdepth 1 -type s -newer "$W/run/up-stamp" 2>/dev/null); do
      grep -qxF "$sock" <<<"$listening" || rm -f "$sock"
    done
  fi
  local d
  for d in $(cat "$W/run/made-dirs" 2>/dev/null); do
    find "$d" -depth -type d -empty -delete 2>/dev/null
  done
  # Everything but the logs goes: volumes, images, etcd, keys.
  if [ -d "$W" ] && ! grep -q " $W" /proc/self/mountinfo; then
    find "$W" -mindepth 1 -maxdepth 1 ! -name logs ! -name pod-logs -exec rm -rf {} +
  fi
  set -e
  log "cluster down (logs kept in $W/logs and $W/pod-logs)"
}

check_clean() {
  local bad=0 p
  for p in /proc/[0-9]*; do
    local cmd
    cmd=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    if [[ $cmd == *"$W/"* ]] || [[ "$(readlink "$p/root" 2>/dev/null)" == "$W"/* ]]; then
      log "process left: $(basename "$p"): $cmd"
      bad=1
    fi
  done
  if grep " $W" /proc/self/mountinfo >/dev/null; then
    log "mounts left: $(awk -v w="$W" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | tr '\n' ' ')"
    bad=1
  fi
  if ip netns list | grep -w "$NS" >/dev/null; then
    log "network namespace left: $NS"
    bad=1
  fi
  local r
  for r in $NODE_CIDR $POD_CIDR $SERVICE_CIDR; do
    if ip route show | grep "$r" >/dev/null; then
      log "route left: $(ip route show | grep "$r")"
      bad=1
    fi
  done
  # kube-proxy's and CNI's rules lived in the namespace; none may have
  # reached the machine's tables.
  if iptables-save 2>/dev/null | grep -E 'KUBE-|CNI-|cni0' >/dev/null; then
    log "iptables rules left: $(iptables-save | grep -cE 'KUBE-|CNI-|cni0')"
    bad=1
  fi
  if ip link show cni0 >/dev/null 2>&1; then
    log "link cni0 left in the machine's namespace"
    bad=1
  fi
  for l in /var/log/containers/*.log; do
    [ -L "$l" ] && case "$(readlink "$l")" in "$W"/*)
      log "log link left: $l"
      bad=1
      ;;
    esac
  done
  [ "$bad" = 0 ] || fail "the cluster left the above behind"
  log "clean: no process, mount, network namespace, route or iptables rule of the cluster left"
}

cmd=${1:-}
shift || true
case "$cmd" in
up) up ;;
down) need_root && down ;;
kubectl)
  [ -z "$BIN" ] && BIN=$(cat "$W/run/bin")
  kc "$@"
  ;;
exec) KUBECONFIG=$KUBECONFIG_ADMIN in_ns "$@" ;;
import)
  for tar in "$@"; do
    ctr_ images import "$tar" >>"$W/logs/images.log" 2>&1 || fail "importing $tar failed: see $W/logs/images.log"
  done
  ;;
crash-node) crash_node ;;
start-node)
  [ -z "$BIN" ] && BIN=$(cat "$W/run/bin")
  start_node
  ;;
check-clean) check_clean ;;
*)
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
