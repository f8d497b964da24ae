#!/usr/bin/env bash
# Propagation benchmark: `osimages propagate` against Kyverno 1.19.1 running
# Sylva's clone policy, each on a fresh envtest apiserver with the same
# source and N labelled namespaces. Prints the seconds from a source update
# until every copy carries it, the controllers' peak RSS, and the ratios.
#
#   hack/bench-propagation.sh [-namespaces 500] [-updates 3] [-timeout 10m]
#   OSIMAGES_BENCH_KYVERNO=0 hack/bench-propagation.sh   # osimages only
#   OSIMAGES_BENCH_KYVERNO=0 hack/bench-propagation.sh -namespaces 2000 -served 1000 -catalog-images 20
#       # at scale: each namespace with its catalog; prints etcd's and the
#       # apiserver's RSS too. -osimages other/osimages -osimages-copies whole
#       # measures a binary that copies the whole set. -floor also measures
#       # the same copies written by the bench alone (what any copier costs
#       # etcd and the apiserver) and exits 1 when osimages costs more than
#       # 1.10x that; -apiserver-profiles DIR keeps the apiserver's heap
#       # profile at each phase.
#
# Kyverno is built once (about 2-5 minutes and 2.8 GB of RAM) from the tools
# module hack/tools/kyverno into the tools cache, like hack/tools.sh does for
# kube-apiserver and etcd.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
cache=${OSIMAGES_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/osimages/tools}

log() { echo "bench-propagation: $*" >&2; }

eval "$(hack/tools.sh env)"

kyverno_module=$root/hack/tools/kyverno
kyverno_version=$(grep -o 'github.com/kyverno/kyverno v[0-9.]*' "$kyverno_module/go.mod" | head -1 | cut -d' ' -f2)
kyverno_dir=$cache/kyverno-$kyverno_version

build_kyverno() {
  [ -x "$kyverno_dir/kyverno" ] && [ -x "$kyverno_dir/background-controller" ] && return
  log "building Kyverno $kyverno_version into $kyverno_dir (2-5 minutes, once)"
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d "$cache/.kyverno.XXXXXX")
  (cd "$kyverno_module" &&
    go build -trimpath -buildvcs=false -o "$tmp/kyverno" github.com/kyverno/kyverno/cmd/kyverno &&
    go build -trimpath -buildvcs=false -o "$tmp/background-controller" github.com/kyverno/kyverno/cmd/background-controller)
  rm -rf "$kyverno_dir"
  mv "$tmp" "$kyverno_dir"
}

args=()
if [ "${OSIMAGES_BENCH_KYVERNO:-1}" != 0 ]; then
  build_kyverno
  # Kyverno's CRDs ship in its module, which the build has downloaded.
  crds=$(cd "$kyverno_module" && go list -m -f '{{.Dir}}' github.com/kyverno/kyverno)/config/crds
  args=(-kyverno-bin "$kyverno_dir" -kyverno-crds "$crds")
fi

go build -o bin/osimages ./cmd/osimages
go run ./bench/propagation -osimages "$root/bin/osimages" "${args[@]}" "$@"
