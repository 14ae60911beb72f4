#!/usr/bin/env bash
# Runs the whole ironhorn test suite on a fresh machine (as root).
# Installs what the tests need when it is missing, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh: the tests need root (loop devices, LVM, FUSE, network namespaces)" >&2
  exit 1
fi

# tool -> Debian package
declare -A needs=(
  [lvcreate]=lvm2 [fio]=fio [qemu-io]=qemu-utils [nbdinfo]=libnbd-bin [nbdkit]=nbdkit
  [fusermount3]=fuse3 [mkfs.ext4]=e2fsprogs [mkfs.xfs]=xfsprogs [ip]=iproute2 [iptables]=iptables
  [losetup]=mount [blkid]=util-linux [findmnt]=util-linux [mountpoint]=util-linux
  [chromium]=chromium [chromedriver]=chromium-driver [firefox-esr]=firefox-esr
)
missing=()
for tool in "${!needs[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${needs[$tool]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A one-off build (CI's clean clone) gains nothing from incremental state,
# which would take as much disk again as the build itself.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
fi
# The tests make stores, loop files and LVM PVs under the temp directory;
# running out of disk there fails them with ENOSPC far from the cause.
free_kib=$(df --output=avail -k "${TMPDIR:-/tmp}" | tail -1)
if [ "$free_kib" -lt $((4 * 1024 * 1024)) ]; then
  echo "scripts/test.sh: less than 4 GiB free under ${TMPDIR:-/tmp} ($((free_kib / 1024)) MiB); free some disk first" >&2
  exit 1
fi

cargo build --workspace --bins
cargo test --workspace -- --test-threads="${IRONHORN_TEST_THREADS:-2}"
