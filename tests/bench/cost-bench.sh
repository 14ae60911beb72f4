#!/usr/bin/env bash
# What one 4 KiB write costs the processes that serve it: 3 replicas, QD32
# random writes over NBD, and for the engine and for one replica the CPU
# time, system calls and context switches per request (`perf stat -p` over
# the run). CPU per request is what bounds 3-replica IOPS on a small node
# (aim 3 of issue 16): three replicas and an engine share its cores.
#
#   tests/bench/cost-bench.sh       (env: SIZE=512M RUNTIME=8 RW=randwrite QD=32 DIR=/var/tmp)
set -euo pipefail
SIZE=${SIZE:-512M}
RUNTIME=${RUNTIME:-8}
RW=${RW:-randwrite}
QD=${QD:-32}
DIR=${DIR:-/var/tmp}/ironhorn-cost-bench-$$
BENCH=cost-bench TOOLS="fio jq perf"
source "$(dirname "$0")/common.sh"
VOL=cost$$
EVENTS=raw_syscalls:sys_enter,context-switches,task-clock

args=() rpids=()
for i in 0 1 2; do
  layout "$DIR/r$i.img" "$STORE_SIZE"
  "$BIN/ironhorn-replica" serve --store "file:$DIR/r$i.img" --size "$SIZE"iB --listen 127.0.0.1:0 "${LOCAL[@]}" \
      >"$DIR/r$i.out" 2>"$DIR/r$i.log" &
  PIDS+=($!) rpids+=($!)
  args+=(--replica "$(wait_listen "$DIR/r$i.out")")
done
"$BIN/ironhorn-engine" serve --volume "$VOL" --size "$SIZE"iB --epoch 1 --listen 127.0.0.1:0 \
    --nbd "unix:$DIR/e.sock" "${LOCAL[@]}" "${args[@]}" >"$DIR/e.out" 2>"$DIR/e.log" &
engine=$!
PIDS+=("$engine")
wait_listen "$DIR/e.out" >/dev/null
uri="nbd+unix:///$VOL?socket=$DIR/e.sock"
fill --ioengine=nbd --uri="$uri"

echo "running: $RW, iodepth $QD, ${RUNTIME}s, with perf stat on the engine and replica 1..." >&2
perf stat -x, -e "$EVENTS" -p "${rpids[0]}" -o "$DIR/replica.stat" -- sleep "$RUNTIME" &
stat_r=$!
perf stat -x, -e "$EVENTS" -p "$engine" -o "$DIR/engine.stat" -- sleep "$RUNTIME" &
stat_e=$!
ios=$(fio --name=cost --ioengine=nbd --uri="$uri" --rw="$RW" --bs=4k --iodepth="$QD" --runtime="$RUNTIME" \
        --time_based --size="$SIZE" --output-format=json 2>/dev/null | sed -n '/^{/,$p' \
      | jq '.jobs[0].write.total_ios + .jobs[0].read.total_ios')
wait "$stat_r" "$stat_e"
[ "$ios" -gt 0 ] || { echo "$BENCH: fio completed no I/O" >&2; exit 1; }

per_request() { # stat file -> "cpu_us syscalls switches"
  awk -F, -v n="$ios" '
    $3 ~ /task-clock/ { cpu = $1 * 1000 / n }
    $3 ~ /sys_enter/ { sys = $1 / n }
    $3 ~ /context-switches/ { cs = $1 / n }
    END { printf "%.1f %.2f %.2f", cpu, sys, cs }' "$1"
}
echo
echo "4 KiB $RW, iodepth $QD, 3 replicas over NBD: $((ios / RUNTIME)) IOPS; per request:"
echo
echo "| process | CPU µs | system calls | context switches |"
echo "|---|---:|---:|---:|"
for who in engine replica; do
  read -r cpu sys cs <<<"$(per_request "$DIR/$who.stat")"
  echo "| $who | $cpu | $sys | $cs |"
done
