#!/usr/bin/env bash
# The cached parts of Metal3 in a box, each built once and kept in the tools
# cache under a name keyed by its inputs (as hack/e2e.sh keeps the cluster's
# binaries):
#
#   metal3-rootfs-{ironic,ipa}-KEY.tar  mmdebstrap of Debian 13 with the
#                                       packages of {ironic,ipa}.packages
#   metal3-ironic-KEY/                  the Ironic tree: that rootfs with
#                                       sushy-tools installed and the Ironic
#                                       patches applied (read-only: runs
#                                       mount it as an overlay's lower layer)
#   metal3-ipa-KEY/                     ipa.kernel and ipa.initramfs: IPA
#                                       (patched) in the ipa rootfs, pruned
#                                       and packed
#
# A key hashes every input of the part: its package list, the tarball from
# ../shared, the patch files, this script and the ramdisk's init. Prints the
# two directories as shell assignments: IRONIC_TREE=... IPA_DIR=...
#
#   hack/metal3/build.sh [rootfs|all]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

shared=$(shared_dir)
IPA_TGZ=$shared/metal3/ironic-python-agent-stable-2025.1.tgz
SUSHY_TGZ=$shared/metal3/sushy-tools-2.2.0.tgz
for f in "$IPA_TGZ" "$SUSHY_TGZ"; do
  [ -f "$f" ] || fail "$f is missing: Metal3 in a box installs ironic-python-agent and sushy-tools from ../shared/metal3 (PyPI is not reachable); set OSIMAGES_SHARED_DIR to the shared fixtures directory"
done
mkdir -p "$CACHE"

# rootfs NAME VARIANT: the mmdebstrap tarball of NAME.packages.
rootfs_tar() { echo "$CACHE/metal3-rootfs-$1-$(key "$M3_DIR/$1.packages" <(echo "$SUITE $2")).tar"; }
build_rootfs() {
  local name=$1 variant=$2 out tmp pkgs
  out=$(rootfs_tar "$name" "$variant")
  [ -f "$out" ] && return 0
  pkgs=$(grep -v '^#' "$M3_DIR/$name.packages" | paste -sd, -)
  log "building the $name root filesystem ($SUITE, mmdebstrap, about 2-4 minutes, once) into $out"
  tmp=$(mktemp "$CACHE/.rootfs-$name.XXXXXX.tar")
  if ! nice -n 10 mmdebstrap --quiet --variant="$variant" --include="$pkgs" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    "$SUITE" "$tmp" "$(mirror)" >"$CACHE/.rootfs-$name.log" 2>&1; then
    rm -f "$tmp"
    fail "mmdebstrap of the $name root filesystem failed: see $CACHE/.rootfs-$name.log"
  fi
  mv "$tmp" "$out"
}

build_rootfs_both() {
  # Both in parallel: each is mostly waiting for the mirror and dpkg.
  build_rootfs ironic apt &
  local a=$!
  build_rootfs ipa minbase &
  local b=$!
  wait "$a" || fail "the ironic root filesystem was not built"
  wait "$b" || fail "the ipa root filesystem was not built"
}


# The modules the virtual host's IPA needs (virtio disk and NIC, loop, the
# CD-ROM of virtual media): every other module is dropped from the ramdisk.
IPA_MODULES="drivers/virtio drivers/block/virtio_blk.ko.xz drivers/net/virtio_net.ko.xz
  drivers/net/net_failover.ko.xz net/core/failover.ko.xz drivers/char/hw_random
  drivers/scsi/virtio_scsi.ko.xz drivers/scsi/sd_mod.ko.xz drivers/scsi/scsi_mod.ko.xz
  drivers/scsi/scsi_common.ko.xz drivers/block/loop.ko.xz drivers/cdrom fs/isofs
  drivers/scsi/sr_mod.ko.xz"

# The patches of IPA, none at times: the list, one per line.
ipa_patches() { compgen -G "$M3_DIR/patches/ipa-*.patch" || true; }

ipa_dir() {
  local patches
  mapfile -t patches < <(ipa_patches)
  echo "$CACHE/metal3-ipa-$(key <(basename "$(rootfs_tar ipa minbase)") "$IPA_TGZ" ${patches[@]+"${patches[@]}"} \
    "$M3_DIR/ipa-init" "$M3_DIR/udhcpc.script" <(declare -f build_ipa) <(echo "$IPA_MODULES"))"
}

# build_ipa: IPA from the tarball into the ipa rootfs (its dependencies are
# the Debian packages, hence --no-deps; PBR_VERSION since the tarball has no
# git metadata), patched; the kernel copied out; modules pruned; /init; one
# zstd cpio.
build_ipa() {
  local out tmp r kver m keep mod
  out=$(ipa_dir)
  [ -f "$out/ipa.initramfs" ] && return 0
  log "building the IPA ramdisk into $out (about 1 minute, once)"
  tmp=$(mktemp -d "$CACHE/.ipa.XXXXXX")
  r=$tmp/root
  mkdir "$r"
  tar -C "$r" -xpf "$(rootfs_tar ipa minbase)"
  mkdir -p "$r/tmp/ipa-src"
  tar -C "$r/tmp/ipa-src" --strip-components=1 -xzf "$IPA_TGZ"
  local patches p
  mapfile -t patches < <(ipa_patches)
  for p in ${patches[@]+"${patches[@]}"}; do
    patch -s -p1 --forward --batch -d "$r/tmp/ipa-src" <"$p" || fail "$p does not apply to $IPA_TGZ"
  done
  chroot "$r" env PBR_VERSION=10.0.0 pip install -q --no-deps --no-build-isolation \
    --break-system-packages /tmp/ipa-src >"$tmp/pip.log" 2>&1 || fail "installing IPA failed: $(tail -5 "$tmp/pip.log")"
  rm -rf "$r/tmp/ipa-src"
  # IPA reads /proc/cmdline when imported: check the import with a /proc
  # (an unshared mount namespace, so that nothing stays mounted).
  unshare -m sh -c "mount -t proc proc '$r/proc' && chroot '$r' python3 -c 'import ironic_python_agent.cmd.agent'" ||
    fail "IPA does not import in the ramdisk tree (a missing Debian package in hack/metal3/ipa.packages?)"
  kver=$(ls "$r/lib/modules" | head -1)
  cp "$r/boot/vmlinuz-$kver" "$tmp/ipa.kernel"
  # The test image boots the same kernel: the modules its /init loads to
  # read /dev/vda, decompressed for busybox's insmod, in load order.
  mkdir "$tmp/testimage-modules"
  for mod in virtio_pci virtio_blk; do chroot "$r" modprobe -S "$kver" --show-depends "$mod"; done |
    awk '$1 == "insmod" && !seen[$2]++ {print $2}' |
    while read -r f; do
      b=$(basename "$f" .xz)
      case "$f" in *.xz) xz -dc "$r$f" >"$tmp/testimage-modules/$b" ;; *) cp "$r$f" "$tmp/testimage-modules/$b" ;; esac
      echo "$b" >>"$tmp/testimage-modules/modules.order"
    done
  touch "$tmp/testimage-modules/modules.order"
  m=$r/lib/modules/$kver/kernel
  keep=$tmp/keep
  for p in $IPA_MODULES; do
    [ -e "$m/$p" ] && mkdir -p "$keep/$(dirname "$p")" && cp -a "$m/$p" "$keep/$p"
  done
  rm -rf "$m"
  mv "$keep" "$m"
  chroot "$r" depmod -a "$kver"
  rm -rf "$r"/boot/* "$r"/var/cache/apt/* "$r"/var/lib/apt/lists/* "$r"/lib/firmware
  install -m 0755 "$M3_DIR/ipa-init" "$r/init"
  install -m 0755 "$M3_DIR/udhcpc.script" "$r/etc/udhcpc.script"
  for c in poweroff reboot; do
    printf '#!/bin/sh\nsync\nexec busybox %s -f\n' "$c" >"$r/usr/local/sbin/$c"
    chmod 0755 "$r/usr/local/sbin/$c"
  done
  (cd "$r" && find . -xdev | cpio -o -H newc --quiet | nice -n 10 zstd -q -T2 -10) >"$tmp/ipa.initramfs"
  rm -rf "$r" "$tmp/pip.log"
  rm -rf "$out"
  mv "$tmp" "$out"
}

ironic_tree() {
  echo "$CACHE/metal3-ironic-$(key <(basename "$(rootfs_tar ironic apt)") "$SUSHY_TGZ" "$M3_DIR"/patches/ironic-*.patch <(declare -f build_ironic))"
}

# build_ironic: the ironic rootfs unpacked, sushy-tools installed from the
# tarball (plus its Flask templates: pbr installs no package data without
# git metadata), Ironic patched. Runs mount it read-only as an overlay's
# lower layer, so that a run changes nothing here.
build_ironic() {
  local out tmp r p
  out=$(ironic_tree)
  [ -f "$out/.complete" ] && return 0
  log "unpacking the Ironic tree into $out (once)"
  tmp=$(mktemp -d "$CACHE/.ironic.XXXXXX")
  r=$tmp
  tar -C "$r" -xpf "$(rootfs_tar ironic apt)"
  mkdir -p "$r/tmp/sushy-src"
  tar -C "$r/tmp/sushy-src" --strip-components=1 -xzf "$SUSHY_TGZ"
  chroot "$r" env PBR_VERSION=2.2.0 pip install -q --no-deps --no-build-isolation \
    --break-system-packages /tmp/sushy-src >"$CACHE/.ironic-pip.log" 2>&1 || fail "installing sushy-tools failed: see $CACHE/.ironic-pip.log"
  cp -a "$r/tmp/sushy-src/sushy_tools/emulator/templates" "$r"/usr/local/lib/python3*/dist-packages/sushy_tools/emulator/
  rm -rf "$r/tmp/sushy-src"
  for p in "$M3_DIR"/patches/ironic-*.patch; do
    [ -f "$p" ] || continue
    patch -s -p1 --forward --batch -d "$r/usr/lib/python3/dist-packages" <"$p" || fail "$p does not apply to the Ironic of $(rootfs_tar ironic apt)"
  done
  touch "$r/.complete"
  rm -rf "$out"
  mv "$tmp" "$out"
  chmod 0755 "$out"
}

case "${1:-all}" in
rootfs) build_rootfs_both ;;
all)
  build_rootfs_both
  build_ipa &
  a=$!
  build_ironic
  wait "$a" || fail "the IPA ramdisk was not built"
  echo "IRONIC_TREE=$(ironic_tree) IPA_DIR=$(ipa_dir)"
  ;;
*) fail "unknown stage $1 (want rootfs or all)" ;;
esac
