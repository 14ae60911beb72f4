#!/usr/bin/env bash
# Builds the image from a clean state (deploy/image/build.sh into a fresh
# directory) and checks it as a container runtime would see it: unpacks the
# archive's OCI image with umoci and, chrooted into that root filesystem,
# runs `ironhorn --version`, every binary's --help and the tools the
# binaries call. Also checks that deploy/ironhorn.yaml names the image the
# script built. Exit 0 only when all of it holds.
#
#   deploy/image/test.sh     (as root; takes minutes: a release build and a
#                             Debian bootstrap; not part of scripts/test.sh)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d /tmp/ironhorn-image-test.XXXXXX)
unpacked=""
cleanup() {
    [ -n "$unpacked" ] && rm -rf "$unpacked"
    rm -rf "$out"
}
trap cleanup EXIT

started=$(date +%s)
log="$out/build.log"
"$repo/deploy/image/build.sh" "$out/image" | tee "$log"
image=$(sed -n 's/^image: *//p' "$log")
[ -n "$image" ] || { echo "FAIL: build.sh printed no image name"; exit 1; }
tag=${image##*:}

fail() { echo "FAIL: $*"; exit 1; }
grep -q "image: $image\$" "$repo/deploy/ironhorn.yaml" || fail "deploy/ironhorn.yaml does not use $image"
if grep -n "image: ironhorn" "$repo/deploy/ironhorn.yaml" | grep -v "image: $image\$"; then
    fail "deploy/ironhorn.yaml names another ironhorn image"
fi
[ -s "$out/image/ironhorn.tar" ] || fail "no archive"
skopeo inspect "docker-archive:$out/image/ironhorn.tar" > "$out/inspect.json" || fail "skopeo cannot read the archive"
grep -q '"Architecture": "amd64"' "$out/inspect.json" || fail "archive is not an amd64 image: $(cat "$out/inspect.json")"

# Unpack the archive's image (not the build tree) and run inside it.
skopeo copy --quiet "docker-archive:$out/image/ironhorn.tar" "oci:$out/check:$tag"
unpacked="$out/unpacked"
umoci unpack --image "$out/check:$tag" "$unpacked" >/dev/null
root="$unpacked/rootfs"
passed=0
failed=0
check() {
    if chroot "$root" "$@" > "$out/run.txt" 2>&1; then
        passed=$((passed + 1))
        echo "ok   $*: $(head -n1 "$out/run.txt")"
    else
        failed=$((failed + 1))
        echo "FAIL $*: $(head -n3 "$out/run.txt")"
    fi
}
check ironhorn --version
for bin in ironhorn ironhorn-instance-manager ironhorn-engine ironhorn-replica; do
    check "$bin" --help
done
check ironhorn-instance-manager serve --help
check lvm version
check mkfs.ext4 -V
check mkfs.xfs -V
check mount --version
check losetup --version
check blkid -V
check fusermount3 -V
version=$(chroot "$root" ironhorn --version)
[ "$version" = "ironhorn $tag" ] || { failed=$((failed + 1)); echo "FAIL version says '$version', image tag $tag"; }
size=$(du -sh "$out/image/ironhorn.tar" | cut -f1)
echo "image $image: archive $size, built and checked in $(( $(date +%s) - started )) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
