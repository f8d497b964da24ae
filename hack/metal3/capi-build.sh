#!/usr/bin/env bash
# The Cluster API chain of Metal3 in a box, built once from the tagged Go
# module sources the Go module proxy serves, and kept in the tools cache
# under names keyed by version and by the build's recipe (as hack/tools.sh
# keeps its tools):
#
#   capi-core-VERSION-KEY/manager  sigs.k8s.io/cluster-api's controller
#                                  manager (Cluster, Machine...)
#   capm3-VERSION-KEY/manager      Cluster API Provider Metal3's manager
#   bmo-VERSION-KEY/manager        baremetal-operator's manager
#   m3manifests-KEY/m3manifests    hack/tools/m3manifests: renders each
#                                  provider's config/default (kustomize, as
#                                  upstream makes its release manifests,
#                                  clusterctl's variables, cert-manager's
#                                  part) into the objects to apply
#
# Each manager is static (CGO_ENABLED=0, as upstream's Dockerfiles build
# them): hack/metal3/capi.sh packs it into a container image and runs it in
# the e2e cluster with its release's own Deployment.
#
# The versions are the ones CAPM3 v1.13.2 is built against (its go.mod):
# Cluster API v1.13.4 and baremetal-operator's apis v0.13.2, so BMO v0.13.2.
# CAPM3 v1.14.x, the first release that accepts an oci:// image without a
# checksum, is not on the Go module proxy (403 for v1.14.0-rc.0, rc.1,
# v1.14.0, v1.14.1, v1.14.2, and for the baremetal-operator and
# ip-address-manager api modules v1.14.0-rc.0 requires). What makes
# v1.14.0-rc.0 accept it is one upstream commit (PR #3522): applied to
# v1.13.2 as patches/capm3-v1.13.2-oci-without-checksum.patch, it gives a
# second CAPM3, capm3-v1.13.2-oci-KEY/ (its manager and its patched
# config/), with which the chain runs the oci:// delivery
# (docs/development.md).
#
# Prints the folders as shell assignments (CAPI_MANAGER=... and the module
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
  (cd "$tmp/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath -o "$tmp/manager" .) ||
    { rm -rf "$tmp"; fail "building $mod failed"; }
  mkdir -p "$tmp/out"
  mv "$tmp/manager" "$tmp/out/manager"
  [ ${#patches[@]} -eq 0 ] || cp -r "$tmp/src/config" "$tmp/out/config"
  echo "$mod $*" >"$tmp/out/SOURCE"
  rm -rf "$tmp/src" "$out"
  mv "$tmp/out" "$out"
  rm -rf "$tmp"
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

m3manifests_dir() { echo "$CACHE/m3manifests-$(key "$ROOT"/hack/tools/m3manifests/{go.mod,go.sum,main.go})"; }
build_m3manifests() {
  local d
  d=$(m3manifests_dir)
  [ -x "$d/m3manifests" ] || log "building hack/tools/m3manifests (kustomize as a library) into $d"
  cached_build "$d" m3manifests "$ROOT/hack/tools/m3manifests" .
}

# RECIPE keys the managers' folders by how they are built: a folder built
# another way (a dynamically linked manager of an older recipe) is not
# taken for this one.
RECIPE=$(key <(declare -f build_manager))
CORE_OUT=$CACHE/capi-core-$CAPI_VERSION-$RECIPE
CAPM3_OUT=$CACHE/capm3-$CAPM3_VERSION-$RECIPE
BMO_OUT=$CACHE/bmo-$BMO_VERSION-$RECIPE
build_manager "$CORE_OUT" "sigs.k8s.io/cluster-api@$CAPI_VERSION"
build_manager "$CAPM3_OUT" "github.com/metal3-io/cluster-api-provider-metal3@$CAPM3_VERSION" \
  "api=github.com/metal3-io/cluster-api-provider-metal3/api@$CAPM3_VERSION"
build_manager "$BMO_OUT" "github.com/metal3-io/baremetal-operator@$BMO_VERSION" \
  "apis=github.com/metal3-io/baremetal-operator/apis@$BMO_APIS_VERSION" \
  "pkg/hardwareutils=github.com/metal3-io/baremetal-operator/pkg/hardwareutils@$BMO_HWUTILS_VERSION" \
  "github.com/metal3-io/ironic-standalone-operator/api=>$BMO_IRSO_API_VERSION"
CAPM3_OCI_PATCH=$M3_DIR/patches/capm3-$CAPM3_VERSION-oci-without-checksum.patch
CAPM3_OCI_DIR=$CACHE/capm3-$CAPM3_VERSION-oci-$(key "$CAPM3_OCI_PATCH" <(echo "$RECIPE"))
build_manager "$CAPM3_OCI_DIR" "github.com/metal3-io/cluster-api-provider-metal3@$CAPM3_VERSION" \
  "api=github.com/metal3-io/cluster-api-provider-metal3/api@$CAPM3_VERSION" "patch:$CAPM3_OCI_PATCH"
build_m3manifests

echo "CAPI_MANAGER=$CORE_OUT/manager CAPM3_MANAGER=$CAPM3_OUT/manager BMO_MANAGER=$BMO_OUT/manager" \
  "M3MANIFESTS=$(m3manifests_dir)/m3manifests" \
  "CAPI_SRC=$(moddir "sigs.k8s.io/cluster-api@$CAPI_VERSION") CAPM3_SRC=$(moddir "github.com/metal3-io/cluster-api-provider-metal3@$CAPM3_VERSION") BMO_SRC=$(moddir "github.com/metal3-io/baremetal-operator@$BMO_VERSION")" \
  "CAPM3_OCI_MANAGER=$CAPM3_OCI_DIR/manager CAPM3_OCI_SRC=$CAPM3_OCI_DIR" \
  "CAPI_VERSION=$CAPI_VERSION CAPM3_VERSION=$CAPM3_VERSION BMO_VERSION=$BMO_VERSION"
