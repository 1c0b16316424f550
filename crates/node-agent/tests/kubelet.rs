//! The agent against a fake kubelet over real unix sockets.

mod common;

use common::*;
use gpusched_model::topology::{GpuTopo, set_cost};
use gpusched_node_agent::api;
use gpusched_node_agent::backend::fake::FakeBackend;
use gpusched_node_agent::config::{MigStrategy, Replication};
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};
use tonic::Code;

const SOCK: &str = "gpusched-nvidia.com-gpu.sock";

fn uuids(node: &str) -> Vec<String> {
    FakeBackend::from_file(&fixture(node), None)
        .unwrap()
        .inventory_ref()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect()
}

fn topos(node: &str) -> Vec<GpuTopo> {
    FakeBackend::from_file(&fixture(node), None)
        .unwrap()
        .inventory_ref()
        .gpus
        .iter()
        .map(|g| g.topo)
        .collect()
}

fn health_of(l: &api::ListAndWatchResponse) -> HashMap<String, String> {
    l.devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

fn brute_min(t: &[GpuTopo], avail: &[usize], k: usize) -> u64 {
    gpusched_model::topology::exhaustive_min_cost(t, avail, k).expect("at most 24 candidates")
}

#[tokio::test]
async fn registers_and_lists_devices() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let agent = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, SOCK);
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    let opts = reg.options.unwrap();
    assert!(opts.get_preferred_allocation_available);
    assert!(!opts.pre_start_required);

    let mut c = k.client(&reg.endpoint).await;
    let o = c.get_device_plugin_options(api::Empty {}).await.unwrap();
    assert!(o.into_inner().get_preferred_allocation_available);
    let mut s = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    let ids = uuids("dgx-h100.yaml");
    assert_eq!(first.devices.len(), 8);
    for (d, u) in first.devices.iter().zip(&ids) {
        assert_eq!(&d.id, u);
        assert_eq!(d.health, "Healthy");
    }
    // NUMA: GPUs 0-3 on node 0, 4-7 on node 1.
    let numa: Vec<i64> = first
        .devices
        .iter()
        .map(|d| d.topology.as_ref().unwrap().nodes[0].id)
        .collect();
    assert_eq!(numa, vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let pre = c
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: vec![ids[0].clone()],
        })
        .await;
    assert!(pre.is_ok());

    agent.shutdown().await.unwrap();
    assert!(
        !dir.path().join(SOCK).exists(),
        "socket removed on shutdown"
    );
}

#[tokio::test]
async fn health_change_reaches_the_stream_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    std::fs::write(&control, "").unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let mut st = settings(dir.path(), "pcie-l40s.yaml");
    st.control_file = Some(control.clone());
    st.quiet_period = Duration::from_millis(400);
    let agent = start_agent(st);
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    let mut c = k.client(&reg.endpoint).await;
    let mut s = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    let ids = uuids("pcie-l40s.yaml");
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));

    let append = |line: &str| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&control)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    };

    // An application XID changes nothing.
    append("xid 3 13");
    assert!(
        next_list(&mut s, Duration::from_millis(300))
            .await
            .is_none()
    );

    // A real XID: device 3 goes unhealthy, quickly.
    let t0 = Instant::now();
    append("xid 3 79");
    let upd = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    let latency = t0.elapsed();
    eprintln!("health change -> ListAndWatch latency: {latency:?}");
    assert!(latency < Duration::from_millis(500), "{latency:?}");
    let h = health_of(&upd);
    assert_eq!(h[&ids[3]], "Unhealthy");
    assert_eq!(h.values().filter(|v| *v == "Healthy").count(), 7);

    // Unhealthy devices are refused by Allocate.
    let e = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![ids[3].clone()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("unhealthy"), "{}", e.message());

    // Clean for the quiet period: offered again.
    let t1 = Instant::now();
    let upd = next_list(&mut s, Duration::from_secs(3)).await.unwrap();
    assert!(t1.elapsed() >= Duration::from_millis(250));
    assert_eq!(health_of(&upd)[&ids[3]], "Healthy");

    // Forced unhealthy holds past the quiet period until released.
    append(&format!("unhealthy {} maintenance", ids[5]));
    let upd = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    assert_eq!(health_of(&upd)[&ids[5]], "Unhealthy");
    assert!(
        next_list(&mut s, Duration::from_millis(700))
            .await
            .is_none()
    );
    append("healthy 5");
    let upd = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    assert_eq!(health_of(&upd)[&ids[5]], "Healthy");

    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn allocate_contents_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let mut st = settings(dir.path(), "dgx-h100.yaml");
    st.pass_device_specs = true;
    st.cdi_enabled = true;
    let agent = start_agent(st);
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    let mut c = k.client(&reg.endpoint).await;
    let ids = uuids("dgx-h100.yaml");
    let req = |sets: Vec<Vec<String>>| api::AllocateRequest {
        container_requests: sets
            .into_iter()
            .map(|d| api::ContainerAllocateRequest { devices_ids: d })
            .collect(),
    };
    let r = c
        .allocate(req(vec![
            vec![ids[1].clone(), ids[2].clone()],
            vec![ids[7].clone()],
        ]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.container_responses.len(), 2);
    let a = &r.container_responses[0];
    assert_eq!(
        a.envs["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", ids[1], ids[2])
    );
    let devs: Vec<(&str, &str, &str)> = a
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    assert!(devs.contains(&("/dev/nvidiactl", "/dev/nvidiactl", "rw")));
    assert!(devs.contains(&("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw")));
    assert!(devs.contains(&("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools", "rw")));
    assert!(devs.contains(&("/dev/nvidia1", "/dev/nvidia1", "rw")));
    assert!(devs.contains(&("/dev/nvidia2", "/dev/nvidia2", "rw")));
    assert!(!devs.iter().any(|d| d.0 == "/dev/nvidia7"));
    let cdi: Vec<&str> = a.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        cdi,
        vec![
            format!("nvidia.com/gpu={}", ids[1]),
            format!("nvidia.com/gpu={}", ids[2])
        ]
    );
    assert_eq!(
        r.container_responses[1].envs["NVIDIA_VISIBLE_DEVICES"],
        ids[7]
    );

    for (bad, code, needle) in [
        (
            vec!["GPU-does-not-exist".to_string()],
            Code::InvalidArgument,
            "unknown device id",
        ),
        (
            vec![ids[0].clone(), ids[0].clone()],
            Code::InvalidArgument,
            "twice",
        ),
        (vec![], Code::InvalidArgument, "no device ids"),
    ] {
        let e = c.allocate(req(vec![bad])).await.unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
        assert!(e.message().contains(needle), "{}", e.message());
    }
    let e = c.allocate(req(vec![])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    agent.shutdown().await.unwrap();
}

async fn preferred(
    c: &mut api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    avail: &[String],
    must: &[String],
    size: i32,
) -> Result<Vec<String>, tonic::Status> {
    c.get_preferred_allocation(api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: avail.to_vec(),
            must_include_device_i_ds: must.to_vec(),
            allocation_size: size,
        }],
    })
    .await
    .map(|r| r.into_inner().container_responses[0].device_i_ds.clone())
}

#[tokio::test]
async fn preferred_allocation_is_optimal() {
    for node in ["dgx-h100.yaml", "pcie-l40s.yaml"] {
        let dir = tempfile::tempdir().unwrap();
        let k = FakeKubelet::start(dir.path()).await;
        let agent = start_agent(settings(dir.path(), node));
        let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
        let mut c = k.client(&reg.endpoint).await;
        let ids = uuids(node);
        let t = topos(node);
        let idx = |picked: &[String]| -> Vec<usize> {
            let mut v: Vec<usize> = picked
                .iter()
                .map(|p| ids.iter().position(|u| u == p).unwrap())
                .collect();
            v.sort_unstable();
            v
        };
        // All free, and with holes.
        for avail in [
            (0..8).collect::<Vec<usize>>(),
            vec![0, 2, 3, 5, 6, 7],
            vec![1, 4, 5, 6],
        ] {
            let av: Vec<String> = avail.iter().map(|&i| ids[i].clone()).collect();
            for size in 1..=avail.len() {
                let got = preferred(&mut c, &av, &[], size as i32).await.unwrap();
                assert_eq!(got.len(), size);
                let g = idx(&got);
                assert_eq!(
                    set_cost(&t, &g),
                    brute_min(&t, &avail, size),
                    "{node} avail {avail:?} size {size}: got {g:?}"
                );
            }
        }
        // Concrete expectations.
        let all: Vec<String> = ids.clone();
        let got = idx(&preferred(&mut c, &all, &[], 4).await.unwrap());
        assert_eq!(got, vec![0, 1, 2, 3], "{node}: one NUMA node / switch");
        let got = idx(&preferred(&mut c, &all, &[ids[6].clone()], 2).await.unwrap());
        assert!(got.contains(&6), "{node}: must_include honoured");
        let best = (0..8)
            .filter(|&j| j != 6)
            .map(|j| set_cost(&t, &[j, 6]))
            .min()
            .unwrap();
        assert_eq!(set_cost(&t, &got), best, "{node}: best partner for 6");
        // Malformed.
        let e = preferred(&mut c, &all, &[], 0).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = preferred(&mut c, &all[..2], &[], 3).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = preferred(&mut c, &all[..2], &[ids[5].clone()], 1)
            .await
            .unwrap_err();
        assert!(e.message().contains("must_include"), "{}", e.message());
        let e = preferred(&mut c, &["nope".into()], &[], 1)
            .await
            .unwrap_err();
        assert!(e.message().contains("unknown device id"), "{}", e.message());
        agent.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn kubelet_restart_reregisters_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut k = FakeKubelet::start(dir.path()).await;
    let agent = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    let _ = k.next_registration(Duration::from_secs(5)).await;
    for round in 0..2 {
        let t = k.restart().await;
        let (at, reg) = k.next_registration(Duration::from_secs(2)).await;
        let took = at.duration_since(t);
        eprintln!("kubelet restart {round}: re-registered after {took:?}");
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(dir.path().join(&reg.endpoint).exists());
        let mut c = k.client(&reg.endpoint).await;
        let mut s = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
        let l = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
        assert_eq!(l.devices.len(), 8);
    }
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn kubelet_down_for_a_while_then_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut k = FakeKubelet::start(dir.path()).await;
    let agent = start_agent(settings(dir.path(), "pcie-l40s.yaml"));
    let _ = k.next_registration(Duration::from_secs(5)).await;
    // The kubelet dies, leaving a stale kubelet.sock; registration attempts
    // fail for a while (the agent must keep its retry interval short).
    k.crash();
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::remove_file(dir.path().join(SOCK)).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = k.restart().await;
    let (at, reg) = k.next_registration(Duration::from_secs(3)).await;
    let took = at.duration_since(t);
    eprintln!("kubelet back after an outage: re-registered after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(reg.endpoint, SOCK);
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn mixed_mig_serves_one_socket_per_resource() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let mut st = settings(dir.path(), "mig-a100.yaml");
    st.mig_strategy = MigStrategy::Mixed;
    let agent = start_agent(st);
    let mut got = HashMap::new();
    for _ in 0..3 {
        let (_, r) = k.next_registration(Duration::from_secs(5)).await;
        got.insert(r.resource_name.clone(), r.endpoint.clone());
    }
    let mut names: Vec<&String> = got.keys().collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-3g.40gb"
        ]
    );
    let counts = [
        ("nvidia.com/gpu", 6),
        ("nvidia.com/mig-1g.10gb", 7),
        ("nvidia.com/mig-3g.40gb", 2),
    ];
    for (name, n) in counts {
        let mut c = k.client(&got[name]).await;
        let mut s = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
        let l = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
        assert_eq!(l.devices.len(), n, "{name}");
        if name.contains("mig") {
            assert!(l.devices.iter().all(|d| d.id.starts_with("MIG-")));
            let r = c
                .allocate(api::AllocateRequest {
                    container_requests: vec![api::ContainerAllocateRequest {
                        devices_ids: vec![l.devices[0].id.clone()],
                    }],
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(
                r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
                l.devices[0].id
            );
        }
    }
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn time_slicing_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let mut st = settings(dir.path(), "pcie-l40s.yaml");
    st.replication = vec![Replication {
        name: "nvidia.com/gpu".into(),
        replicas: 4,
        advertised: "nvidia.com/gpu.shared".into(),
    }];
    st.fail_requests_greater_than_one = true;
    let agent = start_agent(st);
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu.shared");
    let mut c = k.client(&reg.endpoint).await;
    let mut s = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    let l = next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    assert_eq!(l.devices.len(), 32);
    let ids = uuids("pcie-l40s.yaml");
    assert_eq!(l.devices[1].id, format!("{}::1", ids[0]));
    let e = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![l.devices[0].id.clone(), l.devices[1].id.clone()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("too large"), "{}", e.message());
    let r = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![l.devices[5].id.clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        ids[1]
    );
    agent.shutdown().await.unwrap();
}

async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

#[tokio::test]
async fn metrics_probes_and_feature_labels() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let control = dir.path().join("control");
    std::fs::write(&control, "").unwrap();
    let features = dir.path().join("features.d/gpusched");
    let mut st = settings(dir.path(), "dgx-h100.yaml");
    st.metrics_address = Some(addr.clone());
    st.feature_file = Some(features.clone());
    st.control_file = Some(control.clone());
    // No kubelet yet: alive but not ready.
    let agent = start_agent(st);
    let mut code = 0;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(&addr).await.is_ok() {
            code = http_get(&addr, "/readyz").await.0;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(code, 503);
    assert_eq!(http_get(&addr, "/healthz").await.0, 200);
    let k = FakeKubelet::start(dir.path()).await;
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    let mut ready = false;
    for _ in 0..50 {
        if http_get(&addr, "/readyz").await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready);

    // An XID and an allocation show up in /metrics.
    let ids = uuids("dgx-h100.yaml");
    let mut c = k.client(&reg.endpoint).await;
    c.allocate(api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec![ids[0].clone()],
        }],
    })
    .await
    .unwrap();
    let mut s = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    std::fs::write(&control, "xid 1 48\n").unwrap();
    next_list(&mut s, Duration::from_secs(2)).await.unwrap();
    let (code, body) = http_get(&addr, "/metrics").await;
    assert_eq!(code, 200);
    let line = |name: &str, gpu: &str| {
        body.lines()
            .find(|l| l.starts_with(name) && l.contains(gpu))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("{name} for {gpu} missing in\n{body}"))
    };
    assert_eq!(line("gpusched_agent_gpu_healthy{", &ids[1]), "0");
    assert_eq!(line("gpusched_agent_gpu_healthy{", &ids[0]), "1");
    assert_eq!(line("gpusched_agent_gpu_xid_errors_total{", &ids[1]), "1");
    assert_eq!(line("gpusched_agent_gpu_allocated{", &ids[0]), "1");
    assert_eq!(line("gpusched_agent_gpu_allocated{", &ids[2]), "0");
    assert!(body.contains("gpusched_agent_gpu_memory_total_bytes{"));
    assert!(body.contains("gpusched_agent_registrations_total{resource=\"nvidia.com/gpu\"} 1"));

    let labels = std::fs::read_to_string(&features).unwrap();
    for want in [
        "nvidia.com/gpu.count=8",
        "nvidia.com/gpu.product=H100-SXM5-80GB",
        "nvidia.com/gpu.memory=81920",
        "nvidia.com/gpu.replicas=1",
        "nvidia.com/gpu.sharing-strategy=none",
        "nvidia.com/mig.capable=true",
        "gpusched.io/gpu.interconnect=nvswitch",
        "gpusched.io/gpu.numa-nodes=2",
    ] {
        assert!(labels.contains(want), "{want} missing in\n{labels}");
    }
    assert_eq!(http_get(&addr, "/nope").await.0, 404);
    agent.shutdown().await.unwrap();
}
