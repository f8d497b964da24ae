# The Cluster API chain of Metal3 in a box (issue 38), sourced by
# hack/e2e-metal3.sh: Cluster API core, Cluster API Provider Metal3 and
# baremetal-operator in the e2e cluster, where the chart runs osimages, as a
# Sylva management cluster holds them all. Each manager is built from its
# tagged module source (capi-build.sh), packed into a container image and
# deployed with its release's own config/default (kustomize, as upstream
# makes its release manifests; clusterctl's variables; the certificates
# and CA injection cert-manager would do, done by m3manifests: nothing else
# here issues them). BMO drives the box's Ironic, the way Sylva's
# management cluster drives its hosts.
#
# capi_up deploys the providers on a box that is up; capi_scenarios runs
# the chain: the chart's catalog Job, server and fleet controller (the
# workload namespace's catalog, the propagation, the check) and osimages
# render produce the Metal3MachineTemplate, and CAPM3 and BMO provision the
# box's VM from it.

CAPI_DIR=$W/capi
CAPI_NS=capi-m3box # the workload cluster's namespace
CAPI_CLUSTER=m3box # its Cluster
MGMT_NS=$CHART_NS  # the chart's release namespace: the management side
KCFG=$CAPI_DIR/admin.kubeconfig
# The image each release's config/default names, replaced by the one
# packed here from the manager built, imported into the node's containerd
# (nothing is pulled).
CAPI_UPSTREAM_IMAGE=gcr.io/k8s-staging-cluster-api/cluster-api-controller
CAPM3_UPSTREAM_IMAGE=quay.io/metal3-io/cluster-api-provider-metal3
BMO_UPSTREAM_IMAGE=quay.io/metal3-io/baremetal-operator
LOCAL_IMAGES=local/m3box
CAPI_DEPLOY=capi-system/capi-controller-manager
CAPM3_DEPLOY=capm3-system/capm3-controller-manager
BMO_DEPLOY=baremetal-operator-system/baremetal-operator-controller-manager

# In the e2e cluster's network namespace, as its admin: kubectl and
# osimages' commands, as an operator runs them against the management
# cluster.
kc() { in_cluster "$(cat "$CLUSTER_DIR/run/bin")/kubectl" --kubeconfig "$KCFG" "$@"; }
osi() { in_cluster "$W/bin/osimages" "$@"; }

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
  export CAPI_MANAGER CAPM3_MANAGER BMO_MANAGER M3MANIFESTS CAPI_SRC CAPM3_SRC BMO_SRC CAPM3_OCI_MANAGER CAPM3_OCI_SRC CAPI_VERSION CAPM3_VERSION BMO_VERSION
  mkdir -p "$W/bin"
  nice -n 5 go build -o "$W/bin/image" ./hack/image
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

# --- the providers, deployed in the e2e cluster ------------------------------

# capi_image NAME MANAGER ENTRYPOINT TAG: MANAGER packed as the image
# $LOCAL_IMAGES/NAME:TAG, the binary at ENTRYPOINT (where its Deployment
# runs it), and imported into the node's containerd.
capi_image() {
  local tar=$CAPI_DIR/images/$1-$4.tar
  mkdir -p "$CAPI_DIR/images"
  "$W/bin/image" --binary "$2" --entrypoint "$3" --tarball "$tar" --tag "$LOCAL_IMAGES/$1:$4" \
    --labels "org.opencontainers.image.version=$4" >"$W/logs/image-$1-$4.log" 2>&1 ||
    fail "packing $2 into an image failed: $(tail -3 "$W/logs/image-$1-$4.log")"
  cluster_sh import "$tar" || fail "importing $tar into the e2e cluster failed"
  rm -f "$tar"
}

# capi_render NAME SRC IMAGE NEW_IMAGE [RESOURCE...] [-- LINE...]: the
# provider's config/default in SRC as an operator deploys it, through a
# kustomize overlay of it (with RESOURCE folders of SRC before it; LINE
# added to the kustomization): its image replaced by NEW_IMAGE, pulled only
# if not present (it is imported, never pulled); rendered by m3manifests
# into CAPI_DIR/NAME.yaml.
capi_render() {
  local name=$1 src=$2 image=$3 new=$4 d=$CAPI_DIR/kustomize/$1 r
  shift 4
  local resources=() lines=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do resources+=("$1"); shift; done
  [ $# -eq 0 ] || { shift; lines=("$@"); }
  mkdir -p "$d"
  {
    echo "resources:"
    # kustomize takes the package by a relative path.
    for r in ${resources[@]+"${resources[@]}"} config/default; do echo "- $(realpath --relative-to="$d" "$src/$r")"; done
    echo "images: [{name: $image, newName: ${new%:*}, newTag: ${new##*:}}]"
    echo "patches:"
    echo "- target: {kind: Deployment}"
    echo "  patch: '[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/imagePullPolicy\", \"value\": \"IfNotPresent\"}]'"
    printf '%s\n' ${lines[@]+"${lines[@]}"}
  } >"$d/kustomization.yaml"
  "$M3MANIFESTS" -kustomize "$d" -ca "$W/tls/ca.crt" -ca-key "$W/tls/ca.key" >"$CAPI_DIR/$name.yaml" 2>"$W/logs/m3manifests-$name.log" ||
    fail "rendering $src/config/default failed: $(cat "$W/logs/m3manifests-$name.log")"
}

# capi_apply NAME NAMESPACE/DEPLOYMENT PROBE: CAPI_DIR/NAME.yaml applied
# (server-side: the largest CRDs exceed what client-side apply keeps in its
# annotation), the manager's Deployment rolled out, and its webhooks
# answering: the object PROBE prints, created with a server-side dry run,
# goes through them. A Deployment rolled out is not yet a webhook the
# apiserver reaches (right after CAPM3's upgrade, render's apply once
# timed out in the conversion webhook, 30 s, the Service not yet leading
# to the new pod).
capi_apply() {
  local log=$W/logs/apply-$1.log t0
  kc apply --server-side --force-conflicts -f "$CAPI_DIR/$1.yaml" >"$log" 2>&1 ||
    fail "applying the objects of $1 failed: $(tail -3 "$log")"
  if ! kc -n "${2%/*}" rollout status "deployment/${2#*/}" --timeout=300s >>"$log" 2>&1; then
    kc -n "${2%/*}" get pods -o wide >>"$log" 2>&1 || true
    fail "$1's manager did not roll out: $(tail -3 "$log"); its log: $(kc -n "${2%/*}" logs "deployment/${2#*/}" --tail 5 2>&1)"
  fi
  t0=$(now)
  until "$3" | kc create --dry-run=server -f - >>"$log" 2>&1; do
    [ $(($(now) - t0)) -lt 180 ] || fail "$1's webhooks do not answer 180 s after its Deployment rolled out: $(tail -2 "$log")"
    sleep 2
  done
}

# Objects whose dry-run create goes through each provider's webhooks:
# conversion from v1beta1 (the stored version is v1beta2) and validation.
# (A Cluster would not do for Cluster API: converting one with an
# infrastructureRef looks up the referenced kind's CRD, which CAPM3, applied
# after it, installs.)
probe_capi() {
  printf '%s\n' 'apiVersion: cluster.x-k8s.io/v1beta1' 'kind: MachineHealthCheck' 'metadata: {name: probe, namespace: default}' \
    'spec: {clusterName: probe, selector: {matchLabels: {probe: "true"}}, unhealthyConditions: [{type: Ready, status: Unknown, timeout: 300s}]}'
}
probe_capm3() {
  printf '%s\n' 'apiVersion: infrastructure.cluster.x-k8s.io/v1beta1' 'kind: Metal3MachineTemplate' \
    'metadata: {name: probe, namespace: default}' \
    'spec: {template: {spec: {image: {url: "http://probe/image.raw", checksum: "http://probe/image.raw.sha256sum", checksumType: sha256, format: raw}}}}'
}
probe_bmo() {
  printf '%s\n' 'apiVersion: metal3.io/v1alpha1' 'kind: BareMetalHost' 'metadata: {name: probe, namespace: default}' \
    'spec: {online: false, bootMACAddress: "52:54:00:00:00:01"}'
}

capi_up() {
  local t0
  t0=$(now)
  rm -rf "$CAPI_DIR"
  mkdir -p "$CAPI_DIR"
  cp "$CLUSTER_DIR/admin.kubeconfig" "$KCFG"
  if kc get namespace "$CAPI_NS" >/dev/null 2>&1; then
    fail "the chain ran on this box already (namespace $CAPI_NS exists): hack/e2e-metal3.sh down, then up, to run it again"
  fi
  capi_install_debs
  mkdir -p "$CAPI_DIR/kustomize"
  capi_image cluster-api-controller "$CAPI_MANAGER" /manager "$CAPI_VERSION"
  capi_image cluster-api-provider-metal3 "$CAPM3_MANAGER" /manager "$CAPM3_VERSION"
  capi_image baremetal-operator "$BMO_MANAGER" /baremetal-operator "$BMO_VERSION"
  capi_render capi "$CAPI_SRC" "$CAPI_UPSTREAM_IMAGE" "$LOCAL_IMAGES/cluster-api-controller:$CAPI_VERSION"
  capi_render capm3 "$CAPM3_SRC" "$CAPM3_UPSTREAM_IMAGE" "$LOCAL_IMAGES/cluster-api-provider-metal3:$CAPM3_VERSION"
  # BMO beside its Ironic, as Metal3's docs deploy it: the settings of
  # config/default's ironic.env replaced by the box's (the endpoint; no
  # authentication, as the box runs Ironic; IPA's kernel and ramdisk from
  # the box's nginx), its namespace from config/namespace.
  printf '%s\n' "IRONIC_ENDPOINT=http://$BR_IP:$IRONIC_PORT/v1/" \
    "DEPLOY_KERNEL_URL=http://$BR_IP:$BOOT_HTTP_PORT/ipa/ipa.kernel" \
    "DEPLOY_RAMDISK_URL=http://$BR_IP:$BOOT_HTTP_PORT/ipa/ipa.initramfs" >"$CAPI_DIR/kustomize/ironic.env"
  capi_render bmo "$BMO_SRC" "$BMO_UPSTREAM_IMAGE" "$LOCAL_IMAGES/baremetal-operator:$BMO_VERSION" config/namespace -- \
    "configMapGenerator: [{name: ironic, behavior: replace, envs: [../ironic.env]}]" \
    "generatorOptions: {disableNameSuffixHash: true}"
  capi_apply capi "$CAPI_DEPLOY" probe_capi
  capi_apply capm3 "$CAPM3_DEPLOY" probe_capm3
  capi_apply bmo "$BMO_DEPLOY" probe_bmo
  log "Cluster API $CAPI_VERSION, CAPM3 $CAPM3_VERSION and baremetal-operator $BMO_VERSION running in the e2e cluster, $(($(now) - t0)) s to pack and import their images, apply their releases' config/default and roll out their Deployments (webhooks behind their Services)"
}

# capi_logs: the managers' logs, kept before the cluster goes (the kubelet
# deletes a pod's logs with it).
capi_logs() {
  local m d
  [ -f "$KCFG" ] || return 0
  for m in "capi:$CAPI_DEPLOY" "capm3:$CAPM3_DEPLOY" "bmo:$BMO_DEPLOY"; do
    d=${m#*:}
    kc -n "${d%/*}" --request-timeout=10s logs "deployment/${d#*/}" >"$W/logs/${m%%:*}.log" 2>&1 || true
  done
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
  capi_logs
  kc -n "$MGMT_NS" --request-timeout=10s logs "$(chart_pod)" >"$W/logs/chart-server.log" 2>&1 || true
  for f in bmo capm3 chart-server ironic; do
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
  image_provisioning_host: $CLUSTER_NODE_IP:$CHART_NODEPORT
  image_provisioning_scheme: https
  image_delivery: $2
  # No cleaning between deployments (an IPA boot each under TCG): the
  # host's disk is rewritten whole by the next image.
  automatedCleaningMode: disabled
EOV
}

# labelled_configmap NAME LABEL FILE: the ConfigMap NAME of the workload
# namespace holding FILE as values.yaml, labelled LABEL (what the fleet
# controller reads), made or replaced.
labelled_configmap() {
  kc -n "$CAPI_NS" create configmap "$1" --from-file=values.yaml="$3" --dry-run=client -o yaml |
    kc label -f - --local -o yaml "$2=" | kc apply -f - >/dev/null
}

# workload_values IMAGE_KEY [DELIVERY]: the cluster's values, where Sylva
# keeps them (a ConfigMap the check controller and plan read), and as a
# file.
workload_values() {
  cluster_values "$1" "${2:-http}" >"$CAPI_DIR/cluster-values.yaml"
  labelled_configmap cluster-values osimages.sylva-project.org/cluster-values "$CAPI_DIR/cluster-values.yaml"
}

# workload_catalog NAME FILE: sylva-units values of the workload cluster
# (FILE) in a catalog-values ConfigMap NAME: the fleet controller resolves
# the namespace's os-images-info from all of them, merged in name order.
workload_catalog() { labelled_configmap "$1" osimages.sylva-project.org/catalog-values "$2"; }

# catalog_lists NS SHA: the os-images-info of NS lists SHA.
catalog_lists() { kc -n "$1" get configmap os-images-info -o jsonpath='{.data.values\.yaml}' | grep "$2" >/dev/null; }

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
  kc create namespace "$CAPI_NS" >/dev/null
  kc label namespace "$CAPI_NS" sylva-project.org/workload-cluster= >/dev/null
  # The host first: baremetal-operator registers and inspects it while
  # osimages is set up.
  enroll_bmh
  t0=$(now)

  # The management side is the chart's (chart_up): its catalog Job wrote
  # $MGMT_NS/os-images-info, its server serves the image and publishes it
  # in $MGMT_NS/capm3-os-image-server-os-images, its fleet controller
  # propagates that into the workload clusters' namespaces.
  served_in "$MGMT_NS/capm3-os-image-server-os-images" "$SHA" || fail "the chart's server does not publish $SHA in $MGMT_NS/capm3-os-image-server-os-images"

  # The workload cluster: its own catalog (its sylva-units values, which
  # the fleet controller resolves into its os-images-info), its values,
  # and its copy of the served set (the controller's propagation).
  workload_catalog catalog-values "$W/chart/catalog-values.yaml"
  wait_for "the fleet controller's catalog of $CAPI_NS listing $SHA ($(controller_says))" 180 catalog_lists "$CAPI_NS" "$SHA"
  workload_values m3box-test
  wait_for "the served set propagated to $CAPI_NS ($(controller_says))" 120 served_in "$CAPI_NS/kyverno-cloned-os-image-server-images" "$SHA"
  log "osimages (the chart's fleet controller): the workload cluster's catalog and its copy of the served set in place $(($(now) - t0)) s after the host was enrolled"

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
  wait_for "BareMetalHost $CAPI_NS/$NODE available (registered and inspected by baremetal-operator; see kubectl -n ${BMO_DEPLOY%/*} logs deployment/${BMO_DEPLOY#*/})" 900 bmh_state available
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
  in_ns "$W/bin/publish" -registry "$LINK_BOX_IP:$REGISTRY_PORT" -image "$W/image2/osimages-test.raw" -name m3box-test-v2 -registry-key m3box-v2 \
    -repo-base m3box-chart-v2/diskimage-builder \
    -catalog-values "$CAPI_DIR/catalog-values2.yaml" -server-values "$CAPI_DIR/mgmt-values2.yaml" >&2 ||
    fail "publishing the second test image failed"
}

# The guarantee, management side: a new image in the management catalog,
# selected and served, the old one kept, by a helm upgrade of the chart;
# osimages plan says the workload cluster is unchanged first, and no host
# is provisioned again.
capi_management_change() {
  local before after out
  before=$(host_facts)
  second_image
  # The proposed management catalog, resolved as the catalog Job will.
  osi catalog -f "$W/chart/catalog-values.yaml" -f "$CAPI_DIR/catalog-values2.yaml" >"$CAPI_DIR/mgmt-catalog2.yaml" 2>"$W/logs/catalog-mgmt2.log" ||
    fail "osimages catalog (the new management catalog) failed: $(cat "$W/logs/catalog-mgmt2.log")"
  mgmt_plan "$CAPI_DIR/plan-mgmt.txt" || fail "osimages plan says the management change would break a workload cluster: $(cat "$CAPI_DIR/plan-mgmt.txt")"
  echo "osimages plan (management change): $(grep -m1 "$CAPI_NS" "$CAPI_DIR/plan-mgmt.txt")"
  # The change as an operator makes it: the new image's registry and
  # catalog entry in the chart's values (the catalog Job's and the
  # server's), helm upgrade.
  {
    echo "catalogJob:"
    echo "  values:"
    sed 's/^/    /' "$CAPI_DIR/catalog-values2.yaml"
    echo "cluster:"
    sed 's/^/  /' "$CAPI_DIR/mgmt-values2.yaml"
  } >"$CAPI_DIR/values2.yaml"
  out=$(cluster_sh exec "$W/bin/chart" -chart "$ROOT/charts/osimages" -namespace "$CHART_NS" -upgrade \
    -f "$W/chart/values.yaml" -f "$CAPI_DIR/values2.yaml" 2>&1) || fail "upgrading the chart failed: $out"
  log "$out"
  wait_for "the chart's server serving the new image $SHA2 ($(kc -n "$MGMT_NS" logs "$(chart_pod)" --tail 3 2>&1))" 300 served_in "$MGMT_NS/capm3-os-image-server-os-images" "$SHA2"
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

# mgmt_plan FILE: osimages plan of the management values and catalog in place
# since the management change (the chart's server values with the second
# image's, the catalog with it) against the cluster, into FILE.
mgmt_plan() {
  osi plan --kubeconfig "$KCFG" -f "$W/chart/mgmt-values.yaml" -f "$CAPI_DIR/mgmt-values2.yaml" --os-images "$CAPI_DIR/mgmt-catalog2.yaml" >"$1" 2>&1
}

# controller_says: the last lines of the chart's fleet controller's log.
controller_says() { kc -n "$MGMT_NS" logs -l app.kubernetes.io/component=controller --tail 3 2>&1 | cut -c1-300; }

# The guarantee, workload side: the cluster's own image upgraded; plan
# says its nodes roll; render writes a new template, the Machine is
# replaced from it, and the host is provisioned once with the new image.
capi_image_upgrade() {
  local t0 start1 start2
  # The new image in the workload cluster's own catalog: a second
  # catalog-values ConfigMap, merged after the first.
  workload_catalog catalog-values-v2 "$CAPI_DIR/catalog-values2.yaml"
  wait_for "the fleet controller's catalog of $CAPI_NS listing $SHA2 ($(controller_says))" 180 catalog_lists "$CAPI_NS" "$SHA2"
  workload_values m3box-test-v2
  wait_for "the new image propagated to $CAPI_NS ($(controller_says))" 120 served_in "$CAPI_NS/kyverno-cloned-os-image-server-images" "$SHA2"
  mgmt_plan "$CAPI_DIR/plan-upgrade.txt" || fail "osimages plan failed: $(cat "$CAPI_DIR/plan-upgrade.txt")"
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
  wait_for "Machine $MACHINE deleted and $NODE deprovisioned (see the logs of $CAPM3_DEPLOY and $BMO_DEPLOY)" 600 machine_gone "$MACHINE"
  wait_for "BareMetalHost $CAPI_NS/$NODE available again" 600 bmh_state available
  log "Machine $MACHINE deleted, $NODE deprovisioned in $(($(now) - t0)) s"
}

# status_says TEXT: the line of the workload namespace's osimages-status
# (the fleet controller's check) that holds TEXT.
status_says() { kc -n "$CAPI_NS" get configmap osimages-status -o jsonpath='{.data.status\.yaml}' | grep -m1 -F "$1" | cut -c1-400; }

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
  mgmt_plan "$CAPI_DIR/plan-oci-refused.txt" || true
  grep -q "requires spec.template.spec.image.checksum" "$CAPI_DIR/plan-oci-refused.txt" ||
    fail "osimages plan does not say that CAPM3 $CAPM3_VERSION refuses $CAPI_NS's oci:// delivery: $(cat "$CAPI_DIR/plan-oci-refused.txt")"
  echo "osimages plan (oci:// with CAPM3 $CAPM3_VERSION): $(grep -m1 'requires spec.template.spec.image.checksum' "$CAPI_DIR/plan-oci-refused.txt")"

  # The fleet controller's check says it too, in the namespace's status.
  wait_for "the check of $CAPI_NS reporting CAPM3's refusal of oci:// ($(controller_says))" 120 status_says "requires spec.template.spec.image.checksum"
  echo "osimages controller (check of $CAPI_NS): $(status_says "requires spec.template.spec.image.checksum")"

  # CAPM3 upgraded in place, as an operator upgrades a provider: the new
  # release's objects applied over the old ones, its Deployment rolled.
  t0=$(now)
  capi_image cluster-api-provider-metal3 "$CAPM3_OCI_MANAGER" /manager "$CAPM3_VERSION-oci"
  capi_render capm3-oci "$CAPM3_OCI_SRC" "$CAPM3_UPSTREAM_IMAGE" "$LOCAL_IMAGES/cluster-api-provider-metal3:$CAPM3_VERSION-oci"
  capi_apply capm3-oci "$CAPM3_DEPLOY" probe_capm3
  log "CAPM3 upgraded in place to $CAPM3_VERSION with upstream's oci:// commit (PR #3522, in v1.14.0-rc.0) in $(($(now) - t0)) s"

  mgmt_plan "$CAPI_DIR/plan-oci.txt" || fail "osimages plan failed with CAPM3 accepting oci://: $(cat "$CAPI_DIR/plan-oci.txt")"
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
