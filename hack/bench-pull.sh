#!/usr/bin/env bash
# Pull benchmark: osimages' pull, verify and commit of a 1 GiB gzipped
# artifact against Sylva's oras pull + gunzip + sha256sum and against the
# curl | gunzip | sha256sum pipeline, side by side on a registry at
# 127.0.0.1. Prints the ratios. Needs about 3 GiB free under $TMPDIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(hack/tools.sh env)"
go build -o bin/bench-pull ./bench/pull
exec bin/bench-pull "$@"
