"""Drives `gpusched agent` (fake backend) with Python grpcio, a gRPC client
that is not grpc-go: over unix sockets it sends the socket path (or, since
gRPC C-core 1.57, the percent-encoded path) as `:authority`, which the h2
server behind tonic refuses unless the agent normalises it.

Usage: client.py AGENT_BIN REPO_ROOT STUBS_DIR
Exits non-zero on the first failure.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc

agent_bin, root, stubs = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, stubs)
import deviceplugin_v1beta1_pb2 as pb  # noqa: E402
import deviceplugin_v1beta1_pb2_grpc as pbg  # noqa: E402


def main() -> int:
    work = tempfile.mkdtemp(prefix="gpusched-py-")
    node = os.path.join(root, "fixtures", "nodes", "dgx-h100.yaml")
    agent = subprocess.Popen(
        [agent_bin, "agent", "--backend", "fake", "--node-file", node,
         "--plugin-dir", work, "--metrics-address", "", "--feature-file", ""],
        stdout=sys.stderr, stderr=sys.stderr)
    sock = os.path.join(work, "gpusched-nvidia.com-gpu.sock")
    try:
        deadline = time.time() + 20
        while not os.path.exists(sock):
            if time.time() > deadline or agent.poll() is not None:
                print("FAIL: the agent did not create its socket", file=sys.stderr)
                return 1
            time.sleep(0.05)
        # No kubelet.sock: the agent serves while it retries registration.
        cases = [
            ("grpcio default authority", []),
            ("socket path", [("grpc.default_authority", sock)]),
            ("unix:// URI", [("grpc.default_authority", "unix://" + sock)]),
        ]
        passed = failed = 0
        for name, opts in cases:
            try:
                check(sock, opts)
                print(f"ok   {name}")
                passed += 1
            except grpc.RpcError as e:
                print(f"FAIL {name}: {e.code()} {e.details()}")
                failed += 1
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()


def check(sock: str, opts) -> None:
    with grpc.insecure_channel("unix:" + sock, options=opts) as ch:
        c = pbg.DevicePluginStub(ch)
        o = c.GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert o.get_preferred_allocation_available, o
        stream = c.ListAndWatch(pb.Empty(), timeout=5)
        first = next(stream)
        stream.cancel()
        ids = [d.ID for d in first.devices]
        assert len(ids) == 8 and all(d.health == "Healthy" for d in first.devices), first
        r = c.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids[:2])]), timeout=5)
        env = r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
        assert env == ",".join(ids[:2]), env
        # A refused request still gets its proper code.
        try:
            c.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]), timeout=5)
            raise AssertionError("unknown id accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise


if __name__ == "__main__":
    sys.exit(main())
