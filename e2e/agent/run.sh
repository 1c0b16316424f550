#!/usr/bin/env bash
# Wire-compatibility test of `gpusched agent` against the upstream kubelet
# device plugin API (k8s.io/kubelet). Builds the agent, then runs go test.
# GPUSCHED_BIN may point at a prebuilt binary (gpusched or gpusched-node-agent).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
if [[ -z "${GPUSCHED_BIN:-}" ]]; then
  # Prefer the main binary once `agent` is wired into it; otherwise the
  # agent crate's own binary (same code, same flags).
  (cd "$root" && cargo build -q -p gpusched-node-agent --bin gpusched-node-agent)
  GPUSCHED_BIN="$target/debug/gpusched-node-agent"
  if (cd "$root" && cargo build -q -p gpusched --bin gpusched 2>/dev/null) \
     && "$target/debug/gpusched" agent --help >/dev/null 2>&1; then
    GPUSCHED_BIN="$target/debug/gpusched"
  fi
fi
export GPUSCHED_BIN
echo "e2e/agent: using $GPUSCHED_BIN"
cd "$here"
GOFLAGS="${GOFLAGS:--mod=mod}" go test -count=1 -v ./...
