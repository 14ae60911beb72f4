#!/usr/bin/env bash
# Rebuild speed, side by side in one run:
#   - dd: SIZE bytes from one file to another, 1 MiB blocks, O_DIRECT both
#     ways (what the disk does for a plain sequential copy);
#   - nbdcopy between two nbdkit file exports (a copy over NBD, the peer);
#   - ironhorn: an empty replica added to a volume holding SIZE of data
#     (full rebuild, through `replica add`, until the replica is RW);
#   - ironhorn: a replica killed, 1/16 of the volume rewritten while it is
#     away, then restarted on its store and added back (delta rebuild);
#   - ironhorn: a full rebuild of another empty replica under a rate limit
#     of LIMIT MiB/s (default 100), to show the limit holds.
# Prints MiB/s of volume made whole per second, with ratios to dd and nbdcopy.
#
#   tests/bench/rebuild-bench.sh            (env: SIZE=1G DIR=/var/tmp)
set -euo pipefail
SIZE=${SIZE:-1G}
LIMIT=${LIMIT:-100}
DIR=${DIR:-/var/tmp}/ironhorn-rebuild-bench-$$
BENCH=rebuild-bench TOOLS="fio nbdkit nbdcopy jq dd awk"
source "$(dirname "$0")/common.sh"
VOL=rb$$
BYTES=$(numfmt --from=iec "$SIZE")
MIB=$((BYTES >> 20))
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { print b - a }'; }
start_replica() { # name [layout] -> prints address; pid in $DIR/name.pid
  [ "${2:-}" = keep ] || layout "$DIR/$1.img" "$STORE_SIZE"
  "$BIN/ironhorn-replica" serve --store "file:$DIR/$1.img" --size "$SIZE"iB --listen 127.0.0.1:0 "${LOCAL[@]}" >"$DIR/$1.out" 2>"$DIR/$1.log" &
  echo $! >"$DIR/$1.pid"
  wait_listen "$DIR/$1.out"
}
declare -A SECS COPIED RB_MS
timed_add() { # key replica-address: `replica add` until RW; records time and bytes copied
  local t0 status
  t0=$(now)
  "$BIN/ironhorn-engine" replica add --engine "$E" --replica "$2" >/dev/null
  SECS[$1]=$(since "$t0")
  status=$("$BIN/ironhorn-engine" status --engine "$E")
  [ "$(jq -r --arg a "$2" '.replicas[] | select(.address == $a) | .mode' <<<"$status")" = RW ] \
    || { echo "rebuild-bench: replica $2 did not become RW ($1 rebuild): $status" >&2; exit 1; }
  COPIED[$1]=$(jq '.rebuilds[0].copied_bytes' <<<"$status")
  RB_MS[$1]=$(jq '.rebuilds[0] | .finished_unix_ms - .started_unix_ms' <<<"$status")
}

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
    --nbd "unix:$DIR/e.sock" --replica "$R0" "${LOCAL[@]}" >"$DIR/e.out" 2>"$DIR/e.log" &
PIDS+=($!)
E=$(wait_listen "$DIR/e.out")
URI="nbd+unix:///$VOL?socket=$DIR/e.sock"
fill --ioengine=nbd --uri="$URI"
R1=$(start_replica r1)
PIDS+=("$(cat "$DIR/r1.pid")")
timed_add full "$R1"

echo "running: ironhorn delta rebuild (1/16 of the volume rewritten while away)..." >&2
kill -9 "$(cat "$DIR/r1.pid")"
fio --name=away --rw=randwrite --bs=1M --iodepth=8 --size="$SIZE" --io_size=$((BYTES / 16)) \
    --ioengine=nbd --uri="$URI" >/dev/null 2>&1
"$BIN/ironhorn-engine" replica remove --engine "$E" --replica "$R1" >/dev/null
R1=$(start_replica r1 keep)
PIDS+=("$(cat "$DIR/r1.pid")")
timed_add delta "$R1"

echo "running: ironhorn full rebuild limited to $LIMIT MiB/s..." >&2
"$BIN/ironhorn-engine" rebuild-rate --engine "$E" --mib-per-sec "$LIMIT" >/dev/null
R2=$(start_replica r2)
PIDS+=("$(cat "$DIR/r2.pid")")
timed_add limited "$R2"
"$BIN/ironhorn-engine" rebuild-rate --engine "$E" --mib-per-sec 0 >/dev/null

echo
echo "Making a $SIZE volume whole: volume MiB per second of wall time (copied = bytes that moved)"
echo
echo "| method | seconds | copied MiB | volume MiB/s | ×dd | ×nbdcopy |"
echo "|---|---:|---:|---:|---:|---:|"
dd_rate=$(awk -v m="$MIB" -v s="${SECS[dd]}" 'BEGIN { print m / s }')
nc_rate=$(awk -v m="$MIB" -v s="${SECS[nbdcopy]}" 'BEGIN { print m / s }')
for key in dd nbdcopy full delta limited; do
  case $key in
    dd) name="dd, O_DIRECT 1 MiB";; nbdcopy) name="nbdcopy, nbdkit → nbdkit";;
    full) name="ironhorn full rebuild";; delta) name="ironhorn delta rebuild";;
    limited) name="ironhorn full rebuild, limit $LIMIT MiB/s";;
  esac
  awk -v n="$name" -v s="${SECS[$key]}" -v c="${COPIED[$key]}" -v m="$MIB" -v d="$dd_rate" -v k="$nc_rate" \
    'BEGIN { r = m / s; printf "| %s | %.2f | %d | %.0f | %.2f | %.2f |\n", n, s, c / 1048576, r, r / d, r / k }'
done

echo
echo "aims:"
aim "4. full rebuild / nbdcopy" "$(awk -v m="$MIB" -v s="${SECS[full]}" -v k="$nc_rate" 'BEGIN { print m / s / k }')" ">=" 0.9
# The rebuild's own start and end (the engine's status), not the CLI's round trips.
limited_rate=$(awk -v c="${COPIED[limited]}" -v ms="${RB_MS[limited]}" 'BEGIN { print c / 1048576 / (ms / 1000) }')
echo "limited rebuild: $(awk -v r="$limited_rate" 'BEGIN { printf "%.1f", r }') MiB/s copied over the rebuild's own duration"
aim "4. limited rebuild: |MiB/s copied / $LIMIT - 1|" "$(awk -v r="$limited_rate" -v l="$LIMIT" 'BEGIN { d = r / l - 1; print d < 0 ? -d : d }')" "<=" 0.10
