#!/usr/bin/env bash
# Side-by-side benchmark, one run: fio io_uring on a raw file; nbdkit's file
# plugin over NBD (the peer); ironhorn with 1 and 3 replicas over NBD;
# ironhorn's block device. 4 KiB random read/write IOPS at iodepth 32 and
# QD1 write latency, as a table with ratios to raw and to nbdkit; then the
# CPU that idle engine and replica processes use.
#
#   tests/bench/engine-bench.sh            (env: SIZE=1G RUNTIME=10 DIR=/var/tmp)
set -euo pipefail
SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-10}
DIR=${DIR:-/var/tmp}/ironhorn-bench-$$
BENCH=engine-bench TOOLS="fio nbdkit jq"
source "$(dirname "$0")/common.sh"
VOL=bench$$

# measure TARGET-ARGS... : prints "randread_iops randwrite_iops qd1_write_lat_us qd1_read_lat_us"
fio_job() { # rw iodepth target-args...
  local rw=$1 qd=$2; shift 2
  fio --name=b --rw="$rw" --bs=4k --iodepth="$qd" --runtime="$RUNTIME" --time_based --randrepeat=0 \
      --size="$SIZE" --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p'
}
measure() { # target-args...
  local r w l lr
  r=$(fio_job randread 32 "$@" | jq '.jobs[0].read.iops')
  w=$(fio_job randwrite 32 "$@" | jq '.jobs[0].write.iops')
  l=$(fio_job randwrite 1 "$@" | jq '.jobs[0].write.clat_ns.mean / 1000')
  lr=$(fio_job randread 1 "$@" | jq '.jobs[0].read.clat_ns.mean / 1000')
  printf '%.0f %.0f %.1f %.1f\n' "$r" "$w" "$l" "$lr"
}

start_replica() { # name; appends "--replica ADDRESS" to REPLICA_ARGS
  layout "$DIR/$1.img" "$STORE_SIZE"
  "$BIN/ironhorn-replica" serve --store "file:$DIR/$1.img" --size "$SIZE"iB --listen 127.0.0.1:0 >"$DIR/$1.out" 2>"$DIR/$1.log" &
  PIDS+=($!)
  REPLICA_ARGS+=(--replica "$(wait_listen "$DIR/$1.out")")
}
start_engine() { # name epoch extra-args... (replica args included)
  local name=$1; shift
  "$BIN/ironhorn-engine" serve --volume "$VOL$name" --size "$SIZE"iB --epoch 1 --listen 127.0.0.1:0 \
      --nbd "unix:$DIR/$name.sock" "$@" >"$DIR/$name.out" 2>"$DIR/$name.log" &
  PIDS+=($!)
  wait_listen "$DIR/$name.out" >/dev/null
}

declare -A RESULT
echo "running: raw file (fio io_uring, O_DIRECT)..." >&2
fill --filename="$DIR/raw.img" --ioengine=io_uring --direct=1
RESULT[raw]=$(measure --filename="$DIR/raw.img" --ioengine=io_uring --direct=1)

echo "running: nbdkit file plugin over NBD..." >&2
fill --filename="$DIR/nbdkit.img" --ioengine=io_uring --direct=1
nbdkit --foreground --unix "$DIR/nbdkit.sock" --exit-with-parent file "$DIR/nbdkit.img" cache=none &
PIDS+=($!)
for _ in $(seq 1 100); do [ -S "$DIR/nbdkit.sock" ] && break; sleep 0.05; done
RESULT[nbdkit]=$(measure --ioengine=nbd --uri="nbd+unix:///?socket=$DIR/nbdkit.sock")

echo "running: ironhorn, 1 replica, NBD..." >&2
REPLICA_ARGS=()
start_replica one-r0
start_engine one "${REPLICA_ARGS[@]}"
fill --ioengine=nbd --uri="nbd+unix:///${VOL}one?socket=$DIR/one.sock"
RESULT[one]=$(measure --ioengine=nbd --uri="nbd+unix:///${VOL}one?socket=$DIR/one.sock")

echo "running: ironhorn, 3 replicas, NBD..." >&2
REPLICA_ARGS=()
for i in 0 1 2; do start_replica three-r$i; done
start_engine three "${REPLICA_ARGS[@]}"
fill --ioengine=nbd --uri="nbd+unix:///${VOL}three?socket=$DIR/three.sock"
RESULT[three]=$(measure --ioengine=nbd --uri="nbd+unix:///${VOL}three?socket=$DIR/three.sock")

echo "running: ironhorn, 3 replicas, block device..." >&2
REPLICA_ARGS=()
for i in 0 1 2; do start_replica bd-r$i; done
start_engine bd "${REPLICA_ARGS[@]}" --blockdev
fill --filename="/dev/ironhorn/${VOL}bd" --ioengine=io_uring --direct=1
RESULT[bd]=$(measure --filename="/dev/ironhorn/${VOL}bd" --ioengine=io_uring --direct=1)

echo "measuring idle CPU of the ironhorn processes for 5 s..." >&2
ticks() { local t=0; for p in "${PIDS[@]}"; do
  [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
sleep 1
t0=$(ticks); sleep 5; t1=$(ticks)
hz=$(getconf CLK_TCK)
idle_cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="${#PIDS[@]}" 'BEGIN { printf "%.2f", 100 * d / hz / 5 }')

read -r raw_r raw_w raw_l <<<"${RESULT[raw]}"
read -r nk_r nk_w nk_l <<<"${RESULT[nbdkit]}"
echo
echo "4 KiB random I/O, iodepth 32 (IOPS) and QD1 write latency; size $SIZE, ${RUNTIME}s per run"
echo
echo "| target | randread IOPS | ×raw | ×nbdkit | randwrite IOPS | ×raw | ×nbdkit | QD1 write µs | QD1 read µs |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for key in raw nbdkit one three bd; do
  case $key in
    raw) name="raw file, fio io_uring";; nbdkit) name="nbdkit file plugin, NBD";;
    one) name="ironhorn 1 replica, NBD";; three) name="ironhorn 3 replicas, NBD";;
    bd) name="ironhorn 3 replicas, blockdev";;
  esac
  read -r rr ww ll lr <<<"${RESULT[$key]}"
  awk -v n="$name" -v r="$rr" -v w="$ww" -v l="$ll" -v lr="$lr" -v rr="$raw_r" -v rw="$raw_w" -v nr="$nk_r" -v nw="$nk_w" \
    'BEGIN { printf "| %s | %d | %.2f | %.2f | %d | %.2f | %.2f | %.1f | %.1f |\n", n, r, r/rr, r/nr, w, w/rw, w/nw, l, lr }'
done

# The aims of issue 16, each a ratio against a baseline of this run.
read -r one_r one_w one_l one_lr <<<"${RESULT[one]}"
read -r th_r th_w th_l th_lr <<<"${RESULT[three]}"
read -r bd_r bd_w bd_l bd_lr <<<"${RESULT[bd]}"
echo
echo "aims:"
aim "1. block device / NBD, 3 replicas, randread QD32 IOPS" "$(awk -v a="$bd_r" -v b="$th_r" 'BEGIN{print a/b}')" ">=" 0.9
aim "1. block device / NBD, 3 replicas, randwrite QD32 IOPS" "$(awk -v a="$bd_w" -v b="$th_w" 'BEGIN{print a/b}')" ">=" 0.9
aim "1. block device / NBD, 3 replicas, QD1 read (NBD µs / block device µs)" "$(awk -v a="$th_lr" -v b="$bd_lr" 'BEGIN{print a/b}')" ">=" 0.9
aim "1. block device / NBD, 3 replicas, QD1 write (NBD µs / block device µs)" "$(awk -v a="$th_l" -v b="$bd_l" 'BEGIN{print a/b}')" ">=" 0.9
aim "2. QD1 write µs over nbdkit's, 1 replica" "$(awk -v a="$one_l" -v b="$nk_l" 'BEGIN{print a-b}')" "<=" 50
aim "2. QD1 write µs over nbdkit's, 3 replicas" "$(awk -v a="$th_l" -v b="$nk_l" 'BEGIN{print a-b}')" "<=" 80
aim "3. 3 replicas randwrite / nbdkit" "$(awk -v a="$th_w" -v b="$nk_w" 'BEGIN{print a/b}')" ">=" 0.9
awk -v a="$th_w" -v r="$raw_w" 'BEGIN { printf "   (3 replicas share this disk: randwrite is %.2f of raw/3, the physical ceiling)\n", a/(r/3) }'
echo
echo "idle: ${#PIDS[@]} processes (engines, replicas, nbdkit) used ${idle_cpu}% of one CPU together over 5 s"
