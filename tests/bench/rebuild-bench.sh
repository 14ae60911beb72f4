#!/usr/bin/env bash
# Rebuild speed, side by side in one run:
#   - dd: SIZE bytes from one file to another, 1 MiB blocks, O_DIRECT both
#     ways (what the disk does for a plain sequential copy);
#   - nbdcopy between two nbdkit file exports (a copy over NBD, the peer);
#   - ironhorn: an empty replica added to a volume holding SIZE of data
#     (full rebuild, through `replica add`, until the replica is RW);
#   - ironhorn: a replica killed, 1/16 of the volume rewritten while it is
#     away, then restarted on its store and added back (delta rebuild).
# Prints MiB/s of volume made whole per second, with ratios to dd and nbdcopy.
#
#   tests/bench/rebuild-bench.sh            (env: SIZE=1G DIR=/var/tmp)
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=${SIZE:-1G}
DIR=${DIR:-/var/tmp}/ironhorn-rebuild-bench-$$
for tool in fio nbdkit nbdcopy jq dd awk; do
  command -v "$tool" >/dev/null || { echo "rebuild-bench: $tool is missing (apt-get install fio nbdkit libnbd-bin jq)" >&2; exit 1; }
done
cargo build --release --bins -q
BIN=target/release
mkdir -p "$DIR"
PIDS=()
VOL=rb$$
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
BYTES=$(numfmt --from=iec "$SIZE")
MIB=$((BYTES >> 20))
STORE_SIZE=$(( (BYTES * 5 / 4 + (72 << 20)) >> 20 ))M
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { print b - a }'; }
layout() { fio --name=layout --filename="$1" --rw=write --bs=1M --size="$2" --ioengine=psync --zero_buffers >/dev/null 2>&1; }
# fio's default buffers are random, so nothing is skipped as zeroes.
fill() { fio --name=fill --rw=write --bs=1M --iodepth=8 --size="$SIZE" "$@" >/dev/null 2>&1; }
wait_listen() { # logfile -> address
  for _ in $(seq 1 200); do
    if grep -q '^listening on' "$1" 2>/dev/null; then sed -n 's/^listening on //p' "$1" | head -1; return; fi
    sleep 0.05
  done
  echo "rebuild-bench: process did not start (see $1)" >&2; exit 1
}
start_replica() { # name [layout] -> prints address; pid in $DIR/name.pid
  [ "${2:-}" = keep ] || layout "$DIR/$1.img" "$STORE_SIZE"
  "$BIN/ironhorn-replica" serve --store "file:$DIR/$1.img" --size "$SIZE"iB --listen 127.0.0.1:0 >"$DIR/$1.out" 2>"$DIR/$1.log" &
  echo $! >"$DIR/$1.pid"
  wait_listen "$DIR/$1.out"
}
declare -A SECS COPIED

echo "running: dd (O_DIRECT, 1 MiB)..." >&2
fill --filename="$DIR/src.img" --ioengine=io_uring --direct=1
layout "$DIR/dst.img" "$SIZE"
t0=$(now)
dd if="$DIR/src.img" of="$DIR/dst.img" bs=1M count="$MIB" iflag=direct oflag=direct conv=notrunc,fsync status=none
SECS[dd]=$(since "$t0")
COPIED[dd]=$BYTES

echo "running: nbdcopy between two nbdkit exports..." >&2
nbdkit --foreground --unix "$DIR/src.sock" --exit-with-parent file "$DIR/src.img" cache=none &
PIDS+=($!)
nbdkit --foreground --unix "$DIR/dst.sock" --exit-with-parent file "$DIR/dst.img" cache=none &
PIDS+=($!)
for s in src dst; do for _ in $(seq 1 100); do [ -S "$DIR/$s.sock" ] && break; sleep 0.05; done; done
t0=$(now)
nbdcopy "nbd+unix:///?socket=$DIR/src.sock" "nbd+unix:///?socket=$DIR/dst.sock"
SECS[nbdcopy]=$(since "$t0")
COPIED[nbdcopy]=$BYTES
rm -f "$DIR/src.img" "$DIR/dst.img"

echo "running: ironhorn full rebuild of an empty replica..." >&2
R0=$(start_replica r0)
PIDS+=("$(cat "$DIR/r0.pid")")
"$BIN/ironhorn-engine" serve --volume "$VOL" --size "$SIZE"iB --epoch 1 --listen 127.0.0.1:0 \
    --nbd "unix:$DIR/e.sock" --replica "$R0" >"$DIR/e.out" 2>"$DIR/e.log" &
PIDS+=($!)
E=$(wait_listen "$DIR/e.out")
URI="nbd+unix:///$VOL?socket=$DIR/e.sock"
fill --ioengine=nbd --uri="$URI"
R1=$(start_replica r1)
PIDS+=("$(cat "$DIR/r1.pid")")
t0=$(now)
"$BIN/ironhorn-engine" replica add --engine "$E" --replica "$R1" >/dev/null
SECS[full]=$(since "$t0")
status=$("$BIN/ironhorn-engine" status --engine "$E")
[ "$(jq -r --arg a "$R1" '.replicas[] | select(.address == $a) | .mode' <<<"$status")" = RW ] \
  || { echo "rebuild-bench: the new replica did not become RW: $status" >&2; exit 1; }
COPIED[full]=$(jq '.rebuilds[0].copied_bytes' <<<"$status")

echo "running: ironhorn delta rebuild (1/16 of the volume rewritten while away)..." >&2
kill -9 "$(cat "$DIR/r1.pid")"
fio --name=away --rw=randwrite --bs=1M --iodepth=8 --size="$SIZE" --io_size=$((BYTES / 16)) \
    --ioengine=nbd --uri="$URI" >/dev/null 2>&1
"$BIN/ironhorn-engine" replica remove --engine "$E" --replica "$R1" >/dev/null
R1=$(start_replica r1 keep)
PIDS+=("$(cat "$DIR/r1.pid")")
t0=$(now)
"$BIN/ironhorn-engine" replica add --engine "$E" --replica "$R1" >/dev/null
SECS[delta]=$(since "$t0")
status=$("$BIN/ironhorn-engine" status --engine "$E")
[ "$(jq -r --arg a "$R1" '.replicas[] | select(.address == $a) | .mode' <<<"$status")" = RW ] \
  || { echo "rebuild-bench: the returning replica did not become RW: $status" >&2; exit 1; }
COPIED[delta]=$(jq '.rebuilds[0].copied_bytes' <<<"$status")

echo
echo "Making a $SIZE volume whole: volume MiB per second of wall time (copied = bytes that moved)"
echo
echo "| method | seconds | copied MiB | volume MiB/s | ×dd | ×nbdcopy |"
echo "|---|---:|---:|---:|---:|---:|"
dd_rate=$(awk -v m="$MIB" -v s="${SECS[dd]}" 'BEGIN { print m / s }')
nc_rate=$(awk -v m="$MIB" -v s="${SECS[nbdcopy]}" 'BEGIN { print m / s }')
for key in dd nbdcopy full delta; do
  case $key in
    dd) name="dd, O_DIRECT 1 MiB";; nbdcopy) name="nbdcopy, nbdkit → nbdkit";;
    full) name="ironhorn full rebuild";; delta) name="ironhorn delta rebuild";;
  esac
  awk -v n="$name" -v s="${SECS[$key]}" -v c="${COPIED[$key]}" -v m="$MIB" -v d="$dd_rate" -v k="$nc_rate" \
    'BEGIN { r = m / s; printf "| %s | %.2f | %d | %.0f | %.2f | %.2f |\n", n, s, c / 1048576, r, r / d, r / k }'
done
