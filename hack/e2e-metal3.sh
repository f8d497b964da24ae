#!/usr/bin/env bash
# make e2e-metal3: Metal3 in a box. A virtual bare-metal host (qemu, TCG)
# with a Redfish BMC (sushy-tools, libvirt) is provisioned by Ironic 29 and
# ironic-python-agent from the test image osimages serves, the way a Sylva
# management cluster provisions its hosts: the image is published to an OCI
# registry, resolved by the chart's catalog Job, selected, pulled, verified
# and served by the chart's server in the e2e cluster (hack/e2e-cluster.sh,
# joined to the box by a veth pair), and its URL comes from `osimages
# render`. The box runs in the network namespace $NS (10.216.0.0/16,
# blackholed on the machine while it runs); see docs/development.md, "Metal3
# in a box".
#
#   hack/e2e-metal3.sh [run]      build what is missing, start the box, run
#                                 the scenarios, stop it, check it is gone
#   hack/e2e-metal3.sh bench      the box without the cluster: deploy from
#                                 `osimages serve` in the box, then from
#                                 nginx serving the same file; the ratio
#   hack/e2e-metal3.sh up         only start the box and the cluster, and
#                                 leave them up (to debug: then `scenarios`,
#                                 `bench-on-box`, `capi`, `down`)
#   hack/e2e-metal3.sh scenarios  the scenarios, on a box that is up
#   hack/e2e-metal3.sh capi       the Cluster API chain (hack/metal3/capi.sh),
#                                 on a box that is up: run does it after
#                                 the scenarios (E2E_METAL3_CAPI=0 skips it)
#   hack/e2e-metal3.sh down       stop a box a killed run left behind
#   hack/e2e-metal3.sh check-clean  fail when anything of a box is left
#
# Needs root and ../shared/metal3 (or OSIMAGES_SHARED_DIR). Each process is
# started here and stopped here by its PID.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/metal3/lib.sh"
. "$M3_DIR/config.sh"
. "$M3_DIR/capi.sh"
cd "$ROOT"
WITH_CAPI=${E2E_METAL3_CAPI:-1}
# What serves the image: the chart's server in the e2e cluster (the
# scenarios and the Cluster API chain), or `osimages serve` as a process
# of the box (the bench). main sets them by mode.
USE_CHART=1 BOX_SERVE=0

R=$W/ironic/root
SERVE_URL=https://$BR_IP:$SERVE_PORT
VM_UUID=6d3b0f3e-0d1a-4c5e-9a4b-0000000e2e31
now() { date +%s; }

# --- preflight --------------------------------------------------------------

# claim_box MODE: make this run the box's owner. A box still up is left
# alone when its owner runs, or when it was started with `up` to stay up;
# a box whose owner is gone was left by a killed run (a CI job cut, a
# machine restarted under it) and is stopped first: otherwise every later
# run, CI's included, would fail on it.
claim_box() {
  local owner='' mode=''
  if ip netns list | grep -w "$NS" >/dev/null || ip route show | grep "^blackhole $BOX_CIDR" >/dev/null || [ -f "$CLUSTER_FILE" ]; then
    [ ! -f "$OWNER_FILE" ] || read -r owner mode <"$OWNER_FILE" || true
    if alive "$owner" && tr '\0' ' ' <"/proc/$owner/cmdline" 2>/dev/null | grep e2e-metal3 >/dev/null; then
      fail "a box is up and in use by hack/e2e-metal3.sh (PID $owner, $mode): wait for it to end, or stop it (kill $owner) and run make e2e-metal3-down"
    fi
    [ "$mode" != up ] || fail "a box started with 'hack/e2e-metal3.sh up' is still up: stop it with make e2e-metal3-down"
    log "a box left by a killed run is still up (netns $NS, the route to $BOX_CIDR or the e2e cluster it started, no run owns it): stopping it first"
    down
    check_clean
  fi
  # An e2e cluster the box did not start (make e2e-up, or a make e2e run)
  # holds the namespace and the ranges the box's own would use.
  if [ "$USE_CHART" = 1 ] && ip netns list | grep -w "$CLUSTER_NS" >/dev/null; then
    fail "an e2e cluster is up (network namespace $CLUSTER_NS), started by make e2e or make e2e-up: the box starts its own in the same namespace and ranges; stop that one first (make e2e-down)"
  fi
  echo "$$ $1" >"$OWNER_FILE"
}

preflight() {
  [ "$(id -u)" = 0 ] || fail "needs root: the box is a network namespace with mounts, a bridge and a VM (run as root: sudo make e2e-metal3)"
  local probe=osimages-m3box-probe-$$ out
  out=$(ip netns add "$probe" 2>&1) || fail "this machine refuses network namespaces (ip netns add: $out): the box cannot run here"
  ip netns del "$probe"
  [ -d "$(shared_dir)/metal3" ] || fail "$(shared_dir)/metal3 is missing: the box installs ironic-python-agent and sushy-tools from the shared fixtures (PyPI is not reachable); set OSIMAGES_SHARED_DIR"
  local missing=() p
  for p in mmdebstrap arch-test jq curl openssl patch zstd cpio xz-utils; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian's ${missing[*]} (mmdebstrap builds the box's Debian 13 trees; the rest are the test's tools)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
  claim_box "$1"
  if [ -n "$(ip route show to match 10.216.0.1 | grep -v '^default')" ]; then
    fail "this machine already routes 10.216.0.1 ($(ip route show to match 10.216.0.1 | grep -v '^default' | head -1)): the box's range would clash with it"
  fi
}

build() {
  local out
  out=$("$M3_DIR/build.sh" all) || fail "building the box's trees failed"
  eval "$out"
  export IRONIC_TREE IPA_DIR
  mkdir -p "$W/bin"
  log "building osimages, the registry and the publisher from the checkout"
  nice -n 5 go build -o "$W/bin/osimages" ./cmd/osimages
  CGO_ENABLED=0 nice -n 5 go build -o "$W/bin/registry" ./test/e2e/images/registry
  nice -n 5 go build -o "$W/bin/publish" ./test/metal3/publish
  if [ "$USE_CHART" = 1 ]; then
    # The cluster's binaries and images as make e2e builds them (the
    # image of this checkout among them), and the helm install of the
    # chart.
    local env_out
    env_out=$(nice -n 5 "$ROOT/hack/e2e.sh" -build-only | tail -1) || fail "building the e2e cluster's binaries and images failed (hack/e2e.sh -build-only)"
    [[ $env_out == E2E_BIN=*" E2E_IMAGES="* ]] || fail "hack/e2e.sh -build-only printed no E2E_BIN/E2E_IMAGES line: $env_out"
    # Two assignments (the paths hold no space).
    export $env_out
    nice -n 5 go build -o "$W/bin/chart" ./test/metal3/chart
  fi
  if [ "$WITH_CAPI" = 1 ]; then
    capi_build
    capi_debs
  fi
}

# --- the box ----------------------------------------------------------------

# start NAME CMD...: CMD in the namespace (not in the Ironic tree), in a
# session of its own, output in logs/NAME.log, PID in run/NAME.pid.
start() {
  local name=$1
  shift
  nsenter --net="$NETNS_FILE" setsid "$@" >>"$W/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$W/run/$name.pid"
  # Stopped by its PID (stop_pid), not as a job: no "Killed" notice.
  disown $!
}

# in_box CMD...: CMD in the Ironic tree, in the daemons' namespaces.
in_box() { nsenter -t "$(pid_of holder)" -m -n chroot "$R" "$@"; }

make_tls() {
  # A CA of the run's own and the server certificate of 10.216.0.1, for
  # osimages serve and nginx. Ironic trusts the CA through the tree's trust
  # store, IPA through the ramdisk's (an extra cpio appended to it).
  local d=$W/tls
  mkdir -p "$d"
  (
    cd "$d"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj "/CN=osimages-m3box-ca" 2>/dev/null
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server.key 2>/dev/null
    openssl req -new -key server.key -out server.csr -subj "/CN=$BR_IP" 2>/dev/null
    # One certificate for both servers: osimages serve in the box
    # ($BR_IP) and the chart's, reached on the e2e cluster's node.
    printf 'subjectAltName=IP:%s,IP:%s\nextendedKeyUsage=serverAuth\n' "$BR_IP" "$CLUSTER_NODE_IP" >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile server.ext 2>/dev/null
  )
}

ipa_files() {
  mkdir -p "$W/ipa" "$W/ipa-ca/etc/ssl/certs"
  cp "$IPA_DIR/ipa.kernel" "$W/ipa/ipa.kernel"
  # The kernel unpacks concatenated archives in order: this one replaces
  # the ramdisk's CA bundle with the run's CA. It is compressed as the
  # ramdisk is (zstd): the kernel's zstd reader takes the rest of the file
  # as frames of one stream, so an uncompressed cpio after it is never
  # read (IPA then failed with CERTIFICATE_VERIFY_FAILED).
  cp "$W/tls/ca.crt" "$W/ipa-ca/etc/ssl/certs/ca-certificates.crt"
  { cat "$IPA_DIR/ipa.initramfs"; (cd "$W/ipa-ca" && find . | cpio -o -H newc --quiet | zstd -q); } >"$W/ipa/ipa.initramfs"
}

up() {
  local t0
  t0=$(now)
  rm -rf "$W"
  mkdir -p "$W"/{run,logs,image,serve,vm,nginx,registry,ironic/upper,ironic/work,ironic/root}
  build
  make_tls
  ipa_files
  write_configs "$W/ironic/upper"
  cp "$M3_DIR/test-image.sh" "$W/bin/"

  ip netns add "$NS"
  ip route add blackhole "$BOX_CIDR"
  ip -n "$NS" link set lo up
  ip -n "$NS" link add br0 type bridge
  ip -n "$NS" addr add "$BR_IP/$BR_PREFIX" dev br0
  ip -n "$NS" link set br0 up

  nsenter --net="$NETNS_FILE" unshare -m --propagation private setsid \
    env E2E_METAL3_DIR="$W" "$M3_DIR/inside.sh" "$IRONIC_TREE" >>"$W/logs/inside.log" 2>&1 </dev/null &
  for _ in $(seq 1 360); do
    [ -f "$W/run/ready" ] && break
    if [ -f "$W/run/holder.pid" ] && ! alive "$(pid_of holder)"; then fail "the box did not start: $(tail -3 "$W/logs/inside.log")"; fi
    sleep 0.5
  done
  [ -f "$W/run/ready" ] || fail "the box did not start in 180 s: see $W/logs/inside.log"
  log "box up in $(($(now) - t0)) s: Ironic $(api GET / | jq -r .default_version.version), sushy-tools, libvirt, dnsmasq, nginx"

  serve_image
  [ "$USE_CHART" = 0 ] || chart_up
  define_vm
  enroll
}

# --- the image, as users deploy it ------------------------------------------

serve_image() {
  local t0 out
  t0=$(now)
  cp "$IPA_DIR/ipa.kernel" "$W/image/vmlinuz"
  cp -r "$IPA_DIR/testimage-modules" "$W/image/modules"
  SHA=$(in_box /m3box/bin/test-image.sh /m3box/image) || fail "the test image was not built: see $W/image/boot.log"
  echo "$SHA" >"$W/run/sha256"
  log "test image built and booted under qemu in $(($(now) - t0)) s: sha256 $SHA"

  # On every address of the box: 127.0.0.1 for its own clients, the
  # link's $LINK_BOX_IP for the chart's pods.
  start registry "$W/bin/registry" -listen ":$REGISTRY_PORT" -root "$W/registry"
  for _ in $(seq 1 60); do in_ns curl -sf -o /dev/null "http://127.0.0.1:$REGISTRY_PORT/v2/" && break; sleep 0.5; done
  out=$(in_ns "$W/bin/publish" -registry "127.0.0.1:$REGISTRY_PORT" -image "$W/image/osimages-test.raw" \
    -catalog-values "$W/serve/catalog-values.yaml" -server-values "$W/serve/mgmt-values.yaml") || fail "publishing the test image failed"
  log "$out"
  in_ns "$W/bin/osimages" catalog -f "$W/serve/catalog-values.yaml" >"$W/serve/os-images-info.yaml" 2>"$W/logs/catalog.log" ||
    fail "osimages catalog failed: $(cat "$W/logs/catalog.log")"
  [ "$BOX_SERVE" = 1 ] || return 0
  start_serve
  wait_served
  log "osimages serve selected, pulled, verified and serves the image $(($(now) - t0)) s after its build started"
}

start_serve() {
  start serve "$W/bin/osimages" serve --data "$W/serve/data" --listen "$BR_IP:$SERVE_PORT" \
    --peer-listen 127.0.0.1:8081 --tls-cert "$W/tls/server.crt" --tls-key "$W/tls/server.key" \
    --free-space-margin 0 --os-images "$W/serve/os-images-info.yaml" -f "$W/serve/mgmt-values.yaml" \
    --output-file "$W/serve/served.yaml"
}

wait_served() {
  local sum
  for _ in $(seq 1 240); do
    sum=$(in_ns curl -sf --cacert "$W/tls/ca.crt" "$SERVE_URL/images/$SHA/osimages-test.raw.sha256sum" 2>/dev/null | cut -d' ' -f1) || true
    [ "$sum" = "$SHA" ] && return 0
    alive "$(pid_of serve)" || fail "osimages serve exited: $(tail -5 "$W/logs/serve.log")"
    sleep 0.5
  done
  fail "osimages serve does not serve $SHA after 120 s: see $W/logs/serve.log"
}

# --- the chart's server in the e2e cluster ----------------------------------

cluster_sh() { E2E_DIR=$CLUSTER_DIR "$ROOT/hack/e2e-cluster.sh" "$@"; }
in_cluster() { nsenter --net="/run/netns/$CLUSTER_NS" "$@"; }

# chart_up: the e2e cluster, joined to the box, and the chart installed in
# it as an operator installs it: its catalog Job resolves the test image
# from the box's registry, its server selects, pulls, verifies and serves
# it over HTTPS on a NodePort of the node, which the host reaches through
# the box's bridge and the link.
chart_up() {
  local t0 out
  t0=$(now)
  echo "$CLUSTER_DIR" >"$CLUSTER_FILE"
  cluster_sh up >>"$W/logs/cluster-up.log" 2>&1 || fail "the e2e cluster did not start: $(tail -3 "$W/logs/cluster-up.log") (see $CLUSTER_DIR/logs)"
  link_up
  log "e2e cluster up in $(($(now) - t0)) s (logs in $CLUSTER_DIR/logs), joined to the box by $LINK_BOX_IP <-> $LINK_CLUSTER_IP"

  # The same image, published again under a name whose registry address
  # the pods reach (the link's end in the box) and a repository of its
  # own: its signature names that address, and the box's first signature
  # stays the one the bench's `osimages serve` checks.
  mkdir -p "$W/chart"
  out=$(in_ns "$W/bin/publish" -registry "$LINK_BOX_IP:$REGISTRY_PORT" -image "$W/image/osimages-test.raw" \
    -repo-base m3box-chart/diskimage-builder \
    -catalog-values "$W/chart/catalog-values.yaml" -server-values "$W/chart/mgmt-values.yaml") || fail "publishing the test image for the chart failed"
  log "$out"
  # The chart's values, as an operator of the e2e scenarios sets them: the
  # image make image built (imported into the node's containerd), the
  # catalog Job on the sylva-units values publish wrote, the server with
  # the management values (the registries with the cosign key, the
  # additional selector of the test image), HTTPS with the run's
  # certificate, on a fixed NodePort. The fleet controller (one replica:
  # the machine has two cores) runs for the Cluster API chain, which needs
  # the workload cluster's catalog, the propagation and the check; the
  # scenarios need none of it, and run without it when the chain is off.
  local controller="{enabled: false}"
  [ "$WITH_CAPI" = 0 ] || controller="{enabled: true, replicas: 1, pdb: {minAvailable: 0}}"
  {
    cat <<EOV
image: {repository: osimages, tag: dev}
oci_registry_insecure: true
os_image_server_additional_selectors: {m3box: {flavor: m3box}}
osImagePersistenceDefaults: {size: 2Gi}
server:
  replicas: 1
  # The local volumes are small: no margin of a GiB on them.
  freeSpaceMargin: 64Mi
  tlsSecret: osimages-m3box-tls
service: {type: NodePort, port: 443, nodePort: $CHART_NODEPORT}
networkPolicy: {egressPorts: [443, $REGISTRY_PORT, 6443]}
controller: $controller
catalogJob:
  enabled: true
  values:
EOV
    sed 's/^/    /' "$W/chart/catalog-values.yaml"
    echo "cluster:"
    sed 's/^/  /' "$W/chart/mgmt-values.yaml"
  } >"$W/chart/values.yaml"
  out=$(cluster_sh exec "$W/bin/chart" -chart "$ROOT/charts/osimages" -namespace "$CHART_NS" \
    -tls-secret osimages-m3box-tls -tls-cert "$W/tls/server.crt" -tls-key "$W/tls/server.key" \
    -f "$W/chart/values.yaml" 2>&1) || fail "installing the chart failed: $out"
  log "$out"
  wait_chart_served
  log "the chart's server (pod $(chart_pod)) selected, pulled, verified and serves the image at https://$CLUSTER_NODE_IP:$CHART_NODEPORT, $(($(now) - t0)) s after the cluster started"
}

# link_up: the veth pair between the box and the cluster's namespace,
# made in the box with its peer moved at once into the cluster's (it
# never exists in the machine's namespace, and goes with either), and the
# routes both ways. The box forwards between its bridge (the host) and the
# link; the cluster's namespace forwards already (hack/e2e-cluster.sh).
link_up() {
  local r
  ip -n "$NS" link add m3-e2e type veth peer name m3-box netns "$CLUSTER_NS"
  ip -n "$NS" addr add "$LINK_BOX_IP/30" dev m3-e2e
  ip -n "$CLUSTER_NS" addr add "$LINK_CLUSTER_IP/30" dev m3-box
  ip -n "$NS" link set m3-e2e up
  ip -n "$CLUSTER_NS" link set m3-box up
  for r in $CLUSTER_ROUTES; do ip -n "$NS" route add "$r" via "$LINK_CLUSTER_IP"; done
  ip -n "$CLUSTER_NS" route add "$BOX_CIDR" via "$LINK_BOX_IP"
  in_ns sysctl -qw net.ipv4.ip_forward=1
}

ckc() { cluster_sh kubectl "$@"; }
chart_pod() { ckc -n "$CHART_NS" --request-timeout=10s get pods -l app.kubernetes.io/component=server -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }

# wait_chart_served: until the chart's server serves the image's checksum
# file at the URL the host downloads from (from the box, through the link
# and the NodePort: the path the host's packets take), and its served-set
# ConfigMap lists the image; then the catalog and that set, for render.
wait_chart_served() {
  local sum t0
  t0=$(now)
  while :; do
    sum=$(in_ns curl -sf --max-time 10 --cacert "$W/tls/ca.crt" "https://$CLUSTER_NODE_IP:$CHART_NODEPORT/images/$SHA/osimages-test.raw.sha256sum" 2>/dev/null | cut -d' ' -f1) || true
    if [ "$sum" = "$SHA" ]; then
      ckc -n "$CHART_NS" get configmap capm3-os-image-server-os-images -o jsonpath='{.data.values\.yaml}' >"$W/chart/served.yaml" 2>/dev/null || true
      grep "$SHA" "$W/chart/served.yaml" >/dev/null && break
    fi
    [ $(($(now) - t0)) -lt 300 ] || fail "the chart's server does not serve $SHA at https://$CLUSTER_NODE_IP:$CHART_NODEPORT after 300 s: $(ckc -n "$CHART_NS" get pods -o wide 2>&1 | tail -3); its log: $(ckc -n "$CHART_NS" logs "$(chart_pod)" --tail 5 2>&1)"
    sleep 1
  done
  ckc -n "$CHART_NS" get configmap os-images-info -o jsonpath='{.data.values\.yaml}' >"$W/chart/os-images.yaml" ||
    fail "the chart's catalog Job wrote no $CHART_NS/os-images-info"
}

# cluster_down: the e2e cluster the box started (the veth pair goes with
# its namespace), its server's log kept first (the kubelet deletes a pod's
# logs with the pod).
cluster_down() {
  [ -f "$CLUSTER_FILE" ] || return 0
  local dir pod
  dir=$(cat "$CLUSTER_FILE")
  if [ -f "$W/chart/values.yaml" ] && pod=$(chart_pod) && [ -n "$pod" ]; then
    ckc -n "$CHART_NS" --request-timeout=10s logs "$pod" >"$W/logs/chart-server.log" 2>&1 || true
  fi
  E2E_DIR=$dir "$ROOT/hack/e2e-cluster.sh" down >>"$W/logs/cluster-down.log" 2>&1 || { log "the e2e cluster did not stop: see $W/logs/cluster-down.log"; return 1; }
  rm -f "$CLUSTER_FILE"
}

# values_of FILE: the values.yaml of a ConfigMap file (its block scalar).
values_of() {
  awk '/^  values.yaml: \|/ {on = 1; next} on && /^  [^ ]/ {on = 0} on {sub(/^    /, ""); print}' "$1"
}

# render DELIVERY [chart|box]: the image URL and checksum of the
# Metal3MachineTemplate `osimages render` writes for a cluster whose level
# selects the test image, from the catalog and the served set the server
# published: the chart's (its ConfigMaps in the e2e cluster, its Service's
# NodePort on the node; the default) or the box's `osimages serve` (its
# files, $BR_IP:$SERVE_PORT).
render() {
  local d=$W/render host os_images served
  mkdir -p "$d"
  if [ "${2:-chart}" = chart ]; then
    host=$CLUSTER_NODE_IP:$CHART_NODEPORT os_images=$W/chart/os-images.yaml served=$W/chart/served.yaml
  else
    host=$BR_IP:$SERVE_PORT os_images=$d/os-images.yaml served=$W/serve/served.yaml
    values_of "$W/serve/os-images-info.yaml" >"$os_images"
  fi
  cat >"$d/cluster.yaml" <<EOV
name: m3box
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {flavor: m3box}
  image_provisioning_host: $host
  image_provisioning_scheme: https
  image_delivery: $1
EOV
  # The served set is the served-images values document itself
  # (capm3_os_image_server_images): the box's server writes it with
  # --output-file, the chart's into its ConfigMap.
  "$W/bin/osimages" render -f "$d/cluster.yaml" -f "$os_images" -f "$served" >"$d/$1.yaml" 2>"$d/$1.err" ||
    fail "osimages render ($1) failed: $(cat "$d/$1.err")"
  RENDER_URL=$(awk '$1 == "url:" {print $2; exit}' "$d/$1.yaml")
  RENDER_CHECKSUM=$(awk '$1 == "checksum:" {print $2; exit}' "$d/$1.yaml")
  RENDER_CHECKSUM_TYPE=$(awk '$1 == "checksumType:" {print $2; exit}' "$d/$1.yaml")
  [ -n "$RENDER_URL" ] || fail "osimages render ($1) wrote no image url: see $d/$1.yaml"
}

# --- the host ---------------------------------------------------------------

define_vm() {
  truncate -s 1G "$W/vm/node0.raw"
  cat >"$W/vm/node0.xml" <<EOX
<domain type='qemu'>
  <name>$NODE</name>
  <uuid>$VM_UUID</uuid>
  <memory unit='MiB'>2048</memory>
  <vcpu>2</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='network'/><boot dev='hd'/></os>
  <features><acpi/></features>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/><source file='/m3box/vm/node0.raw'/><target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <mac address='$VM_MAC'/><source bridge='br0'/><model type='virtio'/>
    </interface>
    <serial type='file'><source path='/m3box/logs/node0-console.log' append='on'/><target port='0'/></serial>
  </devices>
</domain>
EOX
  in_box virsh -q -c qemu:///system define /m3box/vm/node0.xml >/dev/null
}

# api METHOD PATH [JSON]: Ironic's REST API, as Metal3's baremetal-operator
# calls it.
# The root document is /, every other path /v1/...
api() {
  local path=$2
  [ "$path" = / ] && path= || path=/v1$path
  in_ns curl -sS --max-time 60 -X "$1" -H 'X-OpenStack-Ironic-API-Version: 1.96' \
    -H 'Content-Type: application/json' "http://$BR_IP:$IRONIC_PORT$path" ${3:+-d "$3"}
}
node_field() { api GET "/nodes/$NODE" | jq -r ".$1"; }

# change METHOD PATH DATA: a change of a node, asked again while Ironic
# answers 409 (NodeLocked: its power sync takes the node's lock every
# minute, for seconds on a busy machine); any other answer but 2xx fails,
# naming it. Without it a PUT of a provision state was lost, and the run
# waited 300 s for a state nobody asked for.
change() {
  local path=/v1$2 code t0
  t0=$(now)
  while :; do
    code=$(in_ns curl -sS --max-time 60 -o "$W/run/change.out" -w '%{http_code}' -X "$1" \
      -H 'X-OpenStack-Ironic-API-Version: 1.96' -H 'Content-Type: application/json' \
      "http://$BR_IP:$IRONIC_PORT$path" ${3:+-d "$3"}) || code=000
    case "$code" in
    2??) cat "$W/run/change.out"; return 0 ;;
    409 | 000) [ $(($(now) - t0)) -lt 180 ] || fail "Ironic answered $code to $1 $path for 180 s: $(cat "$W/run/change.out")" ;;
    *) fail "Ironic answered $code to $1 $path: $(cat "$W/run/change.out")" ;;
    esac
    sleep 2
  done
}
provision() { change PUT "/nodes/$NODE/states/provision" "{\"target\": \"$1\"}" >/dev/null; }

# wait_state TARGET TIMEOUT: until the node is in TARGET; returns 1 when it
# fails instead (a state naming "fail") or the time runs out.
wait_state() {
  local t0 s
  t0=$(now)
  while :; do
    s=$(node_field provision_state)
    [ "$s" = "$1" ] && return 0
    case "$s" in *fail* | error) return 1 ;; esac
    [ $(($(now) - t0)) -lt "$2" ] || return 1
    sleep 2
  done
}

enroll() {
  api POST /nodes "{\"name\": \"$NODE\", \"driver\": \"redfish\", \"boot_interface\": \"ipxe\", \"deploy_interface\": \"direct\",
    \"driver_info\": {\"redfish_address\": \"http://$BR_IP:$SUSHY_PORT\", \"redfish_system_id\": \"/redfish/v1/Systems/$VM_UUID\",
      \"redfish_username\": \"admin\", \"redfish_password\": \"password\", \"redfish_verify_ca\": false},
    \"properties\": {\"cpu_arch\": \"x86_64\", \"local_gb\": 1, \"capabilities\": \"boot_mode:bios\", \"root_device\": {\"name\": \"/dev/vda\"}}}" >"$W/logs/enroll.json"
  local uuid
  uuid=$(jq -r .uuid "$W/logs/enroll.json")
  [ -n "$uuid" ] && [ "$uuid" != null ] || fail "enrolling $NODE failed: $(cat "$W/logs/enroll.json")"
  api POST /ports "{\"address\": \"$VM_MAC\", \"node_uuid\": \"$uuid\"}" >/dev/null
  provision manage
  wait_state manageable 180 || fail "$NODE did not become manageable: $(node_field last_error)"
  provision provide
  wait_state available 300 || fail "$NODE did not become available: $(node_field last_error)"
  log "$NODE enrolled (redfish at sushy-tools, iPXE, direct deploy): available"
}

# markers: how many marker lines the console holds (0 before it exists).
markers() {
  local n
  n=$(grep -ac OSIMAGES-BOOT-MARKER "$W/logs/node0-console.log" 2>/dev/null) || true
  echo "${n:-0}"
}

# deploy URL CHECKSUM: instance_info as baremetal-operator writes it, then
# the deploy; DEPLOY_RESULT is active or failed, DEPLOY_SECS its time.
deploy() {
  local url=$1 checksum=$2 ii t0
  if [ "$(node_field provision_state)" != available ]; then
    provision deleted
    wait_state available 300 || fail "$NODE did not come back to available: $(node_field last_error)"
  fi
  ii="{\"image_source\": \"$url\""
  [ -n "$checksum" ] && ii="$ii, \"image_checksum\": \"$checksum\", \"image_os_hash_algo\": \"sha256\", \"image_os_hash_value\": \"$checksum\""
  [[ $url == oci://* ]] || ii="$ii, \"image_disk_format\": \"raw\""
  ii="$ii}"
  change PATCH "/nodes/$NODE" "[{\"op\": \"add\", \"path\": \"/instance_info\", \"value\": $ii}]" >/dev/null
  MARKERS_BEFORE=$(markers)
  t0=$(now)
  provision active
  DEPLOY_T0=$t0
  if wait_state active 900; then DEPLOY_RESULT=active; else DEPLOY_RESULT=failed; fi
  DEPLOY_SECS=$(($(now) - t0))
}

# wait_marker: the console's first new OSIMAGES-BOOT-MARKER line, once the
# host boots from its disk; MARKER_SECS from the deploy's start.
wait_marker() {
  for _ in $(seq 1 300); do
    if [ "$(markers)" -gt "$MARKERS_BEFORE" ]; then
      MARKER=$(grep -a OSIMAGES-BOOT-MARKER "$W/logs/node0-console.log" | sed -n "$((MARKERS_BEFORE + 1))p" | tr -d '\r')
      MARKER_SECS=$(($(now) - DEPLOY_T0))
      return 0
    fi
    sleep 1
  done
  fail "no OSIMAGES-BOOT-MARKER on $NODE's console 300 s after active: see $W/logs/node0-console.log"
}

# provisioned URL CHECKSUM: a deploy that must end active and boot the image.
provisioned() {
  deploy "$1" "$2"
  [ "$DEPLOY_RESULT" = active ] || fail "deploying $NODE from $1 failed after $DEPLOY_SECS s: $(node_field last_error)"
  wait_marker
  echo "provisioned $NODE from $1 in $DEPLOY_SECS s"
  echo "$MARKER"
  [ "$MARKER" = "OSIMAGES-BOOT-MARKER $SHA" ] || fail "$NODE booted a disk whose first 48 MiB are not the image (want sha256 $SHA)"
  log "marker $MARKER_SECS s after the deploy started"
}

# --- scenarios --------------------------------------------------------------

scenarios() {
  local t0
  # 1. The image URL and its checksum, as render writes them (http delivery).
  render http
  provisioned "$RENDER_URL" "$RENDER_CHECKSUM"

  # 2. The oci:// URL render writes: Ironic resolves the manifest at the
  # server's registry face, IPA downloads the blob, the layer digest is the
  # image's sha256.
  render oci
  provisioned "$RENDER_URL" "$RENDER_CHECKSUM"

  # 3. A wrong checksum: IPA writes the image, computes its sha256 and
  # refuses it; the deploy fails with Ironic's checksum error.
  render http
  local wrong
  wrong=$(printf 'not the image' | sha256sum | cut -d' ' -f1)
  deploy "$RENDER_URL" "$wrong"
  local err
  err=$(node_field last_error)
  [ "$DEPLOY_RESULT" = failed ] || fail "tampered: the deploy with checksum $wrong ended $DEPLOY_RESULT; it must fail"
  [[ $err == *"verify against checksum"* || $err == *"checksum"* ]] || fail "tampered: the deploy failed, but not with a checksum error: $err"
  echo "tampered $RENDER_URL (checksum $wrong) refused in $DEPLOY_SECS s: ${err:0:300}"

  # 4. The server's pod deleted while IPA downloads (as a node drain or
  # a rollout does): the StatefulSet starts it again on its volume, and
  # the deploy completes, or fails naming the download; the server serves
  # the verified image again, and a host that went active booted the
  # image itself.
  deploy_with_pod_deleted "$RENDER_URL" "$RENDER_CHECKSUM"
}

# host_downloads: the host's connections to the chart's NodePort, as the
# cluster's namespace tracks them (kube-proxy's DNAT: the pod sees the
# node's bridge address instead): "src:sport" of each, from the DHCP range
# (Ironic's own checks come from the link, $LINK_BOX_IP).
host_downloads() {
  in_cluster conntrack -L -p tcp --dport "$CHART_NODEPORT" --state ESTABLISHED 2>/dev/null |
    awk '{for (i = 1; i <= NF; i++) {if ($i ~ /^src=/ && !s) s = substr($i, 5); if ($i ~ /^sport=/ && !p) p = substr($i, 7)} if (s ~ /^10\.216\.0\./) print s ":" p; s = p = ""}'
}

deploy_with_pod_deleted() {
  local url=$1 checksum=$2 deleted= t0 peer pod uid stale
  if [ "$(node_field provision_state)" != available ]; then
    provision deleted
    wait_state available 300 || fail "$NODE did not come back to available: $(node_field last_error)"
  fi
  change PATCH "/nodes/$NODE" "[{\"op\": \"add\", \"path\": \"/instance_info\", \"value\": {\"image_source\": \"$url\", \"image_checksum\": \"$checksum\", \"image_os_hash_algo\": \"sha256\", \"image_os_hash_value\": \"$checksum\", \"image_disk_format\": \"raw\"}}]" >/dev/null
  MARKERS_BEFORE=$(markers)
  local console_before
  console_before=$(wc -l <"$W/logs/node0-console.log" 2>/dev/null || echo 0)
  pod=$(chart_pod)
  uid=$(ckc -n "$CHART_NS" get pod "$pod" -o jsonpath='{.metadata.uid}')
  # Connections an earlier deploy's IPA left established (its host was
  # powered off under it) are not this download.
  stale=$(host_downloads | paste -sd'|' -)
  t0=$(now)
  DEPLOY_T0=$t0
  provision active
  local i=0
  while [ $(($(now) - t0)) -lt 600 ]; do
    peer=$(host_downloads | grep -vxE "${stale:-^$}" | head -1) || true
    if [ -n "$peer" ]; then
      ckc -n "$CHART_NS" delete pod "$pod" --wait=false >/dev/null || fail "server pod deleted: kubectl delete pod $CHART_NS/$pod failed"
      deleted=$(($(now) - t0))
      break
    fi
    # The node's state every 3 s: the download lasts seconds.
    if [ $((++i % 30)) = 0 ]; then
      case "$(node_field provision_state)" in active | *fail*) break ;; esac
    fi
    sleep 0.1
  done
  [ -n "$deleted" ] || fail "server pod deleted: the host never connected to the chart's server within the deploy"
  log "the chart server's pod $CHART_NS/$pod deleted $deleted s into the deploy, while $peer downloaded"
  # The StatefulSet's new pod (the same name, another uid) on the same
  # volume: it serves the verified image again. Until the old one is gone
  # (up to its grace period), the name is still its.
  local now_uid=
  for _ in $(seq 1 120); do
    now_uid=$(ckc -n "$CHART_NS" get pod "$pod" -o jsonpath='{.metadata.uid}' 2>/dev/null) || true
    [ -n "$now_uid" ] && [ "$now_uid" != "$uid" ] && break
    sleep 0.5
  done
  [ -n "$now_uid" ] && [ "$now_uid" != "$uid" ] || fail "server pod deleted: the StatefulSet did not start $CHART_NS/$pod again within 60 s"
  wait_chart_served
  log "the chart's server is back ($CHART_NS/$pod, a new pod on its volume $(($(now) - t0)) s into the deploy): it serves $SHA (checksum file matches)"
  if wait_state active 900; then DEPLOY_RESULT=active; else DEPLOY_RESULT=failed; fi
  DEPLOY_SECS=$(($(now) - t0))
  # What IPA said of its download (its clock is the machine's: the line's
  # time against the deletion's above tells whether the old pod's
  # shutdown grace let the response finish).
  log "IPA: $(tail -n +"$((console_before + 1))" "$W/logs/node0-console.log" | tr -d '\r' |
    grep -a -m1 -E 'written to device|Download of image|ImageDownloadError|IncompleteRead|RemoteDisconnected' | cut -c1-240)"
  if [ "$DEPLOY_RESULT" = active ]; then
    wait_marker
    [ "$MARKER" = "OSIMAGES-BOOT-MARKER $SHA" ] || fail "server pod deleted: $NODE went active but booted a disk that is not the image: $MARKER"
    echo "server pod deleted mid-deploy: provisioned $NODE from $url in $DEPLOY_SECS s"
    echo "$MARKER"
  else
    local err
    err=$(node_field last_error)
    # Ironic says "Download of image ..." (IPA's ImageDownloadError), or,
    # cut before its answer began, names the step that downloads and the
    # connection that broke: "deploy.write_image failed ...
    # ('Connection aborted.', RemoteDisconnected(...))".
    [[ $err == *"$url"* || ${err,,} == *download* || ${err,,} == *checksum* || $err == *write_image*onnection* ]] || fail "server pod deleted: the deploy failed without naming the download: $err"
    echo "server pod deleted mid-deploy: deploy failed in $DEPLOY_SECS s with: ${err:0:300}"
  fi
}

# --- bench ------------------------------------------------------------------

# bench: deploys from osimages and from nginx serving the same file (Sylva's
# os-image-server is nginx), $BENCH_ROUNDS rounds (default 2), the order
# swapped each round so that neither server always meets a warmer host.
# Under TCG a deploy's time is mostly the emulated IPA boot, so the ratio
# is of whole deploys, as users wait for them, not of downloads alone.
bench() {
  render http box
  local osi_url=$RENDER_URL ngx_url=https://$BR_IP:$NGINX_PORT/images/$SHA/osimages-test.raw
  local rounds=${BENCH_ROUNDS:-2} r who
  local osi_active=0 osi_marker=0 ngx_active=0 ngx_marker=0
  mkdir -p "$W/nginx/images/$SHA"
  cp "$W/image/osimages-test.raw" "$W/nginx/images/$SHA/"
  for r in $(seq 1 "$rounds"); do
    for who in $([ $((r % 2)) = 1 ] && echo osimages nginx || echo nginx osimages); do
      if [ "$who" = osimages ]; then
        provisioned "$osi_url" "$SHA"
        osi_active=$((osi_active + DEPLOY_SECS)) osi_marker=$((osi_marker + MARKER_SECS))
      else
        provisioned "$ngx_url" "$SHA"
        ngx_active=$((ngx_active + DEPLOY_SECS)) ngx_marker=$((ngx_marker + MARKER_SECS))
      fi
      echo "bench-metal3: round $r, $who: active in $DEPLOY_SECS s, boot marker in $MARKER_SECS s"
    done
  done
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
  echo "bench-metal3: deploy to active, $rounds rounds: osimages $osi_active s, nginx $ngx_active s, ratio $(ratio "$osi_active" "$ngx_active")"
  echo "bench-metal3: deploy to boot marker, $rounds rounds: osimages $osi_marker s, nginx $ngx_marker s, ratio $(ratio "$osi_marker" "$ngx_marker")"
}

# --- teardown ---------------------------------------------------------------

down() {
  local holder p cmd bad=0
  holder=$(pid_of holder || true)
  if alive "$holder"; then
    nsenter -t "$holder" -m -n chroot "$R" virsh -q -c qemu:///system destroy "$NODE" >/dev/null 2>&1 || true
  fi
  capi_logs
  cluster_down || bad=1
  for p in serve registry ironic nginx dnsmasq sushy libvirtd virtlogd holder; do stop_pid "$p"; done
  # What the daemons started and left (the VM's qemu outlives libvirtd):
  # the processes of the run, by their command line or root.
  for p in $(box_processes); do kill -KILL "$p" 2>/dev/null || true; done
  for _ in $(seq 1 20); do [ -z "$(box_processes)" ] && break; sleep 0.5; done
  ip netns list | grep -w "$NS" >/dev/null && ip netns del "$NS"
  ip route show | grep "^blackhole $BOX_CIDR" >/dev/null && ip route del blackhole "$BOX_CIDR"
  rm -f "$W/run/ready" "$OWNER_FILE"
  return "$bad"
}

# box_processes: the PIDs of the run's processes, by their command line
# (naming the run directory) or their root (the Ironic tree): the VM's qemu
# outlives libvirtd, and a killed run leaves its daemons.
box_processes() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    if [[ $cmd == *"$W/"* ]] || [[ "$(readlink "$p/root" 2>/dev/null)" == "$R"* ]]; then
      echo "${p#/proc/}"
    fi
  done
}

check_clean() {
  local bad=0 p
  for p in $(box_processes); do
    log "process left: $p: $({ tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null)"
    bad=1
  done
  if grep -q " $W" /proc/self/mountinfo; then
    log "mounts left: $(awk -v w="$W" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | tr '\n' ' ')"
    bad=1
  fi
  ip netns list | grep -w "$NS" >/dev/null && { log "network namespace left: $NS"; bad=1; }
  ip route show | grep "10\.216\." >/dev/null && { log "route left: $(ip route show | grep '10\.216\.')"; bad=1; }
  losetup -a 2>/dev/null | grep "$W" >/dev/null && { log "loop device left: $(losetup -a | grep "$W")"; bad=1; }
  # The e2e cluster a run of the box started (its folder exists once one
  # did): its own check, processes, mounts, namespace, routes, iptables.
  [ ! -f "$CLUSTER_FILE" ] || { log "the e2e cluster the box started is still up ($CLUSTER_FILE)"; bad=1; }
  if [ -d "$CLUSTER_DIR" ]; then
    E2E_DIR=$CLUSTER_DIR "$ROOT/hack/e2e-cluster.sh" check-clean || bad=1
  fi
  [ "$bad" = 0 ] || fail "the box left the above behind (make e2e-metal3-down stops it)"
  log "clean: no process, mount, network namespace, route or loop device of the box or its e2e cluster left"
}

# --- main -------------------------------------------------------------------

main() {
  local mode=$1
  # Globals: the EXIT trap runs after main has returned.
  STATUS=0 T_START=$(now)
  preflight "$mode"
  finish() {
    local rc=$?
    [ "$STATUS" = 0 ] && STATUS=$rc
    down || STATUS=1
    check_clean || STATUS=1
    log "total $(($(now) - T_START)) s; logs: $W/logs (daemons, the host's console), $W/ironic/upper/var/log"
    exit "$STATUS"
  }
  trap finish EXIT
  trap 'exit 130' INT TERM
  up
  case "$mode" in
  run)
    scenarios
    if [ "$WITH_CAPI" = 1 ]; then
      capi_up
      capi_scenarios
    fi
    ;;
  bench) bench ;;
  esac
}

# on_box: the settings of a box that is up, for the commands run on it.
on_box() {
  [ -f "$W/run/ready" ] && alive "$(pid_of holder)" || fail "no box is up (hack/e2e-metal3.sh up starts one)"
  SHA=$(cat "$W/run/sha256")
}

case "${1:-run}" in
run)
  main run
  ;;
bench)
  WITH_CAPI=0 USE_CHART=0 BOX_SERVE=1
  main bench
  ;;
up)
  # Both servers: the box is there to debug scenarios, the chain or the
  # bench on.
  BOX_SERVE=1
  preflight up
  trap 'rc=$?; [ "$rc" = 0 ] || { down; check_clean; }; exit "$rc"' EXIT
  up
  log "the box and its e2e cluster stay up: hack/e2e-metal3.sh scenarios, bench-on-box, capi or down"
  ;;
scenarios)
  on_box
  [ -f "$W/chart/served.yaml" ] || fail "the chart's server is not up in this box (hack/e2e-metal3.sh up starts it)"
  scenarios
  ;;
capi)
  on_box
  out=$("$M3_DIR/build.sh" all) || fail "building the box's trees failed"
  eval "$out"
  # The box may have been started from another checkout: this one's
  # osimages and publisher (a new file each: the running server keeps its
  # own).
  nice -n 5 go build -o "$W/bin/osimages" ./cmd/osimages
  nice -n 5 go build -o "$W/bin/publish" ./test/metal3/publish
  nice -n 5 go build -o "$W/bin/chart" ./test/metal3/chart
  capi_build
  capi_debs
  capi_up
  capi_scenarios
  ;;
bench-on-box)
  on_box
  bench
  ;;
down)
  [ "$(id -u)" = 0 ] || fail "needs root"
  down
  check_clean
  ;;
check-clean) check_clean ;;
*) fail "unknown command $1 (want run, bench, up, scenarios, capi, bench-on-box, down or check-clean)" ;;
esac
