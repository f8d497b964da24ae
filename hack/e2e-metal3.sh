#!/usr/bin/env bash
# make e2e-metal3: Metal3 in a box. A virtual bare-metal host (qemu, TCG)
# with a Redfish BMC (sushy-tools, libvirt) is provisioned by Ironic 29 and
# ironic-python-agent from the test image osimages serves, the way a Sylva
# management cluster provisions its hosts: the image is published to an OCI
# registry, resolved by `osimages catalog`, selected, pulled and verified by
# `osimages serve`, and its URL comes from `osimages render`. Everything runs
# in the network namespace $NS (10.216.0.0/16, blackholed on the machine
# while it runs); see docs/development.md, "Metal3 in a box".
#
#   hack/e2e-metal3.sh [run]      build what is missing, start the box, run
#                                 the scenarios, stop it, check it is gone
#   hack/e2e-metal3.sh bench      the same box: deploy from osimages, then
#                                 from nginx serving the same file; the ratio
#   hack/e2e-metal3.sh up         only start the box, and leave it up (to
#                                 debug: then `scenarios`, `bench`, `down`)
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
  if ip netns list | grep -w "$NS" >/dev/null || ip route show | grep "^blackhole $BOX_CIDR" >/dev/null; then
    [ ! -f "$OWNER_FILE" ] || read -r owner mode <"$OWNER_FILE" || true
    if alive "$owner" && tr '\0' ' ' <"/proc/$owner/cmdline" 2>/dev/null | grep e2e-metal3 >/dev/null; then
      fail "a box is up and in use by hack/e2e-metal3.sh (PID $owner, $mode): wait for it to end, or stop it (kill $owner) and run make e2e-metal3-down"
    fi
    [ "$mode" != up ] || fail "a box started with 'hack/e2e-metal3.sh up' is still up: stop it with make e2e-metal3-down"
    log "a box left by a killed run is still up (netns $NS or the route to $BOX_CIDR, no run owns it): stopping it first"
    down
    check_clean
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
    printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "$BR_IP" >server.ext
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

  start registry "$W/bin/registry" -listen 127.0.0.1:5000 -root "$W/registry"
  for _ in $(seq 1 60); do in_ns curl -sf -o /dev/null http://127.0.0.1:5000/v2/ && break; sleep 0.5; done
  out=$(in_ns "$W/bin/publish" -registry 127.0.0.1:5000 -image "$W/image/osimages-test.raw" \
    -catalog-values "$W/serve/catalog-values.yaml" -server-values "$W/serve/mgmt-values.yaml") || fail "publishing the test image failed"
  log "$out"
  in_ns "$W/bin/osimages" catalog -f "$W/serve/catalog-values.yaml" >"$W/serve/os-images-info.yaml" 2>"$W/logs/catalog.log" ||
    fail "osimages catalog failed: $(cat "$W/logs/catalog.log")"
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

# values_of FILE: the values.yaml of a ConfigMap file (its block scalar).
values_of() {
  awk '/^  values.yaml: \|/ {on = 1; next} on && /^  [^ ]/ {on = 0} on {sub(/^    /, ""); print}' "$1"
}

# render DELIVERY: the image URL and checksum of the Metal3MachineTemplate
# `osimages render` writes for a cluster whose level selects the test
# image, from the catalog and the served set the server published.
render() {
  local d=$W/render
  mkdir -p "$d"
  cat >"$d/cluster.yaml" <<EOV
name: m3box
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {flavor: m3box}
  image_provisioning_host: $BR_IP:$SERVE_PORT
  image_provisioning_scheme: https
  image_delivery: $1
EOV
  values_of "$W/serve/os-images-info.yaml" >"$d/os-images.yaml"
  # served.yaml, the server's --output-file, is the served-images values
  # document itself (capm3_os_image_server_images).
  "$W/bin/osimages" render -f "$d/cluster.yaml" -f "$d/os-images.yaml" -f "$W/serve/served.yaml" >"$d/$1.yaml" 2>"$d/$1.err" ||
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

  # 4. The server killed while IPA downloads, then started again on the
  # same data directory: the deploy completes, or fails naming the
  # download; the server serves the verified image again, and a host that
  # went active booted the image itself.
  deploy_with_server_killed "$RENDER_URL" "$RENDER_CHECKSUM"
}

deploy_with_server_killed() {
  local url=$1 checksum=$2 killed= t0 peer
  if [ "$(node_field provision_state)" != available ]; then
    provision deleted
    wait_state available 300 || fail "$NODE did not come back to available: $(node_field last_error)"
  fi
  change PATCH "/nodes/$NODE" "[{\"op\": \"add\", \"path\": \"/instance_info\", \"value\": {\"image_source\": \"$url\", \"image_checksum\": \"$checksum\", \"image_os_hash_algo\": \"sha256\", \"image_os_hash_value\": \"$checksum\", \"image_disk_format\": \"raw\"}}]" >/dev/null
  MARKERS_BEFORE=$(markers)
  # Connections an earlier deploy's IPA left established (its host was
  # powered off under it) are not this download.
  local stale
  stale=$(in_ns ss -Htn state established "( sport = :$SERVE_PORT )" | awk '{print $4}' | paste -sd'|' -)
  t0=$(now)
  DEPLOY_T0=$t0
  provision active
  # The host's download is the only connection to the server from the DHCP
  # range (Ironic's own checks come from $BR_IP): kill the server as soon
  # as it is there.
  local i=0
  while [ $(($(now) - t0)) -lt 600 ]; do
    peer=$(in_ns ss -Htn state established "( sport = :$SERVE_PORT )" | awk '{print $4}' | grep -v "^$BR_IP:" | grep -vxE "${stale:-^$}" | head -1) || true
    if [ -n "$peer" ]; then
      kill -KILL "$(pid_of serve)"
      killed=$(($(now) - t0))
      break
    fi
    # The node's state every 3 s: the download lasts about 2 s.
    if [ $((++i % 30)) = 0 ]; then
      case "$(node_field provision_state)" in active | *fail*) break ;; esac
    fi
    sleep 0.1
  done
  [ -n "$killed" ] || fail "server killed: the host never connected to the server within the deploy"
  log "osimages serve killed (SIGKILL) $killed s into the deploy, while $peer downloaded"
  rm -f "$W/run/serve.pid"
  start_serve
  wait_served
  log "osimages serve started again on its data directory: it serves $SHA (checksum file matches)"
  if wait_state active 900; then DEPLOY_RESULT=active; else DEPLOY_RESULT=failed; fi
  DEPLOY_SECS=$(($(now) - t0))
  if [ "$DEPLOY_RESULT" = active ]; then
    wait_marker
    [ "$MARKER" = "OSIMAGES-BOOT-MARKER $SHA" ] || fail "server killed: $NODE went active but booted a disk that is not the image: $MARKER"
    echo "server killed mid-deploy: provisioned $NODE from $url in $DEPLOY_SECS s"
    echo "$MARKER"
  else
    local err
    err=$(node_field last_error)
    # Ironic says "Download of image ..." (IPA's ImageDownloadError), or,
    # killed before its answer began, names the step that downloads and
    # the connection that broke: "deploy.write_image failed ...
    # ('Connection aborted.', RemoteDisconnected(...))".
    [[ $err == *"$url"* || ${err,,} == *download* || ${err,,} == *checksum* || $err == *write_image*onnection* ]] || fail "server killed: the deploy failed without naming the download: $err"
    echo "server killed mid-deploy: deploy failed in $DEPLOY_SECS s with: ${err:0:300}"
  fi
}

# --- bench ------------------------------------------------------------------

# bench: deploys from osimages and from nginx serving the same file (Sylva's
# os-image-server is nginx), $BENCH_ROUNDS rounds (default 2), the order
# swapped each round so that neither server always meets a warmer host.
# Under TCG a deploy's time is mostly the emulated IPA boot, so the ratio
# is of whole deploys, as users wait for them, not of downloads alone.
bench() {
  render http
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
  local holder p cmd
  holder=$(pid_of holder || true)
  if alive "$holder"; then
    nsenter -t "$holder" -m -n chroot "$R" virsh -q -c qemu:///system destroy "$NODE" >/dev/null 2>&1 || true
  fi
  capi_stop
  for p in serve registry ironic nginx dnsmasq sushy libvirtd virtlogd holder; do stop_pid "$p"; done
  # What the daemons started and left (the VM's qemu outlives libvirtd):
  # the processes of the run, by their command line or root.
  for p in $(box_processes); do kill -KILL "$p" 2>/dev/null || true; done
  for _ in $(seq 1 20); do [ -z "$(box_processes)" ] && break; sleep 0.5; done
  ip netns list | grep -w "$NS" >/dev/null && ip netns del "$NS"
  ip route show | grep "^blackhole $BOX_CIDR" >/dev/null && ip route del blackhole "$BOX_CIDR"
  rm -f "$W/run/ready" "$OWNER_FILE"
  return 0
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
  [ "$bad" = 0 ] || fail "the box left the above behind (make e2e-metal3-down stops it)"
  log "clean: no process, mount, network namespace, route or loop device of the box left"
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
run) main run ;;
bench)
  WITH_CAPI=0
  main bench
  ;;
up)
  preflight up
  trap 'rc=$?; [ "$rc" = 0 ] || { down; check_clean; }; exit "$rc"' EXIT
  up
  log "the box stays up: hack/e2e-metal3.sh scenarios, bench or down"
  ;;
scenarios)
  on_box
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
  capi_build
  capi_debs
  trap 'capi_stop' EXIT
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
