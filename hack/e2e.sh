#!/usr/bin/env bash
# make e2e: the chart and the image that `make image` builds, run on a real
# one-node Kubernetes cluster (hack/e2e-cluster.sh) the way an operator runs
# them, scenario by scenario (test/e2e). It
#   1. refuses to start where the cluster cannot run (not root, no network
#      namespaces), saying why;
#   2. installs Debian's containerd, runc, containernetworking-plugins,
#      iptables and conntrack where missing (and python3-ironic, for Ironic's
#      own download code, when ../shared/ironic is there), saying so first;
#   3. builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#      the kubelet, kube-proxy and kubectl at the envtest version from the Go
#      module proxy (hack/tools/cluster), once, into the tools cache;
#   4. builds the image (make image), the cluster's own pause, registry and
#      client images, and the test binary;
#   5. starts the cluster, runs the scenarios inside its network namespace,
#      stops the cluster and checks that nothing of it is left.
#
#   hack/e2e.sh [-run REGEXP] [-keep]     -keep: leave the cluster up afterwards
#   hack/e2e.sh -build-only               steps 1-4 but the test binary, then
#                                         print E2E_BIN=... E2E_IMAGES=... for
#                                         hack/e2e-cluster.sh up (Metal3 in a
#                                         box starts the cluster itself)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

log() { echo "e2e: $*" >&2; }
fail() {
  log "$*"
  exit 1
}
now() { date +%s; }

run_regexp=
keep=
build_only=
while [ $# -gt 0 ]; do
  case "$1" in
  -run)
    run_regexp=$2
    shift 2
    ;;
  -keep)
    keep=1
    shift
    ;;
  -build-only)
    build_only=1
    shift
    ;;
  *) fail "unknown argument $1 (want -run REGEXP, -keep, -build-only)" ;;
  esac
done

export PATH=$PATH:/usr/sbin:/sbin
T_START=$(now)

# 1. Where it cannot run, it fails, saying why: it never skips.
[ "$(id -u)" = 0 ] || fail "needs root: the cluster runs in a network namespace of its own, with mounts and iptables rules (run as root: sudo make e2e)"
command -v ip >/dev/null || fail "ip (iproute2) is missing: it makes the cluster's network namespace"
probe=osimages-e2e-probe-$$
if ! out=$(ip netns add "$probe" 2>&1); then
  fail "this machine refuses network namespaces (ip netns add: $out): the cluster cannot run here"
fi
ip netns del "$probe"

# 2. Debian packages, where missing.
missing=()
for p in containerd runc containernetworking-plugins iptables conntrack; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
shared=${OSIMAGES_SHARED_DIR:-$(cd .. && pwd)/shared}
ironic_tgz=$(ls "$shared"/ironic/ironic-*.tgz 2>/dev/null | head -1 || true)
if [ -n "$ironic_tgz" ] && ! dpkg -s python3-ironic >/dev/null 2>&1; then
  missing+=(python3-ironic)
fi
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || fail "missing: ${missing[*]}, and no apt-get to install them with"
  log "installing Debian's ${missing[*]} (the container runtime, CNI plugins and iptables of the cluster$([ -n "$ironic_tgz" ] && echo "; python3-ironic: the libraries of Ironic's image service"))"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

# 3. The cluster's binaries, once per version and module content.
cache=${OSIMAGES_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/osimages/tools}
module=$root/hack/tools/cluster
k8s_version=$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$module/go.mod" | head -1 | cut -d' ' -f2)
sum=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)
bindir=$cache/cluster-$k8s_version-$sum
components="etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
T_BUILD=$(now)
built=1
for c in $components; do [ -x "$bindir/$c" ] || built=; done
if [ -z "$built" ]; then
  log "building $components at $k8s_version into $bindir (about 3 minutes each on a fresh machine, once)"
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.cluster.XXXXXX")
  # The version the sources are: without it the binaries say v0.0.0-master,
  # and Helm would refuse the chart's kubeVersion.
  ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=$(echo "$k8s_version" | cut -d. -f1 | tr -d v) -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
  for c in $components; do
    (cd "$module" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/$c" "./$c")
  done
  rm -rf "$bindir"
  mv "$tmp" "$bindir"
fi

# 4. Images and the test binary.
out=$root/bin/e2e
mkdir -p "$out/images"
make -s image >&2
arch=$(go env GOARCH)
cp bin/image/osimages-"$arch".tar "$out/images/osimages.tar"
for img in pause registry client; do
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/$img" "./test/e2e/images/$img"
  go run ./hack/image --binary "$out/$img" --arch "$arch" --tarball "$out/images/$img.tar" --tag "local/$img:e2e" 2>/dev/null
done
if [ -n "$build_only" ]; then
  log "built in $(($(now) - T_BUILD)) s (cluster binaries, image, test images)"
  echo "E2E_BIN=$bindir E2E_IMAGES=$out/images"
  exit 0
fi
go vet -tags e2e ./test/e2e/
go test -c -tags e2e -o "$out/e2e.test" ./test/e2e
log "built in $(($(now) - T_BUILD)) s (cluster binaries, image, test images, test binary)"

# 5. The cluster, the scenarios, the check that nothing is left.
export E2E_BIN=$bindir E2E_IMAGES=$out/images
E2E_DIR=${E2E_DIR:-/var/tmp/osimages-e2e}
export E2E_DIR
status=0
finish() {
  local rc=$?
  [ "$status" = 0 ] && status=$rc
  if [ -n "$keep" ]; then
    log "the cluster stays up (-keep): hack/e2e-cluster.sh kubectl get pods -A; stop it with hack/e2e-cluster.sh down"
  else
    hack/e2e-cluster.sh down || status=1
    hack/e2e-cluster.sh check-clean || status=1
  fi
  log "total $(($(now) - T_START)) s; logs: $E2E_DIR/logs (components, test output), $E2E_DIR/pod-logs (pods)"
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT TERM
T_UP=$(now)
hack/e2e-cluster.sh up
log "cluster up in $(($(now) - T_UP)) s"

T_TEST=$(now)
args=(-test.v -test.timeout 40m -test.count 1)
[ -n "$run_regexp" ] && args+=(-test.run "$run_regexp")
set +e
(
  cd test/e2e
  OSIMAGES_E2E=1 OSIMAGES_E2E_ROOT=$root OSIMAGES_SHARED_DIR=$shared \
    "$root/hack/e2e-cluster.sh" exec "$out/e2e.test" "${args[@]}"
) 2>&1 | tee "$E2E_DIR/logs/e2e-test.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || status=1
log "scenarios ran in $(($(now) - T_TEST)) s"
