#!/usr/bin/env bash
# Idle memory of the production image server: the binary built as
# `make image` builds it, `osimages serve` with file inputs (no cluster)
# holding one 1 MiB image downloaded from a local HTTP server (python3),
# VmRSS read from /proc after 6 s, for 3 runs. Most of that RSS is the
# binary's own pages, so each run starts with the binary out of the page
# cache, as a new pod does: a binary just written is all cached, and the
# kernel then maps more of it at each fault (2 to 5 MiB more). Also prints the sum of the
# package inits (GODEBUG=inittrace=1) of `osimages --help`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=bin/idle-rss/osimages
CGO_ENABLED=0 go build -tags nodemo -trimpath -ldflags "-s -w" -o "$bin" ./cmd/osimages
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
head -c 1048576 /dev/urandom >"$work/img.raw"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
hport=$(port)
(cd "$work" && exec python3 -m http.server "$hport" --bind 127.0.0.1 >/dev/null 2>&1) &
cat >"$work/os-images.yaml" <<YAML
os_images:
  ubuntu-plain:
    uri: http://127.0.0.1:$hport/img.raw
    sha256: $(sha256sum "$work/img.raw" | cut -d' ' -f1)
    image-format: raw
    filename: img.raw
    os: ubuntu
    hardened: "false"
    k8s-flavor: rke2
    k8s-version: 1.32.5+rke2r1
YAML
cat >"$work/mgmt.yaml" <<'YAML'
name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: "false"}
YAML
for run in 1 2 3; do
  rm -rf "$work/data" && mkdir "$work/data"
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$bin"
  "$bin" serve --data "$work/data" --os-images "$work/os-images.yaml" -f "$work/mgmt.yaml" \
    --output-file "$work/served.yaml" --listen "127.0.0.1:$(port)" --peer-listen "127.0.0.1:$(port)" \
    --keep-referenced=false 2>"$work/serve.log" &
  pid=$!
  sleep 6
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  grep -q 'available: true' "$work/served.yaml" || { cat "$work/serve.log"; echo "the image was not served" >&2; exit 1; }
  kill "$pid" && wait "$pid" || true
  awk -v run="$run" -v kb="$rss" 'BEGIN {printf "run %d: idle RSS %.1f MiB (%d kB)\n", run, kb / 1024, kb}'
done
GODEBUG=inittrace=1 "$bin" --help 2>&1 >/dev/null |
  awk '/^init / {ms += $5; bytes += $8; allocs += $10; n++} END {printf "package init of --help: %d inits, %.1f ms, %d allocs, %.1f MiB\n", n, ms, allocs, bytes / 1048576}'
