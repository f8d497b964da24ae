#!/usr/bin/env bash
# Catalog benchmark: osimages catalog against Sylva's per-image oras+yq loop,
# side by side on a registry at 127.0.0.1, then osimages catalog with and
# without cosign signature verification of every artifact. Prints the ratios.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(hack/tools.sh env)"
go build -o bin/osimages ./cmd/osimages
go run ./bench/catalog -osimages "$PWD/bin/osimages" "$@"
