# Shared by the bench scripts (sourced, not run). Before sourcing, set
# BENCH (the script's name, for messages), DIR (a fresh directory), SIZE
# and TOOLS (the commands the script needs). Gives: the release binaries
# in BIN, PIDS (killed, with DIR removed, on exit), STORE_SIZE,
# wait_listen, layout, fill and aim, and LOCAL: the arguments that put
# engines and replicas on one node's local sockets (LOCAL_SOCKETS=1; TCP
# on loopback otherwise).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
for tool in $TOOLS; do
  command -v "$tool" >/dev/null || { echo "$BENCH: $tool is missing (apt-get install fio nbdkit libnbd-bin jq)" >&2; exit 1; }
done
cargo build --release --bins -q
BIN=target/release
mkdir -p "$DIR"
PIDS=()
LOCAL=()
if [ "${LOCAL_SOCKETS:-0}" = 1 ]; then
  LOCAL=(--local-sockets "$DIR/sockets")
  echo "engine to replicas: unix sockets (every replica on the engine's node; LOCAL_SOCKETS=1)"
else
  echo "engine to replicas: TCP on loopback, as to replicas on other nodes (LOCAL_SOCKETS=1: same-node sockets)"
fi
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

# Physical size of a replica's store: the volume plus a quarter (the
# replica's default) plus room for its journal, in MiB.
STORE_SIZE=$(( ( $(numfmt --from=iec "$SIZE") * 5 / 4 + (72 << 20) ) >> 20 ))M

wait_listen() { # logfile -> the address the process printed
  for _ in $(seq 1 200); do
    if grep -q '^listening on' "$1" 2>/dev/null; then sed -n 's/^listening on //p' "$1" | head -1; return; fi
    sleep 0.05
  done
  echo "$BENCH: process did not start (see $1)" >&2; exit 1
}

# Lays a file out before use, as fio does with its own files: the first
# write to a hole in a sparse file costs filesystem allocation, which an
# LVM-backed store never pays.
layout() { # file size
  fio --name=layout --filename="$1" --rw=write --bs=1M --size="$2" --ioengine=psync --zero_buffers >/dev/null 2>&1 \
    || { echo "$BENCH: could not write $2 to $1 (df: $(df -h --output=avail "$(dirname "$1")" | tail -1) free)" >&2; exit 1; }
}

# Writes SIZE bytes sequentially to a target given as fio arguments; fio's
# default buffers are random, so nothing is skipped as zeroes.
fill() {
  local out
  out=$(fio --name=fill --rw=write --bs=1M --iodepth=8 --size="$SIZE" "$@" 2>&1) \
    || { echo "$BENCH: filling $* failed: $out" >&2; exit 1; }
}

# Prints one aim of issue 16 as met (✓) or not (✗): aim TEXT VALUE OP BOUND,
# OP being ">=" or "<=".
aim() { # text value op bound
  awk -v t="$1" -v v="$2" -v op="$3" -v b="$4" 'BEGIN {
    ok = (op == ">=") ? (v >= b) : (v <= b)
    printf "%s %s: %.2f (aim %s %.2f)\n", ok ? "✓" : "✗", t, v, op, b }'
}
