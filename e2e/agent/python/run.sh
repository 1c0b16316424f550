#!/usr/bin/env bash
# The agent against Python grpcio (a gRPC client that is not grpc-go, like
# C++ clients and older kubelets): GetDevicePluginOptions, ListAndWatch and
# Allocate over the plugin socket with the socket path as `:authority`.
# Needs python3 with venv (Debian: python3-venv). Stubs are generated from
# our .proto at run time. GPUSCHED_BIN may point at a prebuilt binary.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
if [[ -z "${GPUSCHED_BIN:-}" ]]; then
  (cd "$root" && cargo build -q -p gpusched-node-agent --bin gpusched-node-agent)
  GPUSCHED_BIN="$target/debug/gpusched-node-agent"
fi
venv="${GPUSCHED_PY_VENV:-$target/e2e-python-venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null \
  || "$venv/bin/pip" install -q 'grpcio>=1.60' 'grpcio-tools>=1.60'
stubs="$(mktemp -d)"
trap 'rm -rf "$stubs"' EXIT
"$venv/bin/python" -m grpc_tools.protoc -I "$root/crates/node-agent/proto" \
  --python_out="$stubs" --grpc_python_out="$stubs" deviceplugin_v1beta1.proto
echo "e2e/agent/python: grpcio $("$venv/bin/python" -c 'import grpc; print(grpc.__version__)') against $GPUSCHED_BIN"
"$venv/bin/python" "$here/client.py" "$GPUSCHED_BIN" "$root" "$stubs"
