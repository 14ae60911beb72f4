#!/usr/bin/env bash
# Builds the ironhorn OCI image from Debian's package archive alone: no base
# image from a container registry. mmdebstrap makes a minimal bookworm root
# with the tools the binaries call (lvm2, e2fsprogs, xfsprogs, util-linux,
# fuse3), the four ironhorn binaries go to /usr/local/bin, umoci packs the
# tree as one layer of an OCI image, and skopeo writes it as an archive that
# `ctr images import`, `kind load image-archive` and `docker load` take.
#
#   deploy/image/build.sh [OUT_DIR]      (as root; default OUT_DIR: target/image)
#
# Prints the image name and the archive's path. Needs: mmdebstrap, umoci,
# skopeo (installed with apt-get when missing) and cargo.
set -euo pipefail

IMAGE_NAME=ironhorn.io/ironhorn
IMAGE_TAG=$(sed -n 's/^version = "\(.*\)"/\1/p' "$(dirname "$0")/../../Cargo.toml" | head -n1)
IMAGE="$IMAGE_NAME:$IMAGE_TAG"
SUITE=bookworm
MIRROR=${IRONHORN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=lvm2,e2fsprogs,xfsprogs,util-linux,mount,fuse3,kmod,ca-certificates
BINARIES=(ironhorn ironhorn-instance-manager ironhorn-engine ironhorn-replica)

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$repo/target/image}" && cd "${1:-$repo/target/image}" && pwd)

if [ "$(id -u)" -ne 0 ]; then
    echo "build.sh: run as root (mmdebstrap makes device nodes and owns files as root)" >&2
    exit 1
fi
missing=()
for tool in mmdebstrap umoci skopeo; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build.sh: installing ${missing[*]}" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

started=$(date +%s)
echo "== cargo build --release (${BINARIES[*]})" >&2
(cd "$repo" && cargo build --release --quiet $(printf -- '--bin %s ' "${BINARIES[@]}"))

work=$(mktemp -d "$out/.build.XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

echo "== mmdebstrap $SUITE ($PACKAGES)" >&2
rootfs="$work/rootfs"
mmdebstrap --quiet --variant=minbase --mode=root --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$SUITE" "$rootfs" "$MIRROR"
# No apt lists or caches in the image; LVM must not use udev or lvmetad in
# a container, and takes device nodes from the host's /dev.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*
sed -i -e 's/^\(\s*\)# *udev_sync = 1/\1udev_sync = 0/' -e 's/^\(\s*\)# *udev_rules = 1/\1udev_rules = 0/' \
    "$rootfs/etc/lvm/lvm.conf"
for bin in "${BINARIES[@]}"; do
    # Stripped: the release profile keeps line tables for backtraces.
    install -s -m 0755 "$repo/target/release/$bin" "$rootfs/usr/local/bin/$bin"
done

echo "== umoci: OCI layout" >&2
layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$IMAGE_TAG"
bundle="$work/bundle"
umoci unpack --image "$layout:$IMAGE_TAG" "$bundle"
rm -rf "$bundle/rootfs"
mv "$rootfs" "$bundle/rootfs"
umoci repack --image "$layout:$IMAGE_TAG" "$bundle"
umoci config --image "$layout:$IMAGE_TAG" \
    --config.entrypoint "" --config.cmd ironhorn --config.workingdir / \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.label "org.opencontainers.image.title=ironhorn" \
    --config.label "org.opencontainers.image.version=$IMAGE_TAG" \
    --architecture amd64 --os linux
umoci gc --layout "$layout"

echo "== skopeo: archive" >&2
rm -rf "$out/oci" "$out/ironhorn.tar"
mv "$layout" "$out/oci"
skopeo copy --quiet "oci:$out/oci:$IMAGE_TAG" "docker-archive:$out/ironhorn.tar:$IMAGE"

echo "built $IMAGE in $(( $(date +%s) - started )) s"
echo "image:   $IMAGE"
echo "archive: $out/ironhorn.tar   (OCI layout: $out/oci, tag $IMAGE_TAG)"
echo "load it: ctr -n k8s.io images import $out/ironhorn.tar   # containerd nodes, on each node"
echo "         kind load image-archive $out/ironhorn.tar        # kind"
echo "         docker load -i $out/ironhorn.tar                 # docker"
