#!/usr/bin/env bash
# The daemons of Metal3 in a box, started by hack/e2e-metal3.sh inside the
# box's network namespace and in a private mount namespace of their own:
# every mount made here (the Ironic tree as an overlay, its /proc, /sys,
# /dev, /run, the run directory at /m3box) vanishes with the last process
# of that namespace, so a killed run leaves no mount behind.
#
# This shell stays as the namespace's holder (run/holder.pid): the test
# enters its mount and network namespaces (nsenter -t HOLDER -m -n) to run
# commands in the tree. Each daemon is a process of its own, its PID in
# run/NAME.pid, its output in logs/NAME.log.
#
#   inside.sh IRONIC_TREE   (W and the settings of lib.sh from the environment)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tree=$1
R=$W/ironic/root
echo $$ >"$W/run/holder.pid"

mount -t overlay overlay -o "lowerdir=$tree,upperdir=$W/ironic/upper,workdir=$W/ironic/work" "$R"
mount -t proc proc "$R/proc"
mount -t sysfs sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mkdir -p "$R/m3box"
mount --bind "$W" "$R/m3box"
mkdir -p "$R/run/libvirt" "$R/var/lib/libvirt/qemu" "$R/var/log/libvirt/qemu" "$R/var/lib/ironic" "$R/srv/http" "$R/srv/tftp"
cp "$R/usr/lib/ipxe/undionly.kpxe" "$R/srv/tftp/"
# The box's CA (written by the test), trusted by Ironic's image and OCI
# clients: Ironic 29 reads no CA file for OCI registries (see docs).
chroot "$R" update-ca-certificates >"$W/logs/update-ca.log" 2>&1

daemon() {
  local name=$1
  shift
  chroot "$R" "$@" >>"$W/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$W/run/$name.pid"
}
wait_port() { # NAME PORT: until something listens on BR_IP:PORT
  for _ in $(seq 1 240); do
    (exec 3<>"/dev/tcp/$BR_IP/$2") 2>/dev/null && return 0
    alive "$(pid_of "$1")" || fail "$1 exited: see $W/logs/$1.log"
    sleep 0.5
  done
  fail "$1 does not listen on $BR_IP:$2 after 120 s: see $W/logs/$1.log"
}

daemon virtlogd /usr/sbin/virtlogd
daemon libvirtd /usr/sbin/libvirtd
daemon sushy /usr/bin/env SUSHY_EMULATOR_CONFIG=/etc/sushy-emulator.conf /usr/local/bin/sushy-emulator --config /etc/sushy-emulator.conf
daemon dnsmasq /usr/sbin/dnsmasq -k -C /etc/dnsmasq-m3box.conf
daemon nginx /usr/sbin/nginx -c /etc/nginx/m3box.conf
chroot "$R" ironic-dbsync --config-file /etc/ironic/ironic.conf create_schema >"$W/logs/ironic-dbsync.log" 2>&1 ||
  fail "ironic-dbsync failed: see $W/logs/ironic-dbsync.log"
daemon ironic /usr/bin/ironic --config-file /etc/ironic/ironic.conf
wait_port nginx "$BOOT_HTTP_PORT"
wait_port sushy "$SUSHY_PORT"
wait_port ironic "$IRONIC_PORT"
touch "$W/run/ready"
# Hold the namespace until the test stops the daemons and this process
# (the same PID: exec).
exec sleep infinity
