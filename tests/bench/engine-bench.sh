#!/usr/bin/env bash
# Side-by-side benchmark, one run: fio io_uring on a raw file; nbdkit's file
# plugin over NBD (the peer); ironhorn with 1 and 3 replicas over NBD;
# the 3-replica engine's block device. Each job runs on every target in
# turn. 4 KiB random read/write IOPS at iodepth 32 and
# QD1 write latency, as a table with ratios to raw and to nbdkit; what the
# disk gives three writers at once (the ceiling 3 replicas on it meet);
# then the CPU that idle engine and replica processes use.
#
#   tests/bench/engine-bench.sh     (env: SIZE=1G RUNTIME=10 ROUNDS=3 DIR=/var/tmp)
set -euo pipefail
SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-10}
DIR=${DIR:-/var/tmp}/ironhorn-bench-$$
BENCH=engine-bench TOOLS="fio nbdkit jq"
source "$(dirname "$0")/common.sh"
VOL=bench$$

fio_job() { # rw iodepth target-args...
  local rw=$1 qd=$2; shift 2
  fio --name=b --rw="$rw" --bs=4k --iodepth="$qd" --runtime="$RUNTIME" --time_based --randrepeat=0 \
      --size="$SIZE" --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p'
}

start_replica() { # name; appends "--replica ADDRESS" to REPLICA_ARGS
  layout "$DIR/$1.img" "$STORE_SIZE"
  "$BIN/ironhorn-replica" serve --store "file:$DIR/$1.img" --size "$SIZE"iB --listen 127.0.0.1:0 "${LOCAL[@]}" >"$DIR/$1.out" 2>"$DIR/$1.log" &
  PIDS+=($!)
  REPLICA_ARGS+=(--replica "$(wait_listen "$DIR/$1.out")")
}
start_engine() { # name epoch extra-args... (replica args included)
  local name=$1; shift
  "$BIN/ironhorn-engine" serve --volume "$VOL$name" --size "$SIZE"iB --epoch 1 --listen 127.0.0.1:0 \
      --nbd "unix:$DIR/$name.sock" "${LOCAL[@]}" "$@" >"$DIR/$name.out" 2>"$DIR/$name.log" &
  PIDS+=($!)
  wait_listen "$DIR/$name.out" >/dev/null
}

# What this disk gives 3 replicas that share it, measured with fio alone:
# - randwrite at iodepth 32 from three writers at once (one per file, as
#   each replica holds the volume's 32 requests), IOPS of the three
#   together divided by 3: the most a 3-replica volume can write here;
# - a QD1 write that is 3 writes at once (submitted together, reaped
#   together), mean µs: the disk's part of a 3-replica QD1 write.
disk_share() { # randwrite-iodepth -> value
  local out
  if [ "$1" = 1 ]; then
    out=$(fio --name=three --filename="$DIR/raw.img" --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k \
          --iodepth=3 --iodepth_batch_submit=3 --iodepth_batch_complete_min=3 --runtime="$RUNTIME" --time_based \
          --randrepeat=0 --size="$SIZE" --output-format=json 2>/dev/null | sed -n '/^{/,$p')
    jq '.jobs[0].write.clat_ns.mean/1000' <<<"$out"
  else
    out=$(fio --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k --iodepth="$1" --runtime="$RUNTIME" --time_based \
          --randrepeat=0 --size="$SIZE" --group_reporting --output-format=json \
          --name=w0 --filename="$DIR/raw.img" --name=w1 --filename="$DIR/raw1.img" --name=w2 --filename="$DIR/raw2.img" \
          2>/dev/null | sed -n '/^{/,$p')
    jq '.jobs[0].write.iops/3' <<<"$out"
  fi
}

# Every target is set up first; then each job runs on all of them back to
# back, so a ratio compares runs a few seconds apart, not minutes (this
# host's disk and CPU speed drift by tens of per cent over minutes). The 3
# replica rows are one engine, over NBD and over its block device: the same
# replicas, as aim 1 asks.
declare -A TARGET
echo "setting up: raw file, nbdkit, ironhorn with 1 and 3 replicas..." >&2
fill --filename="$DIR/raw.img" --ioengine=io_uring --direct=1
TARGET[raw]="--filename=$DIR/raw.img --ioengine=io_uring --direct=1"
# Two more files beside raw.img: three writers on this disk at once is
# what 3 replicas on one node ask of it (see disk_share above).
for i in 1 2; do fill --filename="$DIR/raw$i.img" --ioengine=io_uring --direct=1; done

fill --filename="$DIR/nbdkit.img" --ioengine=io_uring --direct=1
nbdkit --foreground --unix "$DIR/nbdkit.sock" --exit-with-parent file "$DIR/nbdkit.img" cache=none &
PIDS+=($!)
for _ in $(seq 1 100); do [ -S "$DIR/nbdkit.sock" ] && break; sleep 0.05; done
TARGET[nbdkit]="--ioengine=nbd --uri=nbd+unix:///?socket=$DIR/nbdkit.sock"

REPLICA_ARGS=()
start_replica one-r0
start_engine one "${REPLICA_ARGS[@]}"
TARGET[one]="--ioengine=nbd --uri=nbd+unix:///${VOL}one?socket=$DIR/one.sock"

REPLICA_ARGS=()
for i in 0 1 2; do start_replica three-r$i; done
start_engine three "${REPLICA_ARGS[@]}" --blockdev
TARGET[three]="--ioengine=nbd --uri=nbd+unix:///${VOL}three?socket=$DIR/three.sock"
TARGET[bd]="--filename=/dev/ironhorn/${VOL}three --ioengine=io_uring --direct=1"
for key in one three; do
  # shellcheck disable=SC2086
  fill ${TARGET[$key]}
done

KEYS=(raw nbdkit one three bd)
# Each job runs ROUNDS times on every target, the order of the targets
# reversed every other round (so a drift of the host over the run weighs on
# every target alike), and each figure is the median of its rounds.
ROUNDS=${ROUNDS:-3}
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
REVERSED=(); for ((i = ${#KEYS[@]} - 1; i >= 0; i--)); do REVERSED+=("${KEYS[$i]}"); done
# "JOB KEY" -> the figure of every round, space-separated.
declare -A RR RW LW LR ROUNDS_SEEN
for job in "randread 32 RR read.iops" "randwrite 32 RW write.iops" \
           "randwrite 1 LW write.clat_ns.mean/1000" "randread 1 LR read.clat_ns.mean/1000"; do
  read -r rw qd into field <<<"$job"
  echo "running: $rw, iodepth $qd, on each target, $ROUNDS rounds..." >&2
  shares=()
  for round in $(seq 1 "$ROUNDS"); do
    order=("${KEYS[@]}")
    if [ $((round % 2)) = 0 ]; then order=("${REVERSED[@]}"); fi
    for key in "${order[@]}"; do
      # shellcheck disable=SC2086
      v=$(fio_job "$rw" "$qd" ${TARGET[$key]} | jq ".jobs[0].$field")
      ROUNDS_SEEN["$rw $qd $key"]="${ROUNDS_SEEN["$rw $qd $key"]:-} $v"
    done
    case "$rw $qd" in
      "randwrite 32") shares+=("$(disk_share 32)") ;;
      "randwrite 1") shares+=("$(disk_share 1)") ;;
    esac
  done
  declare -n into_ref=$into
  for key in "${KEYS[@]}"; do into_ref[$key]=$(median <<<"${ROUNDS_SEEN["$rw $qd $key"]# }"); done
  unset -n into_ref
  case "$rw $qd" in
    "randwrite 32") SHARE_W=$(median <<<"${shares[*]}") ;;
    "randwrite 1") SHARE_L=$(median <<<"${shares[*]}") ;;
  esac
done
declare -A RESULT
for key in "${KEYS[@]}"; do
  RESULT[$key]=$(printf '%.0f %.0f %.1f %.1f' "${RR[$key]}" "${RW[$key]}" "${LW[$key]}" "${LR[$key]}")
done

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
echo "4 KiB random I/O, iodepth 32 (IOPS) and QD1 write latency; size $SIZE, ${RUNTIME}s per run, each the median of $ROUNDS rounds (every round below)"
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
awk -v s="$SHARE_L" -v r="$raw_l" -v a="$th_l" -v b="$nk_l" 'BEGIN { printf "   (the disk alone: 3 writes at once take %.1f µs, one takes %.1f, so %.1f of the %.1f are the disk'"'"'s share)\n", s, r, s - r, a - b }'
aim "3. 3 replicas randwrite / nbdkit" "$(awk -v a="$th_w" -v b="$nk_w" 'BEGIN{print a/b}')" ">=" 0.9
awk -v a="$th_w" -v r="$raw_w" -v s="$SHARE_W" 'BEGIN { printf "   (3 replicas share this disk: randwrite is %.2f of raw/3, and %.2f of what fio gets from three writers at once, %d IOPS each)\n", a/(r/3), a/s, s }'
echo
echo "every round (randread and randwrite in IOPS, QD1 in µs; a drift of the host shows as a spread):"
for job in "randread 32" "randwrite 32" "randwrite 1" "randread 1"; do
  line="  $job:"
  for key in "${KEYS[@]}"; do
    # shellcheck disable=SC2086
    line+=" $key $(printf '%.0f/' ${ROUNDS_SEEN["$job $key"]})"
    line="${line%/},"
  done
  echo "${line%,}"
done
echo
echo "idle: ${#PIDS[@]} processes (engines, replicas, nbdkit) used ${idle_cpu}% of one CPU together over 5 s"
