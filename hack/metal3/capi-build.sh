#!/usr/bin/env bash
# The Cluster API chain of Metal3 in a box, built once from the tagged Go
# module sources the Go module proxy serves, and kept in the tools cache
# under names keyed by version (as hack/tools.sh keeps its tools):
#
#   capi-core-VERSION/manager     sigs.k8s.io/cluster-api's controller
#                                 manager (Cluster, Machine...)
#   capm3-VERSION/manager         Cluster API Provider Metal3's manager
#   bmo-VERSION/manager           baremetal-operator's manager
#   kubectl-K8S-KEY/kubectl       from hack/tools/cluster, the module the
#                                 e2e cluster is built from
#   capi-apiserver-K8S-KEY/       the tests' kube-apiserver (hack/tools/envtest)
#                                 linked with its version, which CAPI checks
#   m3manifests-KEY/m3manifests   hack/tools/m3manifests: renders each
#                                 provider's config/default (kustomize, as
#                                 upstream makes its release manifests) into
#                                 its CRDs and webhook configurations
#
# The versions are the ones CAPM3 v1.13.2 is built against (its go.mod):
# Cluster API v1.13.4 and baremetal-operator's apis v0.13.2, so BMO v0.13.2.
# CAPM3 v1.14.x, the first release that accepts an oci:// image without a
# checksum, is not on the Go module proxy (403 for v1.14.0-rc.0, rc.1,
# v1.14.0, v1.14.1, and for the baremetal-operator and ip-address-manager
# api modules v1.14.0-rc.0 requires). What makes v1.14.0-rc.0 accept it is
# one upstream commit (PR #3522): applied to v1.13.2 as
# patches/capm3-v1.13.2-oci-without-checksum.patch, it gives a second
# CAPM3, capm3-v1.13.2-oci-KEY/ (its manager and its patched config/), with
# which the chain runs the oci:// delivery (docs/development.md).
#
# Prints the folders as shell assignments (CAPI_BIN=... and the module
# folders holding config/default).
#
#   hack/metal3/capi-build.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CAPI_VERSION=v1.13.4
CAPM3_VERSION=v1.13.2
BMO_VERSION=v0.13.2
# BMO's go.mod replaces its two nested modules by their folders, which the
# module zip leaves out (a nested module is a module of its own): they come
# from their own tags. pkg/hardwareutils v0.13.2 is refused by the proxy
# (403); its source is the same as v0.13.1's (git diff v0.13.1 v0.13.2 --
# pkg/hardwareutils is empty upstream), so v0.13.1 stands in for it.
BMO_APIS_VERSION=v0.13.2
BMO_HWUTILS_VERSION=v0.13.1
# BMO v0.13.2 requires github.com/metal3-io/ironic-standalone-operator/api
# v0.8.2, which the proxy refuses (403, as v0.8.1); v0.8.0 stands in:
# v0.8.2 adds two constants to it (LabelEnvironmentName/Value, git diff
# api/v0.8.0 api/v0.8.2 upstream) and BMO uses neither (only the Ironic
# type, IronicStatusReady and AddToScheme, for its Ironic-CR mode, which
# the box does not use).
BMO_IRSO_API_VERSION=v0.8.0

mkdir -p "$CACHE"

# moddir MODULE@VERSION: the module's folder in the module cache, downloaded
# from the proxy when missing (outside any module: nothing's go.mod changes).
moddir() {
  local out dir
  out=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json "$1" 2>&1) || true
  dir=$(printf '%s' "$out" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] && [ -d "$dir" ] || fail "go mod download $1 failed (the Go module proxy must serve it): $(printf '%s' "$out" | sed -n 's/^\t"Error": "\(.*\)",*$/\1/p')"
  echo "$dir"
}

# build_manager OUT MODULE@VERSION [NESTED=MODULE@VERSION | MODULE=>VERSION |
# patch:FILE ...]: go build of the module's main package (its root), in a
# copy of the module where each NESTED folder holds the named module, as
# the tag's own tree does, each MODULE required is replaced by its VERSION,
# and each FILE is applied (patch -p1). A patched build keeps its config/
# beside the manager: its CRDs and webhooks are the patched ones.
build_manager() {
  local out=$1 mod=$2 src tmp nested plog
  shift 2
  [ -x "$out/manager" ] && return 0
  log "building $mod's manager from the Go module proxy's source into $out (several minutes on 2 cores, once)"
  src=$(moddir "$mod")
  tmp=$(mktemp -d "$CACHE/.manager.XXXXXX")
  cp -r "$src" "$tmp/src"
  chmod -R u+w "$tmp/src"
  local patches=()
  for nested in "$@"; do
    if [[ $nested == patch:* ]]; then
      patches+=("${nested#patch:}")
      continue
    fi
    if [[ $nested == *"=>"* ]]; then
      (cd "$tmp/src" && go mod edit -replace "${nested%%=>*}=${nested%%=>*}@${nested#*=>}")
      continue
    fi
    rm -rf "${tmp:?}/src/${nested%%=*}"
    cp -r "$(moddir "${nested#*=}")" "$tmp/src/${nested%%=*}"
    chmod -R u+w "$tmp/src/${nested%%=*}"
  done
  for nested in ${patches[@]+"${patches[@]}"}; do
    if ! plog=$(cd "$tmp/src" && patch -p1 --forward --quiet <"$nested" 2>&1); then
      rm -rf "$tmp"
      fail "applying $nested to $mod failed (does it still apply to that version?): $plog"
    fi
  done
  # -mod=mod: go.sum of the release may lack lines for the nested folders'
  # own requirements; the proxy's checksum database still checks them.
  (cd "$tmp/src" && GOFLAGS=-mod=mod nice -n 10 go build -trimpath -o "$tmp/manager" .) ||
    { rm -rf "$tmp"; fail "building $mod failed"; }
  mkdir -p "$tmp/out"
  mv "$tmp/manager" "$tmp/out/manager"
  [ ${#patches[@]} -eq 0 ] || cp -r "$tmp/src/config" "$tmp/out/config"
  echo "$mod $*" >"$tmp/out/SOURCE"
  rm -rf "$tmp/src" "$out"
  mv "$tmp/out" "$out"
  rm -rf "$tmp"
}

# build_kubectl: kubectl of hack/tools/cluster (the e2e cluster's module),
# the copy hack/e2e.sh built when there is one.
kubectl_dir() {
  local module=$ROOT/hack/tools/cluster k8s sum
  k8s=$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$module/go.mod" | head -1 | cut -d' ' -f2)
  sum=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)
  if [ -x "$CACHE/cluster-$k8s-$sum/kubectl" ]; then
    echo "$CACHE/cluster-$k8s-$sum"
  else
    echo "$CACHE/kubectl-$k8s-$sum"
  fi
}

# cached_build DIR BIN MODULE PACKAGE [GO BUILD FLAGS...]: DIR/BIN, the go
# build of PACKAGE in the module folder MODULE (of this checkout), unless
# DIR holds it already; built aside and moved in whole, so that a killed
# build leaves no DIR.
cached_build() {
  local d=$1 bin=$2 module=$3 pkg=$4 tmp
  shift 4
  [ -x "$d/$bin" ] && return 0
  tmp=$(mktemp -d "$CACHE/.$bin.XXXXXX")
  (cd "$module" && nice -n 10 go build -trimpath -buildvcs=false "$@" -o "$tmp/$bin" "$pkg") ||
    { rm -rf "$tmp"; fail "building $bin from $module failed"; }
  rm -rf "$d"
  mv "$tmp" "$d"
}

build_kubectl() {
  local d
  d=$(kubectl_dir)
  [ -x "$d/kubectl" ] || log "building kubectl from hack/tools/cluster into $d (a few minutes, once)"
  cached_build "$d" kubectl "$ROOT/hack/tools/cluster" ./kubectl
}

# build_apiserver: kube-apiserver of hack/tools/envtest (the tests' one),
# linked with its version: Cluster API's manager refuses an apiserver that
# says v0.0.0-master ("minimum required version is v1.20.0"), which the
# tests' build does. Only the link differs, so the build cache serves the
# rest.
apiserver_dir() {
  local module=$ROOT/hack/tools/envtest
  echo "$CACHE/capi-apiserver-$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$module/go.mod" | head -1 | cut -d' ' -f2)-$(key "$module/go.mod" "$module/go.sum")"
}
build_apiserver() {
  local d k8s ldflags
  d=$(apiserver_dir)
  [ -x "$d/kube-apiserver" ] && return 0
  k8s=$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$ROOT/hack/tools/envtest/go.mod" | head -1 | cut -d' ' -f2)
  log "building kube-apiserver $k8s with its version into $d (the tests' build, linked again)"
  ldflags="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=$(echo "$k8s" | cut -d. -f1 | tr -d v) -X k8s.io/component-base/version.gitMinor=$(echo "$k8s" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
  cached_build "$d" kube-apiserver "$ROOT/hack/tools/envtest" ./kube-apiserver -ldflags "$ldflags"
}

m3manifests_dir() { echo "$CACHE/m3manifests-$(key "$ROOT"/hack/tools/m3manifests/{go.mod,go.sum,main.go})"; }
build_m3manifests() {
  local d
  d=$(m3manifests_dir)
  [ -x "$d/m3manifests" ] || log "building hack/tools/m3manifests (kustomize as a library) into $d"
  cached_build "$d" m3manifests "$ROOT/hack/tools/m3manifests" .
}

build_manager "$CACHE/capi-core-$CAPI_VERSION" "sigs.k8s.io/cluster-api@$CAPI_VERSION"
build_manager "$CACHE/capm3-$CAPM3_VERSION" "github.com/metal3-io/cluster-api-provider-metal3@$CAPM3_VERSION" \
  "api=github.com/metal3-io/cluster-api-provider-metal3/api@$CAPM3_VERSION"
build_manager "$CACHE/bmo-$BMO_VERSION" "github.com/metal3-io/baremetal-operator@$BMO_VERSION" \
  "apis=github.com/metal3-io/baremetal-operator/apis@$BMO_APIS_VERSION" \
  "pkg/hardwareutils=github.com/metal3-io/baremetal-operator/pkg/hardwareutils@$BMO_HWUTILS_VERSION" \
  "github.com/metal3-io/ironic-standalone-operator/api=>$BMO_IRSO_API_VERSION"
CAPM3_OCI_PATCH=$M3_DIR/patches/capm3-$CAPM3_VERSION-oci-without-checksum.patch
CAPM3_OCI_DIR=$CACHE/capm3-$CAPM3_VERSION-oci-$(key "$CAPM3_OCI_PATCH")
build_manager "$CAPM3_OCI_DIR" "github.com/metal3-io/cluster-api-provider-metal3@$CAPM3_VERSION" \
  "api=github.com/metal3-io/cluster-api-provider-metal3/api@$CAPM3_VERSION" "patch:$CAPM3_OCI_PATCH"
build_kubectl
build_m3manifests
build_apiserver

echo "CAPI_MANAGER=$CACHE/capi-core-$CAPI_VERSION/manager CAPM3_MANAGER=$CACHE/capm3-$CAPM3_VERSION/manager BMO_MANAGER=$CACHE/bmo-$BMO_VERSION/manager" \
  "KUBECTL=$(kubectl_dir)/kubectl M3MANIFESTS=$(m3manifests_dir)/m3manifests KUBE_APISERVER=$(apiserver_dir)/kube-apiserver" \
  "CAPI_SRC=$(moddir "sigs.k8s.io/cluster-api@$CAPI_VERSION") CAPM3_SRC=$(moddir "github.com/metal3-io/cluster-api-provider-metal3@$CAPM3_VERSION") BMO_SRC=$(moddir "github.com/metal3-io/baremetal-operator@$BMO_VERSION")" \
  "CAPM3_OCI_MANAGER=$CAPM3_OCI_DIR/manager CAPM3_OCI_SRC=$CAPM3_OCI_DIR" \
  "CAPI_VERSION=$CAPI_VERSION CAPM3_VERSION=$CAPM3_VERSION BMO_VERSION=$BMO_VERSION"
