// fakecri serves a CRI runtime and image service on a unix socket for a real
// kubelet in the end-to-end tests. It is the upstream fake runtime
// (k8s.io/cri-client/pkg/fake, which keeps sandboxes and containers in
// memory and runs nothing) plus what the tests need:
//
//   - every created container's full config (env, devices, mounts, CDI
//     devices, labels, annotations) and its pod's identity is written as
//     JSON to <record-dir>/<container id>.json (written to a temporary name
//     and renamed, so a reader never sees half a file);
//   - a container whose env has FAKECRI_EXIT_AFTER_MS=<ms> exits that many
//     milliseconds after it starts, with FAKECRI_EXIT_CODE (default 0): init
//     containers and pods that run to completion;
//   - images have a size and the image filesystem is a real directory, as
//     the kubelet's image garbage collector and eviction manager expect;
//   - containers report their log path (an empty file is created there,
//     under --var-log when the kubelet's /var/log is elsewhere);
//   - the runtime reports the cgroupfs driver.
//
// Usage: fakecri --listen /path/cri.sock --record-dir DIR [--var-log DIR]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// runtime is the upstream fake with CreateContainer and StartContainer
// wrapped; every other call goes to the fake unchanged.
type runtime struct {
	*fake.RemoteRuntime
	recordDir string
	// where the kubelet's /var/log is on this side ("" if the same)
	varLog string

	mu sync.Mutex
	// env of each created container, for FAKECRI_EXIT_AFTER_MS at start.
	env map[string]map[string]string
}

// record is what a test reads back for one container.
type record struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	Pod       podRef `json:"pod"`
	// Env is the config's envs as text (the CRI carries values as bytes,
	// which the protobuf JSON of Config shows in base64).
	Env       map[string]string `json:"env"`
	Config    json.RawMessage   `json:"config"`
	CreatedAt string            `json:"createdAt"`
}

type podRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	Attempt   uint32 `json:"attempt"`
}

func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	id := resp.ContainerId
	// The log path a real runtime reports. Without it the kubelet, when it
	// removes a container, globs "<log path>*" = "*" in its working
	// directory and deletes what it finds there.
	logPath := ""
	if dir, rel := req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath(); dir != "" && rel != "" {
		logPath = filepath.Join(dir, rel)
	}
	s := r.RuntimeService
	s.Lock()
	if c, ok := s.Containers[id]; ok {
		c.LogPath = logPath
	}
	s.Unlock()
	// An empty log file where the kubelet looks for it (it rotates and
	// reads container logs), through --var-log when its /var/log is
	// elsewhere on our side.
	if logPath != "" && r.varLog != "" && strings.HasPrefix(logPath, "/var/log/") {
		f := filepath.Join(r.varLog, strings.TrimPrefix(logPath, "/var/log/"))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err == nil {
			if fh, err := os.OpenFile(f, os.O_CREATE|os.O_WRONLY, 0o640); err == nil {
				fh.Close()
			}
		}
	}
	env := map[string]string{}
	for _, kv := range req.GetConfig().GetEnvs() {
		env[kv.GetKey()] = string(kv.GetValue())
	}
	r.mu.Lock()
	r.env[id] = env
	r.mu.Unlock()
	if err := r.write(id, req, env); err != nil {
		// A config the tests cannot read would make them fail later with
		// a less clear message; fail the call instead.
		return nil, fmt.Errorf("fakecri: recording container %s: %w", id, err)
	}
	return resp, nil
}

func (r *runtime) write(id string, req *runtimeapi.CreateContainerRequest, env map[string]string) error {
	cfg, err := protojson.Marshal(req.GetConfig())
	if err != nil {
		return err
	}
	md := req.GetSandboxConfig().GetMetadata()
	rec := record{
		ID:        id,
		SandboxID: req.GetPodSandboxId(),
		Pod: podRef{
			Name:      md.GetName(),
			Namespace: md.GetNamespace(),
			UID:       md.GetUid(),
			Attempt:   md.GetAttempt(),
		},
		Env:       env,
		Config:    cfg,
		CreatedAt: time.Now().UTC().Format(time.RFC3339Nano),
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(r.recordDir, "."+id+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.recordDir, id+".json"))
}

func (r *runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	resp, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	id := req.GetContainerId()
	r.mu.Lock()
	env := r.env[id]
	r.mu.Unlock()
	if v, ok := env["FAKECRI_EXIT_AFTER_MS"]; ok {
		ms, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("fakecri: container %s: FAKECRI_EXIT_AFTER_MS=%q is not a number of milliseconds", id, v)
		}
		code := int64(0)
		if c, ok := env["FAKECRI_EXIT_CODE"]; ok {
			if code, err = strconv.ParseInt(c, 10, 32); err != nil {
				return nil, fmt.Errorf("fakecri: container %s: FAKECRI_EXIT_CODE=%q is not an integer", id, c)
			}
		}
		go r.exitLater(id, time.Duration(ms)*time.Millisecond, int32(code))
	}
	return resp, nil
}

// exitLater marks a running container exited, as a process that ended.
func (r *runtime) exitLater(id string, after time.Duration, code int32) {
	time.Sleep(after)
	s := r.RuntimeService
	s.Lock()
	defer s.Unlock()
	c, ok := s.Containers[id]
	if !ok || c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	c.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.FinishedAt = time.Now().UnixNano()
	c.ExitCode = code
	if code == 0 {
		c.Reason = "Completed"
	} else {
		c.Reason = "Error"
	}
}

func main() {
	listen := flag.String("listen", "", "unix socket path to serve CRI on")
	recordDir := flag.String("record-dir", "", "directory for the created containers' configs (<id>.json)")
	varLog := flag.String("var-log", "", "the kubelet's /var/log as seen from here (when it runs in another mount namespace)")
	flag.Parse()
	if *listen == "" || *recordDir == "" {
		log.Fatal("fakecri: --listen and --record-dir are required")
	}
	if err := os.MkdirAll(*recordDir, 0o755); err != nil {
		log.Fatalf("fakecri: %v", err)
	}
	imageFs := filepath.Join(*recordDir, "..", "fakecri-images")
	if err := os.MkdirAll(imageFs, 0o755); err != nil {
		log.Fatalf("fakecri: %v", err)
	}
	imageFs, _ = filepath.Abs(imageFs)

	rr := fake.NewFakeRemoteRuntime()
	rt := &runtime{RemoteRuntime: rr, recordDir: *recordDir, varLog: *varLog, env: map[string]map[string]string{}}
	rr.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	rr.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	rr.ImageService.SetFakeImageSize(64 << 20)
	usage := func() []*runtimeapi.FilesystemUsage {
		return []*runtimeapi.FilesystemUsage{{
			Timestamp:  time.Now().UnixNano(),
			FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: imageFs},
			UsedBytes:  &runtimeapi.UInt64Value{Value: 64 << 20},
			InodesUsed: &runtimeapi.UInt64Value{Value: 64},
		}}
	}
	rr.ImageService.SetFakeFilesystemUsage(usage())
	rr.ImageService.SetFakeContainerFilesystemUsage(usage())

	l, err := util.CreateListener("unix://" + *listen)
	if err != nil {
		log.Fatalf("fakecri: %v", err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	runtimeapi.RegisterImageServiceServer(srv, rt)

	// The fakes log every call in a slice that only grows; a kubelet
	// polls several times a second, so trim it now and then.
	go func() {
		for range time.Tick(10 * time.Second) {
			rr.RuntimeService.Lock()
			rr.RuntimeService.Called = rr.RuntimeService.Called[:0]
			rr.RuntimeService.Unlock()
			rr.ImageService.Lock()
			rr.ImageService.Called = rr.ImageService.Called[:0]
			rr.ImageService.Unlock()
			rr.ImageService.SetFakeFilesystemUsage(usage())
			rr.ImageService.SetFakeContainerFilesystemUsage(usage())
		}
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		srv.Stop()
		os.Remove(*listen)
		os.Exit(0)
	}()
	log.Printf("fakecri: serving CRI on %s, recording containers in %s", *listen, *recordDir)
	if err := srv.Serve(l); err != nil {
		log.Fatalf("fakecri: %v", err)
	}
}
