#!/usr/bin/env bash
# The project's test command: builds the test tools (cached), checks format and
# vet, then runs every test against real components (envtest's kube-apiserver
# and etcd, an OCI registry on 127.0.0.1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

eval "$(hack/tools.sh env)"

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './hack/tools/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
go test -count=1 "$@" ./...
