// Wire-compatibility test: the upstream kubelet device plugin API package
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) plays the kubelet against
// the real `gpusched agent` binary with the fake backend.
package agent

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, status.Errorf(codes.InvalidArgument, "version %q", req.Version)
	}
	r.got <- req
	return &pluginapi.Empty{}, nil
}

func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

func agentBinary(t *testing.T) string {
	bin := os.Getenv("GPUSCHED_BIN")
	if bin == "" {
		t.Skip("GPUSCHED_BIN not set (run e2e/agent/run.sh)")
	}
	return bin
}

// kubelet starts a Registration server on <dir>/kubelet.sock.
func kubelet(t *testing.T, dir string) (*registrar, *grpc.Server) {
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	r := &registrar{got: make(chan *pluginapi.RegisterRequest, 16)}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, r)
	go func() { _ = s.Serve(l) }()
	return r, s
}

func waitRegister(t *testing.T, r *registrar, d time.Duration) *pluginapi.RegisterRequest {
	select {
	case req := <-r.got:
		return req
	case <-time.After(d):
		t.Fatalf("no Register within %v", d)
		return nil
	}
}

func dial(t *testing.T, path string) pluginapi.DevicePluginClient {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func nodeUUIDs(t *testing.T, bin, node string) []string {
	out, err := exec.Command(bin, "agent", "--backend", "fake", "--node-file", node, "--discover-only").Output()
	if err != nil {
		t.Fatalf("discover-only: %v", err)
	}
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "gpu" {
			ids = append(ids, f[2])
		}
	}
	return ids
}

func TestAgentAgainstUpstreamKubeletAPI(t *testing.T) {
	bin := agentBinary(t)
	root := repoRoot(t)
	node := filepath.Join(root, "fixtures", "nodes", "dgx-h100.yaml")
	dir, err := os.MkdirTemp("", "gpa")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	reg, srv := kubelet(t, dir)
	defer srv.Stop()
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin, "agent",
		"--backend", "fake", "--node-file", node, "--control-file", control,
		"--plugin-dir", dir, "--metrics-address", "", "--feature-file", "",
		"--pass-device-specs", "--cdi-enabled", "--quiet-period", "1s")
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()

	req := waitRegister(t, reg, 10*time.Second)
	if req.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("resource %q", req.ResourceName)
	}
	if req.Options == nil || !req.Options.GetPreferredAllocationAvailable {
		t.Fatalf("options %+v", req.Options)
	}
	sock := filepath.Join(dir, req.Endpoint)
	c := dial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("options: %v %+v", err, opts)
	}

	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 8 {
		t.Fatalf("%d devices", len(first.Devices))
	}
	ids := make([]string, 0, 8)
	numa := map[string]int64{}
	for _, d := range first.Devices {
		if d.Health != pluginapi.Healthy {
			t.Fatalf("device %s health %q", d.ID, d.Health)
		}
		if d.Topology == nil || len(d.Topology.Nodes) != 1 {
			t.Fatalf("device %s topology %+v", d.ID, d.Topology)
		}
		ids = append(ids, d.ID)
		numa[d.ID] = d.Topology.Nodes[0].ID
	}
	if want := nodeUUIDs(t, bin, node); fmt.Sprint(want) != fmt.Sprint(ids) {
		t.Fatalf("ids %v, discover-only says %v", ids, want)
	}

	// Preferred allocation: 4 of 8 on an NVSwitch node stay on one NUMA node.
	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs:   ids,
			MustIncludeDeviceIDs: []string{ids[5]},
			AllocationSize:       4,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := pref.ContainerResponses[0].DeviceIDs
	if len(got) != 4 {
		t.Fatalf("preferred %v", got)
	}
	hasMust := false
	for _, id := range got {
		if numa[id] != 1 {
			t.Fatalf("preferred %v crosses NUMA nodes", got)
		}
		hasMust = hasMust || id == ids[5]
	}
	if !hasMust {
		t.Fatalf("preferred %v lacks must_include %s", got, ids[5])
	}

	// Allocate.
	alloc, err := c.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[0], ids[1]}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cr := alloc.ContainerResponses[0]
	if v := cr.Envs["NVIDIA_VISIBLE_DEVICES"]; v != ids[0]+","+ids[1] {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q", v)
	}
	paths := map[string]bool{}
	for _, d := range cr.Devices {
		paths[d.HostPath] = d.Permissions == "rw"
	}
	for _, p := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1"} {
		if !paths[p] {
			t.Fatalf("device spec %s missing: %+v", p, cr.Devices)
		}
	}
	if len(cr.CdiDevices) != 2 || cr.CdiDevices[0].Name != "nvidia.com/gpu="+ids[0] {
		t.Fatalf("cdi %+v", cr.CdiDevices)
	}

	// Bad requests get gRPC errors.
	_, err = c.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope"}}},
	})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown id: %v", err)
	}

	// Fault injection: an XID reaches the kubelet's stream, then recovery.
	start := time.Now()
	f, err := os.OpenFile(control, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "xid 2 79\n")
	f.Close()
	upd, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("health update after %v", time.Since(start))
	for _, d := range upd.Devices {
		want := pluginapi.Healthy
		if d.ID == ids[2] {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Fatalf("after xid: %s is %s", d.ID, d.Health)
		}
	}
	upd, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range upd.Devices {
		if d.Health != pluginapi.Healthy {
			t.Fatalf("after quiet period: %s is %s", d.ID, d.Health)
		}
	}

	// Kubelet restart: sockets deleted, new kubelet.sock → Register again.
	srv.Stop()
	os.Remove(sock)
	os.Remove(filepath.Join(dir, "kubelet.sock"))
	restart := time.Now()
	reg2, srv2 := kubelet(t, dir)
	defer srv2.Stop()
	req2 := waitRegister(t, reg2, 2*time.Second)
	if took := time.Since(restart); took > time.Second {
		t.Fatalf("re-registration took %v", took)
	} else {
		t.Logf("re-registered %v after kubelet restart", took)
	}
	if _, err := os.Stat(filepath.Join(dir, req2.Endpoint)); err != nil {
		t.Fatalf("socket not recreated: %v", err)
	}

	// SIGTERM: clean exit, socket removed.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent exit: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not stop on SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(dir, req2.Endpoint)); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}
