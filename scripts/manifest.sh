#!/usr/bin/env bash
# Writes deploy/ironhorn.yaml: the hand-written deploy/install.yaml followed
# by the CRDs generated from manager/src/crd.rs (also kept alone in
# deploy/crds.yaml). manager/tests/manifests.rs fails when either drifts.
set -euo pipefail
cd "$(dirname "$0")/.."
crds=$(cargo run -q -p ironhorn-manager --bin ironhorn -- crds)
printf '%s\n' "$crds" > deploy/crds.yaml
{ cat deploy/install.yaml; printf '%s\n' "$crds"; } > deploy/ironhorn.yaml
echo "wrote deploy/ironhorn.yaml and deploy/crds.yaml"
