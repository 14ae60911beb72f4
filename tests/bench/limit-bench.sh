#!/usr/bin/env bash
# Per-volume I/O limits, one run: two engines of one replica each on this
# disk. The neighbour alone (its baseline); then both at once, the limited
# one at an IOPS limit; then its limit changed while it runs (the engine's
# SetLimits); then a bandwidth limit at 64 KiB writes (BW_RW=randread for
# reads: one bucket limits both, and on this host 64 KiB random reads of
# scattered stores ran at 17–141 MB/s from one minute to the next, so the
# read variant measured the host's disk more than the limiter). Prints each
# measured rate against its limit and the neighbour against its baseline
# (the mean of its rate alone just before and just after), and, for
# comparison, the neighbour beside the same work paced by fio itself,
# with a ✓ when the limit held within 5 % and the neighbour kept 90 % of its
# rate.
#
#   tests/bench/limit-bench.sh     (env: SIZE=512M RUNTIME=10 DIR=/var/tmp
#                                   IOPS=2000 IOPS2=500 BANDWIDTH=20M BW_RW=randwrite)
set -euo pipefail
SIZE=${SIZE:-512M}
RUNTIME=${RUNTIME:-10}
IOPS=${IOPS:-2000}
IOPS2=${IOPS2:-500}
BANDWIDTH=${BANDWIDTH:-20M}
BW_RW=${BW_RW:-randwrite}
DIR=${DIR:-/var/tmp}/ironhorn-limit-bench-$$
BENCH=limit-bench TOOLS="fio jq"
source "$(dirname "$0")/common.sh"
VOL=limit$$

start_volume() { # name extra-engine-args...: an engine over one replica; its address in ENGINE
  local name=$1; shift
  layout "$DIR/$name.img" "$STORE_SIZE"
  "$BIN/ironhorn-replica" serve --store "file:$DIR/$name.img" --size "$SIZE"iB --listen 127.0.0.1:0 \
      "${LOCAL[@]}" >"$DIR/$name-r.out" 2>"$DIR/$name-r.log" &
  PIDS+=($!)
  local replica; replica=$(wait_listen "$DIR/$name-r.out")
  "$BIN/ironhorn-engine" serve --volume "$VOL$name" --size "$SIZE"iB --epoch 1 --listen 127.0.0.1:0 \
      --nbd "unix:$DIR/$name.sock" --replica "$replica" "${LOCAL[@]}" "$@" >"$DIR/$name.out" 2>"$DIR/$name.log" &
  PIDS+=($!)
  ENGINE=$(wait_listen "$DIR/$name.out")
}
target() { echo "--ioengine=nbd --uri=nbd+unix:///$VOL$1?socket=$DIR/$1.sock"; }
# job NAME RW BS VOLUME [FIO-ARGS...]: fio in the background writing its
# JSON to DIR/NAME.json
job() {
  local name=$1 rw=$2 bs=$3 volume=$4; shift 4
  # shellcheck disable=SC2046
  fio --name="$name" --rw="$rw" --bs="$bs" --iodepth=16 --runtime="$RUNTIME" --time_based --randrepeat=0 \
      --size="$SIZE" --output-format=json $(target "$volume") "$@" >"$DIR/$name.json" 2>/dev/null &
}
iops() { sed -n '/^{/,$p' "$DIR/$1.json" | jq '.jobs[0].read.iops + .jobs[0].write.iops'; }
bw() { sed -n '/^{/,$p' "$DIR/$1.json" | jq '(.jobs[0].read.bw_bytes + .jobs[0].write.bw_bytes)'; }

start_volume limited --iops-limit "$IOPS"
limited_engine=$ENGINE
start_volume neighbour
start_volume paced
for v in limited neighbour paced; do
  # shellcheck disable=SC2046
  fill $(target $v)
done

# The neighbour's baseline is its rate alone just before and just after
# the run beside the limited volume (this disk's speed drifts between runs
# by more than the 10 % the aim allows).
echo "running: the neighbour alone..." >&2
job alone randwrite 4k neighbour; wait $!
echo "running: both, the limited one at $IOPS IOPS..." >&2
job lim randwrite 4k limited; a=$!; job nb randwrite 4k neighbour; b=$!; wait $a $b
echo "running: the neighbour alone again..." >&2
job alone_after randwrite 4k neighbour; wait $!
# The same work without the engine's limit: a volume with none, its fio
# pacing itself to the same rate. What the neighbour loses beside it is
# the cost of the work itself; beyond that, the limiter's own.
echo "running: both, the other one unlimited and fio pacing itself to $IOPS IOPS..." >&2
job self randwrite 4k paced --rate_iops="$IOPS"; a=$!; job nb_self randwrite 4k neighbour; b=$!; wait $a $b
job alone_self randwrite 4k neighbour; wait $!
echo "running: the limit changed to $IOPS2 IOPS while it runs..." >&2
"$BIN/ironhorn-engine" limits --engine "$limited_engine" --iops "$IOPS2" >/dev/null
job lim2 randread 4k limited; wait $!
echo "running: a bandwidth limit of $BANDWIDTH/s, 64 KiB $BW_RW..." >&2
"$BIN/ironhorn-engine" limits --engine "$limited_engine" --bandwidth "${BANDWIDTH}iB" >/dev/null
job alone2 "$BW_RW" 64k neighbour; wait $!
job bw "$BW_RW" 64k limited; a=$!; job nb2 "$BW_RW" 64k neighbour; b=$!; wait $a $b
job alone2_after "$BW_RW" 64k neighbour; wait $!
echo "running: both, the other one unlimited and fio pacing itself to $BANDWIDTH/s..." >&2
job bw_self "$BW_RW" 64k paced --rate="$(numfmt --from=iec "$BANDWIDTH")"; a=$!; job nb2_self "$BW_RW" 64k neighbour; b=$!; wait $a $b

bw_limit=$(numfmt --from=iec "$BANDWIDTH")
row() { # what measured limit
  awk -v w="$1" -v m="$2" -v l="$3" 'BEGIN { r = m / l; printf "| %s | %.0f | %.0f | %.3f | %s |\n", w, m, l, r, (r >= 0.95 && r <= 1.05) ? "✓" : "✗" }'
}
neighbour() { # what with alone
  awk -v w="$1" -v m="$2" -v a="$3" 'BEGIN { r = m / a; printf "| %s | %.0f | %.0f (alone) | %.3f | %s |\n", w, m, a, r, (r >= 0.9) ? "✓" : "✗" }'
}
echo
echo "Per-volume I/O limits: one replica each, iodepth 16, ${RUNTIME}s per run, size $SIZE"
echo
echo "| run | measured | limit / baseline | ratio | aim |"
echo "|---|---:|---:|---:|:---:|"
row "limited volume, 4 KiB randwrite, IOPS" "$(iops lim)" "$IOPS"
neighbour "neighbour at the same time, IOPS" "$(iops nb)" "$(( ($(iops alone | cut -d. -f1) + $(iops alone_after | cut -d. -f1)) / 2 ))"
self_base=$(( ($(iops alone_after | cut -d. -f1) + $(iops alone_self | cut -d. -f1)) / 2 ))
awk -v m="$(iops nb_self)" -v a="$self_base" -v s="$(iops self)" \
  'BEGIN { printf "| (neighbour beside fio pacing itself to the same rate, no limit: %.0f IOPS) | %.0f | %.0f (alone) | %.3f | |\n", s, m, a, m / a }'
row "limit changed live, 4 KiB randread, IOPS" "$(iops lim2)" "$IOPS2"
row "bandwidth limit, 64 KiB $BW_RW, bytes/s" "$(bw bw)" "$bw_limit"
neighbour "neighbour at the same time, bytes/s" "$(bw nb2)" "$(( ($(bw alone2) + $(bw alone2_after)) / 2 ))"
# The same load without the limiter: what sharing the disk alone costs the
# neighbour (with 64 KiB reads of stores that 4 KiB random writes have
# scattered, BW_RW=randread, the disk is the bottleneck).
awk -v m="$(bw nb2_self)" -v a="$(( ($(bw alone2) + $(bw alone2_after)) / 2 ))" -v s="$(bw bw_self)" \
  'BEGIN { printf "| (neighbour beside fio pacing itself to the same rate, no limit: %.0f bytes/s) | %.0f | %.0f (alone) | %.3f | |\n", s, m, a, m / a }'
echo
echo "neighbour alone before / after: $(iops alone | cut -d. -f1) / $(iops alone_after | cut -d. -f1) IOPS, $(bw alone2) / $(bw alone2_after) bytes/s"
