#!/usr/bin/env bash
# IPA benchmark: ironic-python-agent's own download and write (stable/2025.1,
# prepare_image streaming a raw image onto a file, the test driver of
# internal/testenv) of one 1 GiB image from `osimages serve` and from Debian's
# nginx serving the same file, runs alternated in one process; prints IPA's
# throughput from each (bytes over the time IPA itself logs) and the ratio.
#
#   hack/bench-ipa.sh [SIZE_BYTES [RUNS]]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export PATH=$PATH:/usr/sbin
if ! command -v nginx >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "bench-ipa: nginx is missing: install Debian's nginx package (apt-get install nginx)" >&2
    exit 1
  fi
  # The package's own service is not used: the benchmark runs nginx with a
  # configuration of its own.
  echo "bench-ipa: installing Debian's nginx" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
fi
# IPA's libraries (Debian's, and Debian 13's oslo.utils unpacked into the
# tools cache).
eval "$(hack/tools.sh env)"
export OSIMAGES_BENCH_IPA_SIZE=${1:-1073741824} OSIMAGES_BENCH_IPA_RUNS=${2:-3}
# A missing IPA or library is a failure here, not a skip.
export OSIMAGES_REQUIRE_ALL=1
go test -count=1 -run '^$' -bench '^BenchmarkIPADownload$' -benchtime 1x -timeout 60m ./cmd/osimages
