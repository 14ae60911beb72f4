#!/usr/bin/env bash
# QD1 4 KiB random-write latency and where it goes: nbdkit's file plugin
# (the peer) and ironhorn with 1 and 3 replicas, each with busy polling off
# (IRONHORN_POLL_US=0) and on, side by side in one run. For every ironhorn
# row it counts the context switches (voluntary + involuntary, all threads)
# and the CPU time of the engine and of its replicas per request: the
# wake-ups that aim 2 of issue 16 is about.
#
#   tests/bench/qd1-bench.sh            (env: SIZE=256M RUNTIME=5 DIR=/var/tmp)
set -euo pipefail
SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-5}
DIR=${DIR:-/var/tmp}/ironhorn-qd1-bench-$$
BENCH=qd1-bench TOOLS="fio nbdkit jq"
source "$(dirname "$0")/common.sh"
VOL=qd$$
HZ=$(getconf CLK_TCK)

switches() { # pids... -> context switches of all their threads
  local t=0 p f
  for p in "$@"; do
    for f in /proc/"$p"/task/*/status; do
      t=$((t + $(awk '/ctxt_switches/ { s += $2 } END { print s + 0 }' "$f")))
    done
  done
  echo "$t"
}
ticks() { # pids... -> user + system clock ticks
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' /proc/"$p"/stat))); done
  echo "$t"
}
qd1() { # fio target args... -> "latency_us ios"
  fio --name=q --rw=randwrite --bs=4k --iodepth=1 --runtime="$RUNTIME" --time_based --randrepeat=0 \
      --size="$SIZE" --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p' \
    | jq -r '.jobs[0].write | "\(.clat_ns.mean / 1000) \(.total_ios)"'
}

echo "running: nbdkit file plugin over NBD..." >&2
layout "$DIR/nbdkit.img" "$SIZE"
nbdkit --foreground --unix "$DIR/nbdkit.sock" --exit-with-parent file "$DIR/nbdkit.img" cache=none &
PIDS+=($!)
for _ in $(seq 1 100); do [ -S "$DIR/nbdkit.sock" ] && break; sleep 0.05; done
read -r nk_lat _ <<<"$(qd1 --ioengine=nbd --uri="nbd+unix:///?socket=$DIR/nbdkit.sock")"

ROWS=()
for replicas in 1 3; do
  for poll in 0 on; do
    name=r$replicas-$poll
    env=()
    [ "$poll" = 0 ] && env=(IRONHORN_POLL_US=0)
    echo "running: ironhorn, $replicas replica(s), polling $poll..." >&2
    args=() rpids=()
    for i in $(seq 1 "$replicas"); do
      layout "$DIR/$name-$i.img" "$STORE_SIZE"
      env "${env[@]}" "$BIN/ironhorn-replica" serve --store "file:$DIR/$name-$i.img" --size "$SIZE"iB \
          --listen 127.0.0.1:0 "${LOCAL[@]}" >"$DIR/$name-$i.out" 2>"$DIR/$name-$i.log" &
      PIDS+=($!) rpids+=($!)
      args+=(--replica "$(wait_listen "$DIR/$name-$i.out")")
    done
    env "${env[@]}" "$BIN/ironhorn-engine" serve --volume "$VOL$name" --size "$SIZE"iB --epoch 1 \
        --listen 127.0.0.1:0 --nbd "unix:$DIR/$name.sock" "${args[@]}" "${LOCAL[@]}" >"$DIR/$name.out" 2>"$DIR/$name.log" &
    epid=$!
    PIDS+=($epid)
    wait_listen "$DIR/$name.out" >/dev/null
    uri="nbd+unix:///$VOL$name?socket=$DIR/$name.sock"
    fill --ioengine=nbd --uri="$uri"
    e0=$(switches "$epid") r0=$(switches "${rpids[@]}") et0=$(ticks "$epid") rt0=$(ticks "${rpids[@]}")
    read -r lat ios <<<"$(qd1 --ioengine=nbd --uri="$uri")"
    e1=$(switches "$epid") r1=$(switches "${rpids[@]}") et1=$(ticks "$epid") rt1=$(ticks "${rpids[@]}")
    ROWS+=("$(awk -v n="$replicas" -v p="$poll" -v l="$lat" -v k="$nk_lat" -v i="$ios" -v hz="$HZ" \
        -v es=$((e1 - e0)) -v rs=$((r1 - r0)) -v et=$((et1 - et0)) -v rt=$((rt1 - rt0)) 'BEGIN {
      printf "| %d | %s | %.1f | %+.1f | %.2f | %.2f | %.0f | %.0f |", n, p, l, l - k, es / i, rs / i / n,
        et / hz * 1e6 / i, rt / hz * 1e6 / i / n }')")
  done
done

echo
echo "QD1 4 KiB random write, size $SIZE, ${RUNTIME}s per row; nbdkit: $(printf '%.1f' "$nk_lat") µs"
echo "(switches and CPU are per request; a replica's are the mean over the volume's replicas)"
echo
echo "| replicas | polling | µs | over nbdkit µs | engine switches | replica switches | engine CPU µs | replica CPU µs |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
