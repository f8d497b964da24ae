#!/usr/bin/env bash
# The webhook test of this module, judged by the Image validation of CAPM3
# v1.14.0-rc.0: CAPM3's api module v1.13.2 (the version go.mod names) with
# the api part of upstream's commit that makes v1.14.0-rc.0 accept an
# oci:// image without a checksum (hack/metal3/patches, PR #3522), in a
# copy, which a -modfile copy of go.mod replaces the module by. The Go
# module proxy refuses v1.14.x (403); this is that release's validation
# code, on the release before it. CAPM3WEBHOOK_OCI_COMMIT tells the test
# that oci:// templates must now be accepted.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
mod=github.com/metal3-io/cluster-api-provider-metal3/api
version=$(sed -n "s|^\t$mod \(v[^ ]*\)$|\1|p" "$here/go.mod")
patch_file=$root/hack/metal3/patches/capm3-$version-oci-without-checksum.patch
[ -f "$patch_file" ] || { echo "oci-commit.sh: $patch_file is missing: go.mod names $mod $version, for which no oci:// commit patch exists" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
src=$(cd "$here" && go list -m -f '{{.Dir}}' "$mod")
[ -d "$src" ] || { echo "oci-commit.sh: $mod $version is not in the Go module cache (hack/tools.sh downloads it)" >&2; exit 1; }
cp -r "$src" "$tmp/api"
chmod -R u+w "$tmp/api"
# Only the files of the api module: the rest of the commit is the manager's.
awk '/^diff --git /{keep = ($3 ~ /^a\/api\//)} keep' "$patch_file" >"$tmp/api.patch"
(cd "$tmp/api" && patch -p2 --forward --quiet <"$tmp/api.patch") ||
  { echo "oci-commit.sh: $patch_file does not apply to $mod $version" >&2; exit 1; }
cp "$here/go.mod" "$tmp/go.mod"
cp "$here/go.sum" "$tmp/go.sum"
(cd "$here" && go mod edit -modfile="$tmp/go.mod" -replace "$mod=$tmp/api" &&
  CAPM3WEBHOOK_OCI_COMMIT=1 go test -modfile="$tmp/go.mod" -count=1 ./...)
