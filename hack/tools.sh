#!/usr/bin/env bash
# Builds the tools the tests and benchmarks need, once per version, into a
# cache outside the checkout, so that a fresh clone on the same machine reuses
# them and a new machine builds them (about 6 minutes cold on 2 cores). Each
# step says what it installs, and where, before it installs it (hack's
# TestToolsSayWhatTheyInstallFirst holds every step to it); what is there
# already is not mentioned.
#
#   hack/tools.sh          build what is missing
#   hack/tools.sh env      build what is missing, then print the environment
#                          (KUBEBUILDER_ASSETS, PATH) to eval
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${OSIMAGES_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/osimages/tools}

ORAS_VERSION=v1.3.6
YQ_VERSION=v4.54.3
# The cosign CLI cross-checks the cosign format of the signatures the tests
# make (internal/signature/cosign_test.go). About 9 CPU-minutes to build cold.
COSIGN_VERSION=v3.1.3

log() { echo "tools: $*" >&2; }

# kube-apiserver and etcd come from a module of their own (hack/tools/envtest):
# k8s.io/kubernetes needs replace directives, which go install refuses. The
# folder is keyed by the Kubernetes version and by the module's go.sum, so that
# any change of that module builds them again.
envtest_module=$root/hack/tools/envtest
k8s_version=$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$envtest_module/go.mod" | head -1 | cut -d' ' -f2)
sum=$(cat "$envtest_module/go.mod" "$envtest_module/go.sum" | sha256sum | cut -c1-12)
envtest_dir=$cache/envtest-$k8s_version-$sum

build_envtest() {
  [ -x "$envtest_dir/kube-apiserver" ] && [ -x "$envtest_dir/etcd" ] && return
  log "building kube-apiserver and etcd $k8s_version into $envtest_dir (about 5 minutes, once)"
  local tmp
  tmp=$(mktemp -d "$cache/.envtest.XXXXXX")
  (cd "$envtest_module" &&
    go build -trimpath -buildvcs=false -o "$tmp/etcd" ./etcd &&
    go build -trimpath -buildvcs=false -o "$tmp/kube-apiserver" ./kube-apiserver)
  rm -rf "$envtest_dir"
  mv "$tmp" "$envtest_dir"
}

# go_install DIR PKG@VERSION: a plain go install into a versioned folder.
go_install() {
  local dir=$1 pkg=$2 path bin
  path=${pkg%@*}
  bin=$(basename "$path")
  # A major-version suffix (yq/v4) is not the command's name.
  [[ $bin =~ ^v[0-9]+$ ]] && bin=$(basename "$(dirname "$path")")
  [ -x "$dir/$bin" ] && return
  log "installing $pkg into $dir"
  local tmp
  tmp=$(mktemp -d "$cache/.install.XXXXXX")
  GOBIN=$tmp GOFLAGS=-buildvcs=false go install "$pkg"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

# Every tool below is installed where this script can (root with apt-get);
# elsewhere the tests that need it skip, saying why (testenv.Missing), and
# fail instead where OSIMAGES_REQUIRE_ALL is set (CI sets it).

# The status page is tested in Debian's headless Chromium.
ensure_chromium() {
  command -v chromium >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's chromium for the status page test"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  else
    log "chromium is not installed and cannot be installed here (needs root and apt-get): the status page browser test will skip"
  fi
}

# The replica tests run in a network namespace of their own (root), whose
# loopback they set up with ip (internal/testenv/netns_linux.go); make e2e
# and the scale benchmark make theirs with it too.
ensure_iproute2() {
  command -v ip >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's iproute2 (ip) for the tests' own network namespaces"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >&2
  else
    log "ip (iproute2) is not installed and cannot be installed here (needs root and apt-get): the replica tests will skip"
  fi
}

# shared_dir sets shared to the fixtures beside the checkout (or
# OSIMAGES_SHARED_DIR); false when there are none.
shared_dir() {
  local d=$root
  shared=${OSIMAGES_SHARED_DIR:-}
  while [ -z "$shared" ] && [ "$d" != / ]; do
    [ -d "$d/shared/crds" ] && shared=$d/shared
    d=$(dirname "$d")
  done
  [ -n "$shared" ]
}

# Ironic's own image services (its code is in ../shared/ironic, a fixture)
# are the client of the HTTP and oci:// tests; the libraries they import come
# from Debian's python3-ironic, installed where this script can. Without the
# fixture, or without the package, those tests skip, saying why.
ensure_ironic_libraries() {
  shared_dir && ls "$shared"/ironic/ironic-*.tgz >/dev/null 2>&1 || return 0
  command -v dpkg >/dev/null 2>&1 && dpkg -s python3-ironic >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's python3-ironic (the libraries of Ironic's image services, which the tests run as a client)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-ironic >&2
  else
    log "python3-ironic is not installed and cannot be installed here (needs root and apt-get): the tests with Ironic's image services will skip"
  fi
}

# ironic-python-agent (stable/2025.1, in ../shared/metal3, a fixture) is the
# client of the IPA tests. What it imports comes from Debian 12's packages
# (python3-ironic's libraries, pint, pyudev; parted and hexdump check the
# written disk), except two that are too old there: oslo.utils 6.0 lacks the
# image format inspector (oslo_utils.imageutils.format_inspector, 7.3+), and
# the oslo.utils that has it needs netaddr 0.10+. Those two come from Debian
# 13 (trixie), pure Python, unpacked (not installed) into the cache, keyed by
# their versions; the tests put that folder first on PYTHONPATH for IPA's
# process alone. apt downloads them itself, through a temporary configuration
# whose one source is trixie on the mirror the host's own apt sources name
# (read here, at run time; no mirror is written in the repository).
IPA_TRIXIE_DEBS="python3-oslo.utils=8.2.0-4 python3-netaddr=1.3.0-1"
ipa_libs_dir=${IPA_TRIXIE_DEBS// /_}
ipa_libs_dir=$cache/ipa-libs-${ipa_libs_dir//=/-}

ensure_ipa_libraries() {
  shared_dir || return 0
  [ -f "$shared/metal3/ironic-python-agent-stable-2025.1.tgz" ] || return 0
  local debian="python3-ironic python3-pint python3-pyudev parted bsdextrautils"
  if ! dpkg -s $debian >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "installing Debian's $debian (what ironic-python-agent imports and runs, for the IPA tests)"
      apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $debian >&2
    else
      log "$debian are not all installed and cannot be installed here (needs root and apt-get): the IPA tests will skip"
      return 0
    fi
  fi
  [ -d "$ipa_libs_dir" ] && return
  local mirror
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  if [ -z "$mirror" ] || ! command -v apt-get >/dev/null 2>&1; then
    log "no Debian mirror in this host's apt sources: Debian 13's oslo.utils cannot be fetched, the IPA tests will skip"
    return 0
  fi
  log "downloading Debian 13's $IPA_TRIXIE_DEBS from $mirror with apt, unpacking them into $ipa_libs_dir (IPA's image format inspector)"
  local tmp
  tmp=$(mktemp -d "$cache/.ipa-libs.XXXXXX")
  mkdir -p "$tmp/apt/sources" "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/debs" "$tmp/root"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" >"$tmp/apt/sources/trixie.sources"
  local apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$tmp/apt/sources"
    -o "Dir::State::Lists=$tmp/apt/lists" -o "Dir::Cache=$tmp/apt/cache"
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root)
  if ! apt-get update -qq "${apt_opts[@]}" >&2 ||
    ! (cd "$tmp/debs" && apt-get download -qq "${apt_opts[@]}" $IPA_TRIXIE_DEBS >&2) ||
    ! ls "$tmp"/debs/*.deb >/dev/null 2>&1; then
    rm -rf "$tmp"
    log "could not download $IPA_TRIXIE_DEBS from trixie on $mirror (a newer point release? update IPA_TRIXIE_DEBS in hack/tools.sh): the IPA tests will skip"
    return 0
  fi
  local deb
  for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
  rm -rf "$ipa_libs_dir"
  mv "$tmp/root/usr/lib/python3/dist-packages" "$ipa_libs_dir"
  rm -rf "$tmp"
}

# The chart tests install Cluster API's core CRDs, read from the
# sigs.k8s.io/cluster-api module in the Go module cache (internal/testenv
# names the version); download it once so that the tests find it offline.
download_capi() {
  local version
  version=$(grep -o 'ClusterAPIVersion = "v[0-9.]*"' "$root/internal/testenv/capi.go" | cut -d'"' -f2)
  [ -f "$(go env GOMODCACHE)/cache/download/sigs.k8s.io/cluster-api/@v/$version.zip" ] && return
  log "downloading sigs.k8s.io/cluster-api@$version into the Go module cache (its CRDs, for the chart tests)"
  (cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download "sigs.k8s.io/cluster-api@$version") ||
    { log "could not download sigs.k8s.io/cluster-api@$version: the chart tests will fail"; return 1; }
}

# The tests of oci:// delivery install the CRDs of the last CAPM3 release that
# refuses it (internal/testenv names the version), read from the module
# github.com/metal3-io/cluster-api-provider-metal3 in the Go module cache; the
# module hack/tools/capm3webhook builds its webhook's validation from the same
# release.
download_capm3() {
  local version
  version=$(grep -o 'CAPM3RefusingOCI = "v[0-9.]*"' "$root/internal/testenv/capi.go" | cut -d'"' -f2)
  local modcache
  modcache="$(go env GOMODCACHE)/cache/download/github.com/metal3-io/cluster-api-provider-metal3"
  [ -f "$modcache/@v/$version.zip" ] && [ -f "$modcache/api/@v/$version.zip" ] && return
  log "downloading github.com/metal3-io/cluster-api-provider-metal3@$version into the Go module cache (its CRDs, for the oci:// delivery tests), and the modules of hack/tools/capm3webhook (its webhook validation)"
  (cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download "github.com/metal3-io/cluster-api-provider-metal3@$version") ||
    { log "could not download github.com/metal3-io/cluster-api-provider-metal3@$version: the oci:// delivery tests will fail"; return 1; }
  (cd "$root/hack/tools/capm3webhook" && go mod download) ||
    { log "could not download the modules of hack/tools/capm3webhook: its test, in make test, will fail"; return 1; }
}

# The container image ships the build machine's CA bundle (make image and its
# test read it).
ensure_ca_certificates() {
  [ -f /etc/ssl/certs/ca-certificates.crt ] && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's ca-certificates for the container image"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates >&2
  else
    log "/etc/ssl/certs/ca-certificates.crt is missing: make image needs a CA bundle (--ca-certs)"
  fi
}

mkdir -p "$cache"
ensure_ca_certificates
ensure_chromium
ensure_iproute2
ensure_ironic_libraries
ensure_ipa_libraries
download_capi
download_capm3
build_envtest
go_install "$cache/oras-$ORAS_VERSION" "oras.land/oras/cmd/oras@$ORAS_VERSION"
go_install "$cache/yq-$YQ_VERSION" "github.com/mikefarah/yq/v4@$YQ_VERSION"
go_install "$cache/cosign-$COSIGN_VERSION" "github.com/sigstore/cosign/v3/cmd/cosign@$COSIGN_VERSION"

if [ "${1:-}" = env ]; then
  # The Go yq goes first on PATH: a Python yq may be installed and differs.
  echo "export KUBEBUILDER_ASSETS='$envtest_dir'"
  echo "export PATH='$cache/yq-$YQ_VERSION:$cache/oras-$ORAS_VERSION':\"\$PATH\""
  echo "export OSIMAGES_COSIGN='$cache/cosign-$COSIGN_VERSION/cosign'"
  if [ -d "$ipa_libs_dir" ]; then echo "export OSIMAGES_IPA_PYTHONPATH='$ipa_libs_dir'"; fi
fi
