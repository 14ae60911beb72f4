#!/usr/bin/env bash
# Scale on `ironhorn up` (issue 16, aim 5), one run: VOLUMES volumes of three
# replicas created at once on three simulated nodes, ATTACH of them
# attached. Prints the time from the first create to every replica running
# and to every attached volume healthy, the manager's CPU per reconcile
# pass, the idle CPU of every ironhorn process, and the resident memory of
# each engine and replica process, with a ✓ or ✗ per aim (RSS ≤ 20 MiB per
# engine and per replica process). Then one node's instance manager is
# frozen (SIGSTOP) and one more volume is attached elsewhere: its attach
# time against an attach with every node answering.
#
#   tests/bench/scale-bench.sh     (env: VOLUMES=100 ATTACH=20 SIZE=16M
#                                   IDLE=30 PORT=10000 DIR=/var/tmp)
# As root (LVM on loop devices). Everything it made is removed on exit:
# `up` is stopped by its pid and `ironhorn purge` removes its VGs and
# loop devices.
set -euo pipefail
VOLUMES=${VOLUMES:-100}
ATTACH=${ATTACH:-20}
SIZE=${SIZE:-16M}
IDLE=${IDLE:-30}
PORT=${PORT:-10000}
DIR=${DIR:-/var/tmp}/ironhorn-scale-bench-$$
BENCH=scale-bench TOOLS="jq curl"
source "$(dirname "$0")/common.sh"
[ "$(id -u)" -eq 0 ] || { echo "$BENCH: needs root (LVM on loop devices)" >&2; exit 1; }
(( ATTACH + 2 <= VOLUMES )) || { echo "$BENCH: VOLUMES must be at least ATTACH + 2" >&2; exit 1; }
API=http://127.0.0.1:$PORT
export IRONHORN_API=$API
cli() { "$BIN/ironhorn" "$@"; }
UP=
stop_up() {
  if [ -n "$UP" ]; then
    kill -CONT "$(im_pid 3)" 2>/dev/null || true
    kill "$UP" 2>/dev/null || true
    wait "$UP" 2>/dev/null || true
    "$BIN/ironhorn" purge --data-dir "$DIR/data" >/dev/null 2>&1 || true
  fi
  cleanup
}
trap stop_up EXIT

im_pid() { cat "$DIR/data/nodes/n-$1/im.pid"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# Every process of the cluster: up, the instance managers, their children.
cluster_pids() {
  echo "$UP"
  local im
  for n in 1 2 3; do
    im=$(im_pid "$n")
    echo "$im"
    for stat in /proc/[0-9]*/stat; do
      # ppid is field 4 (the name in field 2 has no spaces here).
      [ "$(awk '{ print $4 }' "$stat" 2>/dev/null)" = "$im" ] && basename "$(dirname "$stat")"
    done
  done
}
kind_of() { basename "$(readlink "/proc/$1/exe" 2>/dev/null)"; }
cpu_ticks() { # pids... -> utime+stime summed
  local sum=0 t
  for p in "$@"; do
    t=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)
    sum=$((sum + t))
  done
  echo "$sum"
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
metric() { curl -s "$API/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
wait_for() { # seconds what command...
  local deadline=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@"; do
    (( $(date +%s) < deadline )) || { echo "$BENCH: timed out after $1 s waiting for $what" >&2; exit 1; }
    sleep 0.5
  done
}

# Room for every replica's store on each node, with slack.
disk=$(( ( $(numfmt --from=iec "$STORE_SIZE") * VOLUMES * 11 / 10 >> 30 ) + 2 ))GiB
# One port per replica and engine on a node: every volume has a replica on
# each of the three nodes.
"$BIN/ironhorn" up --data-dir "$DIR/data" --nodes 3 --port-base "$PORT" --ports-per-node $((VOLUMES + 100)) \
    --disk-size "$disk" \
    >"$DIR/up.log" 2>&1 &
UP=$!
nodes_ready() {
  [ "$(cli node list -o json 2>/dev/null | jq '[.[] | select(.status.conditions[]? | .type == "Ready" and .status == "True")] | length')" = 3 ]
}
wait_for 120 "three nodes ready" nodes_ready

echo "creating $VOLUMES volumes of $SIZE, 3 replicas each, attaching $ATTACH..." >&2
t0=$(now)
for i in $(seq 1 "$VOLUMES"); do
  cli volume create "v$i" --size "${SIZE}iB" --replicas 3 >/dev/null
done
created=$(since "$t0")
# All attaches asked at once (each CLI waits for its volume).
attaches=()
for i in $(seq 1 "$ATTACH"); do
  cli volume attach "v$i" --node "n-$(( (i - 1) % 3 + 1 ))" --timeout-secs 1800 >/dev/null 2>"$DIR/attach-$i.log" &
  attaches+=($!)
done
replicas_running() {
  [ "$(cli replica list -o json | jq '[.[] | select(.status.currentState == "running")] | length')" = $((3 * VOLUMES)) ]
}
attached_healthy() {
  [ "$(cli volume list -o json | jq '[.[] | select(.status.state == "attached" and .status.robustness == "healthy")] | length')" = "$ATTACH" ]
}
wait_for 1800 "every replica running" replicas_running
all_running=$(since "$t0")
for a in "${attaches[@]}"; do wait "$a" || { echo "$BENCH: an attach failed (see $DIR/attach-*.log)" >&2; exit 1; }; done
wait_for 1800 "every attached volume healthy" attached_healthy
all_healthy=$(since "$t0")

echo "idle for ${IDLE}s..." >&2
sleep 5 # let the last status writes settle
mapfile -t pids < <(cluster_pids)
hz=$(getconf CLK_TCK)
passes0=$(metric ironhorn_manager_reconcile_passes_total)
busy0=$(metric ironhorn_manager_reconcile_seconds_total)
up0=$(cpu_ticks "$UP")
all0=$(cpu_ticks "${pids[@]}")
sleep "$IDLE"
up1=$(cpu_ticks "$UP")
all1=$(cpu_ticks "${pids[@]}")
passes1=$(metric ironhorn_manager_reconcile_passes_total)
busy1=$(metric ironhorn_manager_reconcile_seconds_total)

engines=() replicas=()
for p in "${pids[@]}"; do
  case "$(kind_of "$p")" in
    ironhorn-engine) engines+=("$p") ;;
    ironhorn-replica) replicas+=("$p") ;;
  esac
done
rss_stats() { # pids... -> "max mean" in MiB
  for p in "$@"; do rss_kib "$p"; done | awk '{ s += $1; if ($1 > m) m = $1 } END { printf "%.1f %.1f", m / 1024, s / NR / 1024 }'
}
read -r eng_max eng_mean <<<"$(rss_stats "${engines[@]}")"
read -r rep_max rep_mean <<<"$(rss_stats "${replicas[@]}")"
im_rss=$(for n in 1 2 3; do rss_kib "$(im_pid "$n")"; done | awk '{ s += $1 } END { printf "%.1f", s / NR / 1024 }')
up_rss=$(awk -v k="$(rss_kib "$UP")" 'BEGIN { printf "%.1f", k / 1024 }')

# One node's instance manager frozen: another volume attached on n-1 (its
# third replica is on the frozen node) against one attached with every
# node answering.
attach_time() { # volume node
  local t; t=$(now)
  cli volume attach "$1" --node "$2" >/dev/null 2>&1
  one_attached() { [ "$(cli volume get "$1" -o json | jq -r '.status.state')" = attached ]; }
  wait_for 300 "$1 attached" one_attached "$1"
  since "$t"
}
normal=$(attach_time "v$((ATTACH + 1))" n-1)
kill -STOP "$(im_pid 3)"
frozen=$(attach_time "v$((ATTACH + 2))" n-1)
kill -CONT "$(im_pid 3)"

ok() { awk -v v="$1" -v l="$2" 'BEGIN { print (v <= l) ? "✓" : "✗" }'; }
echo
echo "Scale on \`ironhorn up\`: $VOLUMES volumes × 3 replicas of $SIZE on 3 nodes, $ATTACH attached"
echo
echo "| figure | value | aim |"
echo "|---|---:|:---:|"
echo "| ${VOLUMES} creates answered | ${created} s | |"
echo "| first create → every replica running | ${all_running} s | |"
echo "| first create → $ATTACH attached volumes healthy | ${all_healthy} s | |"
awk -v p0="$passes0" -v p1="$passes1" -v b0="$busy0" -v b1="$busy1" -v u0="$up0" -v u1="$up1" -v hz="$hz" -v idle="$IDLE" 'BEGIN {
  n = p1 - p0
  printf "| reconcile passes in %d s idle | %d (%.2f s each) | |\n", idle, n, n ? (b1 - b0) / n : 0
  printf "| manager (`up`) CPU per pass | %.0f ms | |\n", n ? (u1 - u0) * 1000 / hz / n : 0
}'
awk -v a0="$all0" -v a1="$all1" -v hz="$hz" -v idle="$IDLE" -v n="${#pids[@]}" 'BEGIN {
  printf "| idle CPU of all %d processes | %.1f %% of one core | |\n", n, (a1 - a0) * 100 / hz / idle
}'
echo "| engine RSS, max / mean of ${#engines[@]} | ${eng_max} / ${eng_mean} MiB | $(ok "$eng_max" 20) |"
echo "| replica RSS, max / mean of ${#replicas[@]} | ${rep_max} / ${rep_mean} MiB | $(ok "$rep_max" 20) |"
echo "| instance manager RSS, mean | ${im_rss} MiB | |"
echo "| manager (\`up\`) RSS | ${up_rss} MiB | |"
echo "| attach, every node answering | ${normal} s | |"
echo "| attach, n-3's instance manager frozen | ${frozen} s | $(awk -v f="$frozen" -v n="$normal" 'BEGIN { print (f <= 2 * n + 2) ? "✓" : "✗" }') |"
