#!/usr/bin/env bash
# Builds ironhorn and runs it on this machine with an embedded default:
# for now one replica serving a 1 GiB volume from a file store under ./data.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins
mkdir -p data
listen="${IRONHORN_LISTEN:-127.0.0.1:9500}"
echo "ironhorn replica: store file:data/replica-0.img (1 GiB), gRPC on $listen"
echo "reach it with any gRPC client using proto/proto/replica.proto, e.g. the"
echo "ironhorn.replica.v1.Replica/Info call; Ctrl-C closes the store cleanly."
exec target/release/ironhorn-replica serve --store file:data/replica-0.img --size 1GiB --listen "$listen"
