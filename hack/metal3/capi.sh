# The Cluster API chain of Metal3 in a box (issue 38), sourced by
# hack/e2e-metal3.sh: a management cluster's kube-apiserver and etcd, and
# Cluster API core, Cluster API Provider Metal3 and baremetal-operator's
# managers (built by capi-build.sh from their tagged module sources), all
# as processes of the box's network namespace; their CRDs and webhook
# configurations rendered from each release's own config/default, the
# webhooks served over TLS with a certificate of the run's CA. BMO drives
# the box's Ironic, the way Sylva's management cluster drives its hosts.
#
# capi_up starts it on a box that is up; capi_scenarios runs the chain:
# osimages' catalog, server, propagation and render produce the
# Metal3MachineTemplate, and CAPM3 and BMO provision the box's VM from it.

CAPI_DIR=$W/capi
CAPI_NS=capi-m3box   # the workload cluster's namespace
CAPI_CLUSTER=m3box   # its Cluster
MGMT_NS=sylva-system
KCFG=$CAPI_DIR/admin.kubeconfig
# Inside the namespace, on its loopback: the apiserver, etcd, and each
# manager's webhook server (all addresses of the namespace: they bind no
# address of their own) and health endpoint.
API_PORT=6443
WEBHOOK_PORT_CAPI=9443
WEBHOOK_PORT_CAPM3=9444
WEBHOOK_PORT_BMO=9445

kc() { in_ns "$KUBECTL" --kubeconfig "$KCFG" "$@"; }
osi() { in_ns "$W/bin/osimages" "$@"; }

# wait_for WHAT SECONDS CMD...: until CMD succeeds; fails naming WHAT.
wait_for() {
  local what=$1 secs=$2 t0
  shift 2
  t0=$(now)
  until "$@" >/dev/null 2>&1; do
    [ $(($(now) - t0)) -lt "$secs" ] || fail "$what: not after $secs s"
    sleep 1
  done
}

capi_build() {
  local out
  out=$("$M3_DIR/capi-build.sh") || fail "building the Cluster API chain failed"
  eval "$out"
  export CAPI_MANAGER CAPM3_MANAGER BMO_MANAGER KUBECTL M3MANIFESTS KUBE_APISERVER CAPI_SRC CAPM3_SRC BMO_SRC CAPM3_OCI_MANAGER CAPM3_OCI_SRC CAPI_VERSION CAPM3_VERSION BMO_VERSION
  local tools
  tools=$("$ROOT/hack/tools.sh" env) || fail "hack/tools.sh failed: the chain runs the envtest etcd"
  KUBEBUILDER_ASSETS=$(printf '%s\n' "$tools" | sed -n "s/^export KUBEBUILDER_ASSETS='\(.*\)'$/\1/p")
  [ -x "$KUBEBUILDER_ASSETS/etcd" ] || fail "no etcd in '$KUBEBUILDER_ASSETS' (hack/tools.sh builds it)"
  export KUBEBUILDER_ASSETS
}

# Ironic builds the config drive baremetal-operator asks for (user data,
# meta data) with genisoimage, mkisofs or xorrisofs (openstacksdk's
# configdrive.pack), which the box's tree lacks: Debian 13's genisoimage
# and what it needs that the tree has not, downloaded once with apt from the
# mirror of the machine's apt configuration (read at run time), cached, and
# installed into the run's overlay. Folding it into ironic.packages would
# rebuild the Ironic tree; it belongs there at its next rebuild.
CAPI_DEBS="genisoimage"
capi_debs_dir() { echo "$CACHE/metal3-capi-debs-$(key <(echo "$SUITE $CAPI_DEBS") "$IRONIC_TREE/var/lib/dpkg/status")"; }
capi_debs() {
  local dir tmp mirror want p
  dir=$(capi_debs_dir)
  [ -f "$dir/.complete" ] && return 0
  mirror=$(mirror)
  log "downloading Debian 13's $CAPI_DEBS and what the Ironic tree lacks of its dependencies into $dir (Ironic's config drive)"
  tmp=$(mktemp -d "$CACHE/.capi-debs.XXXXXX")
  mkdir -p "$tmp/apt/sources" "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/debs"
  printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" "$SUITE" >"$tmp/apt/sources/m3box.sources"
  local apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$tmp/apt/sources"
    -o "Dir::State::Lists=$tmp/apt/lists" -o "Dir::Cache=$tmp/apt/cache" -o Dir::State::status="$IRONIC_TREE/var/lib/dpkg/status"
    -o Dir::State::extended_states="$tmp/apt/extended_states" -o Debug::NoLocking=1
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root)
  apt-get update -qq "${apt_opts[@]}" >&2 || fail "apt-get update of $SUITE on $mirror failed"
  # Against the tree's own dpkg status: what an install into it would add.
  want=$(apt-get install -s -qq --no-install-recommends "${apt_opts[@]}" $CAPI_DEBS 2>&1 | awk '$1 == "Inst" {print $2}') ||
    fail "apt-get cannot resolve $CAPI_DEBS on $SUITE"
  # Nothing to add: the tree has them already (ironic.packages lists them).
  [ -z "$want" ] || (cd "$tmp/debs" && apt-get download -qq "${apt_opts[@]}" $want >&2) || fail "downloading $want failed"
  rm -rf "$dir"
  mv "$tmp/debs" "$dir"
  rm -rf "$tmp"
  touch "$dir/.complete"
}
capi_install_debs() {
  compgen -G "$(capi_debs_dir)/*.deb" >/dev/null || return 0
  mkdir -p "$W/capi-debs"
  cp "$(capi_debs_dir)"/*.deb "$W/capi-debs/"
  in_box sh -c 'dpkg -i /m3box/capi-debs/*.deb' >"$W/logs/capi-debs.log" 2>&1 || fail "installing $CAPI_DEBS into the box failed: see $W/logs/capi-debs.log"
}

capi_pki() {
  local d=$CAPI_DIR/pki
  mkdir -p "$d"
  (
    cd "$d"
    # cert NAME SUBJECT EXTENSIONS: a certificate of the run's CA (tls/).
    cert() {
      openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null
      printf '%s\n' "$3" >"$1.ext"
      openssl req -new -key "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA "$W/tls/ca.crt" -CAkey "$W/tls/ca.key" -CAcreateserial -out "$1.crt" -days 2 -extfile "$1.ext" 2>/dev/null
    }
    cert apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth"
    cert admin "/O=system:masters/CN=osimages-m3box-admin" "extendedKeyUsage=clientAuth"
    # One serving certificate for the three webhook servers, all on
    # 127.0.0.1 of the namespace.
    cert webhook /CN=m3box-webhooks "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext
  )
  # Where each manager reads its serving certificate: CAPI and CAPM3 take
  # --webhook-cert-dir; BMO has no flag and reads controller-runtime's
  # default, under $TMPDIR.
  local dir
  for dir in "$CAPI_DIR/webhook-certs" "$CAPI_DIR/bmo-tmp/k8s-webhook-server/serving-certs"; do
    mkdir -p "$dir"
    cp "$d/webhook.crt" "$dir/tls.crt"
    cp "$d/webhook.key" "$dir/tls.key"
  done
  cat >"$KCFG" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: m3box, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: $W/tls/ca.crt}}]
users: [{name: admin, user: {client-certificate: $d/admin.crt, client-key: $d/admin.key}}]
contexts: [{name: m3box, context: {cluster: m3box, user: admin}}]
current-context: m3box
EOF
}

# capi_manifests NAME SRC PORT: the CRDs and webhook configurations of the
# release in SRC, each webhook at https://127.0.0.1:PORT.
capi_manifests() {
  "$M3MANIFESTS" -kustomize "$2/config/default" -url "https://127.0.0.1:$3" -ca "$W/tls/ca.crt" >"$CAPI_DIR/$1.yaml" ||
    fail "rendering $2/config/default failed"
}

capi_up() {
  local t0
  t0=$(now)
  rm -rf "$CAPI_DIR"
  mkdir -p "$CAPI_DIR"
  capi_install_debs
  capi_pki
  start etcd "$KUBEBUILDER_ASSETS/etcd" --name m3box --data-dir "$CAPI_DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster m3box=http://127.0.0.1:2380 --log-level warn
  # No controller-manager: nothing here needs garbage collection or
  # service accounts' tokens; the managers delete what they own.
  start apiserver "$KUBE_APISERVER" --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$CAPI_DIR/pki/apiserver.crt" --tls-private-key-file="$CAPI_DIR/pki/apiserver.key" \
    --client-ca-file="$W/tls/ca.crt" \
    --service-account-key-file="$CAPI_DIR/pki/sa.pub" --service-account-signing-key-file="$CAPI_DIR/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.216.240.0/24 \
    --authorization-mode=RBAC --profiling=false --endpoint-reconciler-type=none
  wait_for "the management kube-apiserver's /readyz (see $W/logs/apiserver.log)" 120 kc get --raw /readyz
  capi_manifests capi "$CAPI_SRC" "$WEBHOOK_PORT_CAPI"
  capi_manifests capm3 "$CAPM3_SRC" "$WEBHOOK_PORT_CAPM3"
  capi_manifests bmo "$BMO_SRC" "$WEBHOOK_PORT_BMO"
  # Server-side: the largest CRDs exceed the annotation client-side apply
  # keeps.
  local m
  for m in capi capm3 bmo; do
    kc apply --server-side --force-conflicts -f "$CAPI_DIR/$m.yaml" >"$W/logs/apply-$m.log" 2>&1 ||
      fail "applying the CRDs and webhooks of $m failed: $(tail -3 "$W/logs/apply-$m.log")"
  done
  wait_for "the CRDs established" 60 kc wait --for=condition=Established --timeout=5s crd --all

  start capi "$CAPI_MANAGER" --kubeconfig "$KCFG" --leader-elect=false \
    --webhook-port "$WEBHOOK_PORT_CAPI" --webhook-cert-dir "$CAPI_DIR/webhook-certs" \
    --health-addr 127.0.0.1:9440 --diagnostics-address 127.0.0.1:9450 --insecure-diagnostics
  start_capm3 "$CAPM3_MANAGER"
  # BMO as Metal3 runs it beside its Ironic: the endpoint, no
  # authentication (the box's Ironic runs noauth: no credentials folder),
  # IPA's kernel and ramdisk from the box's nginx.
  start bmo env TMPDIR="$CAPI_DIR/bmo-tmp" METAL3_AUTH_ROOT_DIR="$CAPI_DIR/no-ironic-auth" \
    IRONIC_ENDPOINT="http://$BR_IP:$IRONIC_PORT/v1/" \
    DEPLOY_KERNEL_URL="http://$BR_IP:$BOOT_HTTP_PORT/ipa/ipa.kernel" \
    DEPLOY_RAMDISK_URL="http://$BR_IP:$BOOT_HTTP_PORT/ipa/ipa.initramfs" \
    "$BMO_MANAGER" --kubeconfig "$KCFG" --webhook-port "$WEBHOOK_PORT_BMO" \
    --health-addr 127.0.0.1:9442 --metrics-addr 0 -dev
  local name port
  for name in capi:9440 capm3:9441 bmo:9442; do
    port=${name#*:}
    name=${name%:*}
    wait_for "$name's manager ready (see $W/logs/$name.log)" 180 capi_ready "$name" "$port"
  done
  log "Cluster API $CAPI_VERSION, CAPM3 $CAPM3_VERSION and baremetal-operator $BMO_VERSION up in $(($(now) - t0)) s (kube-apiserver $("$KUBE_APISERVER" --version | cut -d' ' -f2), webhooks over TLS)"
}

start_capm3() {
  start capm3 "$1" --kubeconfig "$KCFG" --leader-elect=false \
    --webhook-port "$WEBHOOK_PORT_CAPM3" --webhook-cert-dir "$CAPI_DIR/webhook-certs" \
    --health-addr 127.0.0.1:9441 --diagnostics-address 127.0.0.1:9451 --insecure-diagnostics
}

capi_ready() {
  alive "$(pid_of "$1")" || fail "$1's manager exited: $(tail -5 "$W/logs/$1.log")"
  in_ns curl -sf "http://127.0.0.1:$2/readyz"
}

capi_stop() {
  local p
  for p in propagate bmo capm3 capi apiserver etcd; do stop_pid "$p"; done
}

# --- the host, handed to baremetal-operator --------------------------------

# release_node NAME: the Ironic node NAME deleted (undeployed first), so
# that baremetal-operator enrolls the VM itself from the BareMetalHost: the
# box's own scenarios enrolled it as node0, and an earlier run of the chain
# on the same box left BMO's node (NAMESPACE~NAME).
release_node() {
  local name=$1 s
  s=$(api GET "/nodes/$name" | jq -r '.provision_state // "none"')
  [ "$s" = none ] && return 0
  if [ "$s" != available ] && [ "$s" != manageable ] && [ "$s" != enroll ]; then
    change PUT "/nodes/$name/states/provision" '{"target": "deleted"}' >/dev/null
    wait_for "Ironic node $name undeployed" 300 node_in "$name" available
  fi
  if [ "$(api GET "/nodes/$name" | jq -r .provision_state)" = available ]; then
    change PUT "/nodes/$name/states/provision" '{"target": "manage"}' >/dev/null
    wait_for "Ironic node $name manageable" 120 node_in "$name" manageable
  fi
  change DELETE "/nodes/$name" >/dev/null
  [ "$(api GET "/nodes/$name" | jq -r '.provision_state // "none"')" = none ] || fail "could not delete the Ironic node $name: $(api GET "/nodes/$name")"
  in_box virsh -q -c qemu:///system destroy "$NODE" >/dev/null 2>&1 || true
}
node_in() { [ "$(api GET "/nodes/$1" | jq -r .provision_state)" = "$2" ]; }

bmh() { kc -n "$CAPI_NS" get baremetalhost "$NODE" -o jsonpath="$1"; }

# ironic_node JQ: JQ of the Ironic node of the BareMetalHost, which
# baremetal-operator names namespace~name.
ironic_node() { api GET "/nodes/$CAPI_NS~$NODE" | jq -r "$1"; }

# stuck_host: what each part says of a host that did not come to its
# state, printed before the failure (CI keeps the tail of the output, not
# the box's logs).
stuck_host() {
  local f
  echo "--- the host's console, last lines:"
  tail -c 20000 "$W/logs/node0-console.log" 2>/dev/null | tr -d '\r' | tr -c '[:print:]\n' '?' | grep -v '^\s*$' | tail -5 | cut -c1-200
  for f in bmo capm3 serve ironic; do
    echo "--- $f.log: $(grep -aiE 'error|fail|timeout|timed out' "$W/logs/$f.log" 2>/dev/null | tail -1 | cut -c1-400)"
  done
  echo "--- Ironic node $CAPI_NS~$NODE: $(ironic_node '{provision_state, target_provision_state, power_state, provision_updated_at, last_error, deploy_step,
    image_source: .instance_info.image_source, image_disk_format: .instance_info.image_disk_format,
    agent_last_heartbeat: .driver_internal_info.agent_last_heartbeat} | tostring' 2>&1 | cut -c1-600)"
}

enroll_bmh() {
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata: {name: $NODE-bmc, namespace: $CAPI_NS}
stringData: {username: admin, password: password}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata: {name: $NODE, namespace: $CAPI_NS}
spec:
  online: false
  bootMACAddress: "$VM_MAC"
  # BIOS: sushy-tools' libvirt driver would want OVMF for UEFI.
  bootMode: legacy
  automatedCleaningMode: disabled
  rootDeviceHints: {deviceName: /dev/vda}
  bmc:
    address: redfish+http://$BR_IP:$SUSHY_PORT/redfish/v1/Systems/$VM_UUID
    credentialsName: $NODE-bmc
EOF
}

# --- osimages, as a Sylva management cluster runs it -----------------------

# mgmt_serve: osimages serve reading the management catalog from the
# cluster (os-images-info) and publishing what it serves to the ConfigMap
# Sylva's charts read, on the data directory of the box's first server.
mgmt_serve() {
  stop_pid serve
  start serve "$W/bin/osimages" serve --kubeconfig "$KCFG" --data "$W/serve/data" --listen "$BR_IP:$SERVE_PORT" \
    --peer-listen 127.0.0.1:8081 --tls-cert "$W/tls/server.crt" --tls-key "$W/tls/server.key" \
    --free-space-margin 0 --os-images-configmap "$MGMT_NS/os-images-info" \
    -f "$W/serve/mgmt-values.yaml" -f "$CAPI_DIR/mgmt-values-extra.yaml" \
    --output-configmap "$MGMT_NS/capm3-os-image-server-os-images"
}

# served_in NS/NAME SHA: the served-images ConfigMap lists SHA.
served_in() { kc -n "${1%/*}" get configmap "${1#*/}" -o jsonpath='{.data.values\.yaml}' | grep "$2" >/dev/null; }

# cluster_values IMAGE_KEY DELIVERY: the workload cluster's values.
cluster_values() {
  cat <<EOV
name: $CAPI_CLUSTER
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  image_key: $1
  image_provisioning_host: $BR_IP:$SERVE_PORT
  image_provisioning_scheme: https
  image_delivery: $2
  # No cleaning between deployments (an IPA boot each under TCG): the
  # host's disk is rewritten whole by the next image.
  automatedCleaningMode: disabled
EOV
}

# workload_values IMAGE_KEY [DELIVERY]: the cluster's values, where Sylva
# keeps them (a ConfigMap the check controller and plan read), and as a
# file.
workload_values() {
  cluster_values "$1" "${2:-http}" >"$CAPI_DIR/cluster-values.yaml"
  kc -n "$CAPI_NS" create configmap cluster-values --from-file=values.yaml="$CAPI_DIR/cluster-values.yaml" \
    --dry-run=client -o yaml | kc label -f - --local -o yaml osimages.sylva-project.org/cluster-values= |
    kc apply -f - >/dev/null
}

# render_apply [FILE]: osimages render --apply of the cluster's values
# against its catalog and its copy of the served set; TEMPLATE is the
# template's name.
render_apply() {
  local out
  out=$(osi render --kubeconfig "$KCFG" --apply -n "$CAPI_NS" -f "${1:-$CAPI_DIR/cluster-values.yaml}" \
    --os-images-configmap "$CAPI_NS/os-images-info" \
    --served-configmap "$CAPI_NS/kyverno-cloned-os-image-server-images" 2>&1) || { echo "$out"; return 1; }
  TEMPLATE=$(printf '%s\n' "$out" | sed -n "s|^$CAPI_NS/\([^ ]*\) applied.*|\1|p" | head -1)
  [ -n "$TEMPLATE" ] || fail "osimages render --apply named no template: $out"
}

# machine N: a Machine and its Metal3Machine (named after the template
# they are made from), the bootstrap data given directly as a Secret (no
# bootstrap provider runs): what a MachineSet makes from a
# MachineDeployment. Cloned through v1beta2, the version of CAPM3's
# contract label, as Cluster API clones: through v1beta1, an oci:// image
# comes back with checksumType "" (CAPM3's v1beta2-to-v1beta1 conversion
# always sets the pointer, v1.14.0-rc.0 too), which v1beta1's own enum
# then refuses on create.
machine() {
  local m3m=$CAPI_CLUSTER-$1
  kc -n "$CAPI_NS" get metal3machinetemplates.v1beta2.infrastructure.cluster.x-k8s.io "$TEMPLATE" -o json |
    jq --arg name "$m3m" --arg ns "$CAPI_NS" --arg cluster "$CAPI_CLUSTER" --arg tpl "$TEMPLATE" '{
      apiVersion, kind: "Metal3Machine",
      metadata: {name: $name, namespace: $ns, labels: {"cluster.x-k8s.io/cluster-name": $cluster},
        annotations: {"cluster.x-k8s.io/cloned-from-name": $tpl,
          "cluster.x-k8s.io/cloned-from-groupkind": "Metal3MachineTemplate.infrastructure.cluster.x-k8s.io"}},
      spec: .spec.template.spec}' >"$CAPI_DIR/$m3m.json"
  kc apply -f "$CAPI_DIR/$m3m.json" >/dev/null
  kc apply -f - >/dev/null <<EOF
apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata:
  name: $m3m
  namespace: $CAPI_NS
  labels: {cluster.x-k8s.io/cluster-name: $CAPI_CLUSTER}
spec:
  clusterName: $CAPI_CLUSTER
  version: v1.32.5
  bootstrap: {dataSecretName: $CAPI_CLUSTER-bootstrap}
  infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3Machine, name: $m3m}
EOF
  MACHINE=$m3m
}

# wait_provisioned SHA SECS: the host provisioned by the Metal3Machine
# MACHINE with the image of SHA, and booted to its marker.
wait_provisioned() {
  local sha=$1 secs=$2 t0 state
  t0=$(now)
  while :; do
    state=$(bmh '{.status.provisioning.state}/{.spec.consumerRef.name}/{.status.provisioning.image.url}' 2>/dev/null) || true
    case "$state" in provisioned/"$MACHINE"/*"$sha"*) break ;; esac
    case "$(bmh '{.status.errorType}' 2>/dev/null)" in ?*) fail "BareMetalHost $CAPI_NS/$NODE: $(bmh '{.status.errorType}: {.status.errorMessage}')" ;; esac
    if [ $(($(now) - t0)) -ge "$secs" ]; then
      stuck_host
      fail "BareMetalHost $CAPI_NS/$NODE not provisioned by $MACHINE with $sha after $secs s: $state; Ironic: $(ironic_node '[.provision_state, .last_error] | join(" ")')"
    fi
    sleep 2
  done
}

capi_scenarios() {
  local t0 t_tpl out
  release_node "$NODE"
  release_node "$CAPI_NS~$NODE"
  kc create namespace "$MGMT_NS" >/dev/null
  kc create namespace "$CAPI_NS" >/dev/null
  kc label namespace "$CAPI_NS" sylva-project.org/workload-cluster= >/dev/null
  # The host first: baremetal-operator registers and inspects it while
  # osimages is set up.
  enroll_bmh
  t0=$(now)

  # The management side: its catalog in the cluster, the image server
  # reading it and publishing what it serves, the propagation of that into
  # the workload clusters' namespaces.
  echo "{}" >"$CAPI_DIR/mgmt-values-extra.yaml"
  osi catalog --kubeconfig "$KCFG" --apply -n "$MGMT_NS" -f "$W/serve/catalog-values.yaml" >/dev/null 2>"$W/logs/catalog-mgmt.log" ||
    fail "osimages catalog --apply ($MGMT_NS) failed: $(cat "$W/logs/catalog-mgmt.log")"
  mgmt_serve
  wait_for "the served-images ConfigMap listing $SHA (see $W/logs/serve.log)" 180 served_in "$MGMT_NS/capm3-os-image-server-os-images" "$SHA"
  start propagate "$W/bin/osimages" propagate --kubeconfig "$KCFG" --health-addr 127.0.0.1:18081 --metrics-addr 0 --log-format text

  # The workload cluster: its catalog, its values, its copy of the served
  # set.
  osi catalog --kubeconfig "$KCFG" --apply -n "$CAPI_NS" -f "$W/serve/catalog-values.yaml" >/dev/null 2>"$W/logs/catalog-wl.log" ||
    fail "osimages catalog --apply ($CAPI_NS) failed: $(cat "$W/logs/catalog-wl.log")"
  workload_values m3box-test
  wait_for "the served set propagated to $CAPI_NS (see $W/logs/propagate.log)" 120 served_in "$CAPI_NS/kyverno-cloned-os-image-server-images" "$SHA"
  log "osimages: management catalog, server and propagation, the workload cluster's catalog and values in place $(($(now) - t0)) s after the host was enrolled"

  # oci:// delivery: CAPM3 v1.13.2's schema requires image.checksum, which
  # an oci:// image has not: render refuses before writing anything.
  cluster_values m3box-test oci >"$CAPI_DIR/cluster-values-oci.yaml"
  if out=$(render_apply "$CAPI_DIR/cluster-values-oci.yaml"); then
    fail "osimages render applied an oci:// template that CAPM3 $CAPM3_VERSION refuses"
  fi
  [[ $out == *"requires spec.template.spec.image.checksum"* ]] || fail "render of oci:// failed, but not with CAPM3's refusal: $out"
  echo "oci:// with CAPM3 $CAPM3_VERSION: render refused: $(printf '%s\n' "$out" | grep -m1 'requires spec.template')"

  # The cluster: Metal3Cluster (its endpoint given: no control plane runs
  # here), Cluster, the bootstrap data as a Secret.
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata: {name: $CAPI_CLUSTER-bootstrap, namespace: $CAPI_NS, labels: {cluster.x-k8s.io/cluster-name: $CAPI_CLUSTER}}
type: cluster.x-k8s.io/secret
stringData:
  value: |
    #cloud-config
    hostname: $NODE
---
apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: Metal3Cluster
metadata: {name: $CAPI_CLUSTER, namespace: $CAPI_NS}
spec:
  controlPlaneEndpoint: {host: 10.216.0.250, port: 6443}
  cloudProviderEnabled: false
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: $CAPI_CLUSTER, namespace: $CAPI_NS}
spec:
  infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3Cluster, name: $CAPI_CLUSTER}
EOF
  wait_for "BareMetalHost $CAPI_NS/$NODE available (registered and inspected by baremetal-operator; see $W/logs/bmo.log)" 900 bmh_state available
  log "BareMetalHost $CAPI_NS/$NODE available $(($(now) - t0)) s after it was created: inspected: $(bmh '{.status.hardware.cpu.count} CPUs, {.status.hardware.ramMebibytes} MiB, NIC {.status.hardware.nics[0].mac}, disk {.status.hardware.storage[0].name}')"

  render_apply || fail "osimages render --apply failed"
  TEMPLATE1=$TEMPLATE
  t_tpl=$(now)
  machine_from_template 1 "$SHA"
  echo "BareMetalHost $CAPI_NS/$NODE provisioned by CAPM3 from Metal3MachineTemplate $TEMPLATE1"
  echo "template to provisioned host: $(($(now) - t_tpl)) s"
  wait_marker
  booted "$SHA" "$W/image"

  capi_management_change
  capi_image_upgrade
  capi_oci
}

# booted SHA DIR: the host booted the image of SHA (built in DIR): its
# first 48 MiB are the image, or, since baremetal-operator has Ironic add a
# config drive partition for the user data, all of them but the partition
# table (test-image.sh).
booted() {
  local want rest
  want=$(cat "$2/but-partition-table.sha256") || fail "$2/but-partition-table.sha256 is missing: test-image.sh writes it"
  rest=$(grep -a OSIMAGES-DISK-BUT-PARTITION-TABLE "$W/logs/node0-console.log" | tail -1 | tr -d '\r' | cut -d' ' -f2)
  echo "$MARKER"
  [ "$MARKER" = "OSIMAGES-BOOT-MARKER $1" ] && return 0
  [ "$rest" = "$want" ] || fail "$NODE booted a disk that is not the image $1: $MARKER; OSIMAGES-DISK-BUT-PARTITION-TABLE $rest, want $want"
  echo "OSIMAGES-DISK-BUT-PARTITION-TABLE $rest: the image $1 but its partition table, which Ironic extended with the config drive"
}

bmh_state() { [ "$(bmh '{.status.provisioning.state}')" = "$1" ]; }

# host_facts: what changes when the host is provisioned again.
host_facts() {
  echo "bmh=$(bmh '{.status.provisioning.state} {.spec.consumerRef.name} {.spec.image.url} {.status.operationHistory.provision.start}')"
  echo "ironic=$(ironic_node '[.provision_state, .provision_updated_at, .instance_info.image_source] | join(" ")')"
  echo "template=$(kc -n "$CAPI_NS" get metal3machinetemplate "$TEMPLATE1" -o jsonpath='{.metadata.generation}')"
}

# A second image, published to the box's registry as a new release would
# be: the test image built again (its FAT volume differs) under another
# name and registry key, signed with a key of its own, under a url of its
# own (osimages checks an image against every key whose registry url is a
# prefix of its URI: two keys on one url would each have to verify it).
second_image() {
  mkdir -p "$W/image2"
  cp -r "$W/image/vmlinuz" "$W/image/modules" "$W/image2/"
  SHA2=$(in_box /m3box/bin/test-image.sh /m3box/image2) || fail "the second test image was not built: see $W/image2/boot.log"
  [ "$SHA2" != "$SHA" ] || fail "the second test image is byte for byte the first ($SHA)"
  in_ns "$W/bin/publish" -registry 127.0.0.1:5000 -image "$W/image2/osimages-test.raw" -name m3box-test-v2 -registry-key m3box-v2 \
    -repo-base sylva-projects/sylva-elements/m3box-v2 \
    -catalog-values "$CAPI_DIR/catalog-values2.yaml" -server-values "$CAPI_DIR/mgmt-values2.yaml" >&2 ||
    fail "publishing the second test image failed"
}

# The guarantee, management side: a new image in the management catalog,
# selected and served, the old one kept; osimages plan says the workload
# cluster is unchanged, and no host is provisioned again.
capi_management_change() {
  local before after
  before=$(host_facts)
  second_image
  osi catalog -f "$W/serve/catalog-values.yaml" -f "$CAPI_DIR/catalog-values2.yaml" >"$CAPI_DIR/mgmt-catalog2.yaml" 2>"$W/logs/catalog-mgmt2.log" ||
    fail "osimages catalog (the new management catalog) failed: $(cat "$W/logs/catalog-mgmt2.log")"
  osi plan --kubeconfig "$KCFG" -f "$W/serve/mgmt-values.yaml" -f "$CAPI_DIR/mgmt-values2.yaml" --os-images "$CAPI_DIR/mgmt-catalog2.yaml" >"$CAPI_DIR/plan-mgmt.txt" 2>&1 ||
    fail "osimages plan says the management change would break a workload cluster: $(cat "$CAPI_DIR/plan-mgmt.txt")"
  echo "osimages plan (management change): $(grep -m1 "$CAPI_NS" "$CAPI_DIR/plan-mgmt.txt")"
  cp "$CAPI_DIR/mgmt-values2.yaml" "$CAPI_DIR/mgmt-values-extra.yaml"
  osi catalog --kubeconfig "$KCFG" --apply -n "$MGMT_NS" -f "$W/serve/catalog-values.yaml" -f "$CAPI_DIR/catalog-values2.yaml" >/dev/null 2>"$W/logs/catalog-mgmt2.log" ||
    fail "osimages catalog --apply ($MGMT_NS, the new image) failed: $(cat "$W/logs/catalog-mgmt2.log")"
  wait_for "the server serving the new image $SHA2 (see $W/logs/serve.log)" 300 served_in "$MGMT_NS/capm3-os-image-server-os-images" "$SHA2"
  served_in "$MGMT_NS/capm3-os-image-server-os-images" "$SHA" || fail "the management change dropped $SHA from the served set"
  # Flux renders the cluster again whenever its inputs change: the same
  # values give the same template.
  render_apply || fail "osimages render --apply (after the management change) failed"
  [ "$TEMPLATE" = "$TEMPLATE1" ] || fail "the management change made render write a new template $TEMPLATE (was $TEMPLATE1): its hosts would roll"
  after=$(host_facts)
  [ "$before" = "$after" ] || fail "management-side change: the host changed: before: $before; after: $after"
  echo "management-side change: no BareMetalHost reprovisioned"
  log "served now: $SHA (kept) and $SHA2 (new); template $TEMPLATE1 unchanged; $(printf '%s' "$after" | head -1)"
}

# The guarantee, workload side: the cluster's own image upgraded; plan
# says its nodes roll; render writes a new template, the Machine is
# replaced from it, and the host is provisioned once with the new image.
capi_image_upgrade() {
  local t0 start1 start2
  osi catalog --kubeconfig "$KCFG" --apply -n "$CAPI_NS" -f "$W/serve/catalog-values.yaml" -f "$CAPI_DIR/catalog-values2.yaml" >/dev/null 2>"$W/logs/catalog-wl2.log" ||
    fail "osimages catalog --apply ($CAPI_NS, the new image) failed: $(cat "$W/logs/catalog-wl2.log")"
  workload_values m3box-test-v2
  wait_for "the new image propagated to $CAPI_NS" 120 served_in "$CAPI_NS/kyverno-cloned-os-image-server-images" "$SHA2"
  osi plan --kubeconfig "$KCFG" -f "$W/serve/mgmt-values.yaml" -f "$CAPI_DIR/mgmt-values-extra.yaml" --os-images "$CAPI_DIR/mgmt-catalog2.yaml" >"$CAPI_DIR/plan-upgrade.txt" 2>&1 ||
    fail "osimages plan failed: $(cat "$CAPI_DIR/plan-upgrade.txt")"
  grep -q "rolls nodes" "$CAPI_DIR/plan-upgrade.txt" || fail "osimages plan does not say that $CAPI_NS's nodes roll: $(cat "$CAPI_DIR/plan-upgrade.txt")"
  echo "osimages plan (image upgrade): $(grep -m1 'rolls nodes' "$CAPI_DIR/plan-upgrade.txt")"
  render_apply || fail "osimages render --apply (the upgrade) failed"
  [ "$TEMPLATE" != "$TEMPLATE1" ] || fail "the upgrade rendered the same template $TEMPLATE1"
  start1=$(bmh '{.status.operationHistory.provision.start}')
  t0=$(now)
  # What a MachineDeployment's rollout does with one host: the old Machine
  # goes (CAPM3 deprovisions its host), a new one comes from the new
  # template.
  replace_machine
  machine_from_template 2 "$SHA2"
  start2=$(bmh '{.status.operationHistory.provision.start}')
  [ "$start2" != "$start1" ] || fail "the host's provisioning history did not change"
  wait_marker
  echo "image upgrade: $NODE reprovisioned with $SHA2 (Metal3MachineTemplate $TEMPLATE, $(($(now) - t0)) s)"
  booted "$SHA2" "$W/image2"
}

machine_gone() { ! kc -n "$CAPI_NS" get machine "$1" >/dev/null 2>&1; }

# machine_from_template N SHA: Machine N from TEMPLATE, its host
# provisioned with the image of SHA (markers counted from here on).
machine_from_template() {
  MARKERS_BEFORE=$(markers)
  DEPLOY_T0=$(now)
  machine "$1"
  wait_provisioned "$2" 900
}

# replace_machine: the Machine MACHINE deleted and its host deprovisioned,
# as a MachineDeployment's rollout does with one host.
replace_machine() {
  local t0
  t0=$(now)
  kc -n "$CAPI_NS" delete machine "$MACHINE" --wait=false >/dev/null
  wait_for "Machine $MACHINE deleted and $NODE deprovisioned (see $W/logs/capm3.log, $W/logs/bmo.log)" 600 machine_gone "$MACHINE"
  wait_for "BareMetalHost $CAPI_NS/$NODE available again" 600 bmh_state available
  log "Machine $MACHINE deleted, $NODE deprovisioned in $(($(now) - t0)) s"
}

# The oci:// delivery through CAPM3. The Go module proxy serves no CAPM3
# that accepts it (v1.14.x: 403); v1.13.2 with the one upstream commit
# that makes v1.14.0-rc.0 accept it (patches/, capi-build.sh) does. The
# workload cluster asks for oci://: plan says first that the installed
# CAPM3 refuses it; CAPM3 is then upgraded in place (its CRDs and webhooks
# applied, its manager replaced), plan says the nodes roll, render writes
# the oci:// template, and the host is provisioned from it with the
# cluster's first image.
capi_oci() {
  local t0 url
  workload_values m3box-test oci
  osi plan --kubeconfig "$KCFG" -f "$W/serve/mgmt-values.yaml" -f "$CAPI_DIR/mgmt-values-extra.yaml" --os-images "$CAPI_DIR/mgmt-catalog2.yaml" >"$CAPI_DIR/plan-oci-refused.txt" 2>&1 || true
  grep -q "requires spec.template.spec.image.checksum" "$CAPI_DIR/plan-oci-refused.txt" ||
    fail "osimages plan does not say that CAPM3 $CAPM3_VERSION refuses $CAPI_NS's oci:// delivery: $(cat "$CAPI_DIR/plan-oci-refused.txt")"
  echo "osimages plan (oci:// with CAPM3 $CAPM3_VERSION): $(grep -m1 'requires spec.template.spec.image.checksum' "$CAPI_DIR/plan-oci-refused.txt")"

  t0=$(now)
  stop_pid capm3
  capi_manifests capm3-oci "$CAPM3_OCI_SRC" "$WEBHOOK_PORT_CAPM3"
  kc apply --server-side --force-conflicts -f "$CAPI_DIR/capm3-oci.yaml" >"$W/logs/apply-capm3-oci.log" 2>&1 ||
    fail "applying the CRDs and webhooks of CAPM3 $CAPM3_VERSION with the oci:// commit failed: $(tail -3 "$W/logs/apply-capm3-oci.log")"
  wait_for "the CRDs established" 60 kc wait --for=condition=Established --timeout=5s crd --all
  start_capm3 "$CAPM3_OCI_MANAGER"
  wait_for "capm3's manager ready (see $W/logs/capm3.log)" 180 capi_ready capm3 9441
  log "CAPM3 upgraded in place to $CAPM3_VERSION with upstream's oci:// commit (PR #3522, in v1.14.0-rc.0) in $(($(now) - t0)) s"

  osi plan --kubeconfig "$KCFG" -f "$W/serve/mgmt-values.yaml" -f "$CAPI_DIR/mgmt-values-extra.yaml" --os-images "$CAPI_DIR/mgmt-catalog2.yaml" >"$CAPI_DIR/plan-oci.txt" 2>&1 ||
    fail "osimages plan failed with CAPM3 accepting oci://: $(cat "$CAPI_DIR/plan-oci.txt")"
  grep -q "rolls nodes" "$CAPI_DIR/plan-oci.txt" || fail "osimages plan does not say that $CAPI_NS's nodes roll to oci:// delivery: $(cat "$CAPI_DIR/plan-oci.txt")"
  echo "osimages plan (oci:// with CAPM3 $CAPM3_VERSION + PR #3522): $(grep -m1 'rolls nodes' "$CAPI_DIR/plan-oci.txt")"
  render_apply || fail "osimages render --apply (oci://) failed"
  url=$(kc -n "$CAPI_NS" get metal3machinetemplate "$TEMPLATE" -o jsonpath='{.spec.template.spec.image.url}')
  [[ $url == oci://*"$SHA"* ]] || fail "render --apply wrote $TEMPLATE with the image url $url, not the oci:// reference of $SHA"

  t0=$(now)
  replace_machine
  machine_from_template 3 "$SHA"
  wait_marker
  echo "oci:// with CAPM3 $CAPM3_VERSION + PR #3522: $NODE reprovisioned from $url (Metal3MachineTemplate $TEMPLATE, $(($(now) - t0)) s)"
  booted "$SHA" "$W/image"
}
