#!/usr/bin/env bash
# Serve benchmark: eight concurrent curl downloads of the same 1 GiB image
# from `osimages serve` and from Debian's nginx (sendfile on, tcp_nopush on,
# 2 workers) serving the same file, and from the OCI blob of the same osimages
# server (what oci:// clients download), runs alternated on 127.0.0.1. Prints
# the aggregate throughputs, the ratios, and the osimages server's RSS.
#
#   hack/bench-serve.sh [-runs N] [-clients N] [-size BYTES] [-hold 2m] [-scrub-rate 50Mi] ...
#
# -scrub-rate runs the osimages server with a scrub going on without pause
# during its downloads (make bench-serve BENCH_ARGS="-scrub-rate 50Mi").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export PATH=$PATH:/usr/sbin
if ! command -v nginx >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "bench-serve: nginx is missing: install Debian's nginx package (apt-get install nginx)" >&2
    exit 1
  fi
  # The package's own service is not used (nor started where there is no
  # init system): the benchmark runs nginx with a configuration of its own.
  echo "bench-serve: installing Debian's nginx" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
fi
if ! command -v curl >/dev/null 2>&1; then
  echo "bench-serve: curl is missing (apt-get install curl)" >&2
  exit 1
fi

go build -o bin/osimages ./cmd/osimages
go build -o bin/bench-serve ./bench/serve

# The benchmark runs in a session of its own, hence a scheduling autogroup of
# its own, which it raises (as root) so that other work on the machine
# disturbs its runs less. Being out of the terminal's process group, it is
# sent SIGTERM on Ctrl-C, and cleans up before exiting.
setsid bin/bench-serve -osimages "$PWD/bin/osimages" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM
status=0
wait "$pid" || status=$?
while kill -0 "$pid" 2>/dev/null; do
  status=0
  wait "$pid" || status=$?
done
exit "$status"
