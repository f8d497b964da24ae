#!/bin/sh
# The test image of Metal3 in a box: a 48 MiB raw disk (MBR, one FAT
# partition, syslinux) whose kernel (the IPA ramdisk's Debian kernel) boots a
# busybox initramfs. Its /init reads the first 48 MiB of /dev/vda, the image
# as written on the host's disk, and prints
#
#   OSIMAGES-BOOT-MARKER <sha256 of those bytes>
#
# on the serial line, then stays up, as a booted node does: the line proves
# that the disk the host booted from holds exactly the image. (A host that
# powered itself off raced Ironic at the next undeploy: Ironic read it on,
# and sushy-tools answered its power off with 500, "domain is not running",
# failing the tear down.) Before it, the line
#
#   OSIMAGES-DISK-BUT-PARTITION-TABLE <sha256 of those bytes but 440-511>
#
# proves the same of a disk whose partition table Ironic extended with a
# config drive partition (as baremetal-operator asks for its user data): the
# partition table is the one part of the first 48 MiB it rewrites. No loop device, no mount: mtools and
# syslinux write into the file. Runs inside the box's Ironic tree (chroot),
# where the tools are.
#
#   test-image.sh DIR   DIR holds vmlinuz and modules/ (with modules.order);
#                       writes DIR/osimages-test.raw and boots it once
set -eu
D=$1
SIZE_MIB=48
cd "$D"
rm -rf ir osimages-test.raw
mkdir -p ir/bin ir/proc ir/sys ir/dev ir/modules
cp /bin/busybox ir/bin/busybox # Debian's busybox-static
for a in sh mount echo sleep cat head dd sha256sum cut insmod ls; do ln -s busybox "ir/bin/$a"; done
cp modules/* ir/modules/
cat >ir/init <<EOI
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in \$(cat /modules/modules.order); do insmod /modules/\$m; done
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do [ -b /dev/vda ] && break; sleep 0.5; done
rest=\$({ head -c 440 /dev/vda; dd if=/dev/vda bs=512 skip=1 count=$((SIZE_MIB * 2048 - 1)) 2>/dev/null; } | sha256sum | cut -d' ' -f1)
echo "OSIMAGES-DISK-BUT-PARTITION-TABLE \$rest" >/dev/ttyS0
sum=\$(head -c $((SIZE_MIB * 1024 * 1024)) /dev/vda | sha256sum | cut -d' ' -f1)
echo "OSIMAGES-BOOT-MARKER \$sum" >/dev/ttyS0
while :; do sleep 3600; done
EOI
chmod +x ir/init
(cd ir && find . | cpio -o -H newc --quiet | gzip -9) >initrd.gz
cat >syslinux.cfg <<'EOC'
DEFAULT marker
TIMEOUT 1
PROMPT 0
SERIAL 0 115200
LABEL marker
  KERNEL /vmlinuz
  INITRD /initrd.gz
  APPEND console=ttyS0,115200 panic=5 quiet
EOC
img=osimages-test.raw.tmp
rm -f "$img"
truncate -s ${SIZE_MIB}M "$img"
echo 'start=2048, type=e, bootable' | sfdisk -q "$img"
mkfs.fat -F 16 --offset 2048 -n M3BOX "$img" $(((SIZE_MIB - 1) * 1024)) >/dev/null
syslinux --offset $((2048 * 512)) --install "$img"
mcopy -i "$img@@1M" vmlinuz initrd.gz syslinux.cfg ::/
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$img" conv=notrunc bs=440 count=1 status=none
sum=$(sha256sum "$img" | cut -d' ' -f1)
# It must boot before it is published: qemu (TCG) on the file itself,
# stopped once the marker is out (the image stays up), or after 300 s.
qemu-system-x86_64 -accel tcg -m 256 -nographic -no-reboot \
  -drive file="$img",format=raw,if=virtio -net none >boot.log 2>&1 </dev/null &
qemu=$!
i=0
while [ $i -lt 600 ] && kill -0 $qemu 2>/dev/null && ! grep -q "OSIMAGES-BOOT-MARKER $sum" boot.log; do
  sleep 0.5
  i=$((i + 1))
done
kill $qemu 2>/dev/null || true
wait $qemu 2>/dev/null || true
if ! grep -q "OSIMAGES-BOOT-MARKER $sum" boot.log; then
  echo "test-image: the image does not boot to OSIMAGES-BOOT-MARKER $sum under qemu; its console:" >&2
  tail -30 boot.log >&2
  exit 1
fi
rest=$({ head -c 440 "$img"; dd if="$img" bs=512 skip=1 status=none; } | sha256sum | cut -d' ' -f1)
if ! grep -q "OSIMAGES-DISK-BUT-PARTITION-TABLE $rest" boot.log; then
  echo "test-image: the image booted, but not to OSIMAGES-DISK-BUT-PARTITION-TABLE $rest" >&2
  exit 1
fi
echo "$rest" >but-partition-table.sha256
mv "$img" osimages-test.raw
echo "$sum"
