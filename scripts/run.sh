#!/usr/bin/env bash
# Builds ironhorn and runs it on this machine with an embedded default: a
# standalone cluster (`ironhorn up`): the manager on an embedded datastore
# under ./data and three simulated nodes, each an instance manager with one
# disk (an LVM volume group on a loop-backed file when run as root, a
# directory of file stores otherwise). Extra arguments go to `ironhorn up`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then
  missing=()
  command -v lvcreate >/dev/null 2>&1 || missing+=(lvm2)
  command -v losetup >/dev/null 2>&1 || missing+=(mount)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
cargo build --release --bins
export PATH="$PWD/target/release:$PATH"
exec ironhorn up --data-dir data "$@"
