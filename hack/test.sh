#!/usr/bin/env bash
# The project's test command: builds the test tools (cached), checks format and
# vet, then runs every test against real components (envtest's kube-apiserver
# and etcd, an OCI registry on 127.0.0.1), and lists at the end the tests
# that skipped, with their reasons.
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
# CAPM3 v1.13.2's own webhook validation on the templates render writes: a
# module of its own, so that CAPM3 stays out of osimages' go.mod. Then the
# same test on the api module with upstream's oci:// commit (the Image
# validation of v1.14.0-rc.0, which the Go module proxy does not serve).
(cd hack/tools/capm3webhook && go test -count=1 ./...)
hack/tools/capm3webhook/oci-commit.sh
# The stand-in for clusterctl and cert-manager with which Metal3 in a box
# deploys the Cluster API providers (a module of its own: kustomize).
(cd hack/tools/m3manifests && go vet ./... && go test -count=1 ./...)
# go test's own output, then every skipped test and why (hack/testreport):
# a skip is a test that did not run. pipefail keeps go test's exit status;
# the report fails too on any failed test or build, or a cut run, and, with
# OSIMAGES_REQUIRE_ALL set (CI), on any test skipped for a missing tool or
# fixture.
report=$(mktemp -d)
trap 'rm -rf "$report"' EXIT
go build -o "$report/testreport" ./hack/testreport
go test -count=1 -timeout 40m -json "$@" ./... | "$report/testreport"
