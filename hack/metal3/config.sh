# write_configs UPPER: the box's configuration files, written into the
# overlay's upper layer before it is mounted (sourced by hack/e2e-metal3.sh).
write_configs() {
  local u=$1
  mkdir -p "$u/etc/ironic" "$u/etc/libvirt" "$u/etc/nginx" "$u/usr/local/share/ca-certificates"
  cp "$W/tls/ca.crt" "$u/usr/local/share/ca-certificates/osimages-m3box-ca.crt"
  cat >"$u/etc/ironic/ironic.conf" <<EOC
# Ironic 29 as one process (API and conductor, no message bus), sqlite, no
# keystone, the redfish hardware type with iPXE boot and the direct deploy:
# IPA downloads the image itself from the image server.
[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = m3box-conductor
my_ip = $BR_IP
debug = true
enabled_hardware_types = redfish
enabled_boot_interfaces = ipxe
enabled_deploy_interfaces = direct
enabled_power_interfaces = redfish
enabled_management_interfaces = redfish
# baremetal-operator (the Cluster API chain) enrolls its nodes with the
# agent inspection and redfish RAID and firmware interfaces; the defaults
# keep the nodes the scenarios enroll themselves as they were.
enabled_inspect_interfaces = agent,no-inspect
enabled_network_interfaces = noop
enabled_raid_interfaces = redfish,no-raid
enabled_bios_interfaces = no-bios
enabled_console_interfaces = no-console
enabled_rescue_interfaces = no-rescue
enabled_vendor_interfaces = no-vendor
enabled_firmware_interfaces = redfish,no-firmware
default_boot_interface = ipxe
default_deploy_interface = direct
default_inspect_interface = no-inspect
default_raid_interface = no-raid
default_firmware_interface = no-firmware
minimum_memory_warning_only = true
[api]
host_ip = $BR_IP
port = $IRONIC_PORT
[database]
connection = sqlite:////var/lib/ironic/ironic.sqlite
[conductor]
automated_clean = false
deploy_kernel = http://$BR_IP:$BOOT_HTTP_PORT/ipa/ipa.kernel
deploy_ramdisk = http://$BR_IP:$BOOT_HTTP_PORT/ipa/ipa.initramfs
deploy_callback_timeout = 900
power_state_sync_max_retries = 30
[deploy]
# 2025.1 defaults to UEFI, for which sushy-tools wants OVMF: BIOS here.
default_boot_mode = bios
http_url = http://$BR_IP:$BOOT_HTTP_PORT
http_root = /srv/http
fast_track = false
[agent]
image_download_source = http
[pxe]
# ipa-disk-wait-attempts=1: the 1 GiB disk is under IPA's 4 GiB guess, and
# root device hints are known only after lookup. No retry of a failed
# download or checksum: a refused image fails the deploy at once.
# IPA checks the server's certificate against the run's CA, which the test
# appends to the ramdisk (hack/e2e-metal3.sh, ipa_files).
kernel_append_params = console=ttyS0,115200 ipa-debug=1 ipa-disk-wait-attempts=1 ipa-image-download-connection-retries=0
tftp_root = /srv/tftp
ipxe_timeout = 120
boot_retry_timeout = 900
[dhcp]
dhcp_provider = none
[service_catalog]
# No keystone: the URL IPA calls back.
auth_type = none
endpoint_override = http://$BR_IP:$IRONIC_PORT
[redfish]
connection_attempts = 10
EOC
  cat >"$u/etc/sushy-emulator.conf" <<EOC
SUSHY_EMULATOR_LISTEN_IP = '$BR_IP'
SUSHY_EMULATOR_LISTEN_PORT = $SUSHY_PORT
SUSHY_EMULATOR_LIBVIRT_URI = 'qemu:///system'
SUSHY_EMULATOR_IGNORE_BOOT_DEVICE = False
EOC
  # libvirt in a chroot without systemd: root, no cgroups, no namespaces,
  # no security driver.
  cat "$IRONIC_TREE/etc/libvirt/qemu.conf" - >"$u/etc/libvirt/qemu.conf" <<'EOC'
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
EOC
  # DHCP for the host's NIC; its iPXE ROM (ipxe-qemu) gets boot.ipxe over
  # HTTP, which Ironic writes.
  cat >"$u/etc/dnsmasq-m3box.conf" <<EOC
port=0
interface=br0
bind-interfaces
dhcp-range=$DHCP_RANGE,255.255.255.0,1h
dhcp-match=set:ipxe,175
dhcp-boot=tag:ipxe,http://$BR_IP:$BOOT_HTTP_PORT/boot.ipxe
dhcp-boot=tag:!ipxe,undionly.kpxe
enable-tftp
tftp-root=/srv/tftp
log-dhcp
log-facility=-
pid-file=
EOC
  # nginx: Ironic's http_root and the IPA files for iPXE (plain HTTP), and,
  # for bench-metal3, the test image over HTTPS as Sylva's os-image-server
  # serves it.
  cat >"$u/etc/nginx/m3box.conf" <<EOC
daemon off;
master_process on;
worker_processes 1;
pid /run/nginx-m3box.pid;
error_log /m3box/logs/nginx-error.log;
events { worker_connections 256; }
http {
  include /etc/nginx/mime.types;
  access_log /m3box/logs/nginx-access.log;
  sendfile on;
  tcp_nopush on;
  server {
    listen $BR_IP:$BOOT_HTTP_PORT;
    root /srv/http;
    location /ipa/ { alias /m3box/ipa/; }
  }
  server {
    listen $BR_IP:$NGINX_PORT ssl;
    ssl_certificate /m3box/tls/server.crt;
    ssl_certificate_key /m3box/tls/server.key;
    root /m3box/nginx;
  }
}
EOC
}
