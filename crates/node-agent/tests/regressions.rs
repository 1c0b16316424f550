//! Regression tests for defects found by driving the agent with a kubelet
//! stand-in and hostile inputs (issue 10). Each is named after its bug.

mod common;

use common::*;
use gpusched_node_agent::backend::fake::FakeBackend;
use std::time::{Duration, Instant};

/// Two agents on one plugin directory took the socket from each other
/// forever (≈ 14 registrations/s, each dropping the kubelet's stream). The
/// second one must refuse to start, naming the holder, and the first must
/// keep its single registration.
#[tokio::test]
async fn two_agents_on_one_plugin_dir_livelock() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let first = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    k.next_registration(Duration::from_secs(5)).await;
    let mut second = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    let window = Duration::from_secs(2);
    let t0 = Instant::now();
    let exited = tokio::time::timeout(window, &mut second.task).await;
    // Count registrations over the whole window, whatever the second did.
    tokio::time::sleep(window.saturating_sub(t0.elapsed())).await;
    let mut n = 0u32;
    {
        let mut rx = k.registrations.lock().await;
        while rx.try_recv().is_ok() {
            n += 1;
        }
    }
    eprintln!(
        "two agents: {n} registrations in {:?} ({:.1}/s)",
        window,
        f64::from(n) / window.as_secs_f64()
    );
    match exited {
        Ok(r) => {
            let e = format!("{:#}", r.expect("agent task").unwrap_err());
            assert!(e.contains("another gpusched agent"), "{e}");
            assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        }
        Err(_) => {
            let _ = second.shutdown().await;
            panic!("the second agent kept running ({n} registrations in {window:?})");
        }
    }
    assert_eq!(n, 0, "the first agent re-registered {n} times");
    first.shutdown().await.unwrap();
}

/// Raw HTTP/2 over the plugin socket, as a gRPC client that is not grpc-go
/// speaks it: `:authority` is the socket path (C-core before 1.57, old
/// kubelets), `unix://` + path, or the percent-encoded path (C-core since
/// 1.57). h2 answered each such request with RST_STREAM(PROTOCOL_ERROR).
#[tokio::test]
async fn socket_path_authority_gets_rst_stream() {
    use loona_hpack::Decoder;
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let l = payload.len();
        let mut f = vec![(l >> 16) as u8, (l >> 8) as u8, l as u8, ty, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }
    /// An integer with an `n`-bit prefix whose high bits are `flags`.
    fn write_int(b: &mut Vec<u8>, flags: u8, n: u8, v: usize) {
        loona_hpack::encoder::encode_integer_into(v, n, flags, b).unwrap();
    }
    fn literal(b: &mut Vec<u8>, flags: u8, prefix: u8, name_index: usize, value: &[u8]) {
        write_int(b, flags, prefix, name_index);
        write_int(b, 0, 7, value.len());
        b.extend_from_slice(value);
    }
    /// A request block; `authority` None: by dynamic index 62.
    fn request(authority: Option<&[u8]>) -> Vec<u8> {
        let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
        literal(
            &mut b,
            0x00,
            4,
            4,
            b"/v1beta1.DevicePlugin/GetDevicePluginOptions",
        );
        match authority {
            // literal with incremental indexing, name :authority
            Some(a) => literal(&mut b, 0x40, 6, 1, a),
            None => b.push(0xbe),
        }
        literal(&mut b, 0x00, 4, 31, b"application/grpc"); // content-type
        b.push(0x00);
        write_int(&mut b, 0, 7, 2);
        b.extend_from_slice(b"te");
        write_int(&mut b, 0, 7, 8);
        b.extend_from_slice(b"trailers");
        b
    }

    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let agent = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    let sock = dir.path().join(&reg.endpoint);
    let path = sock.display().to_string();
    let encoded: String = path.replace('/', "%2F");
    let authorities = [path.clone(), format!("unix://{path}"), encoded];

    let mut c = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    wire.extend(frame(0x4, 0, 0, &[]));
    let mut streams = Vec::new();
    for (i, a) in authorities
        .iter()
        .map(|a| Some(a.as_bytes()))
        .chain([None])
        .enumerate()
    {
        let id = 1 + 2 * i as u32;
        streams.push(id);
        wire.extend(frame(0x1, 0x4, id, &request(a)));
        wire.extend(frame(0x0, 0x1, id, &[0, 0, 0, 0, 0])); // empty message
    }
    c.write_all(&wire).await.unwrap();

    let mut dec = Decoder::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut answered = std::collections::BTreeMap::new();
    let mut closed = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let (ty, flags) = (buf[3], buf[4]);
            let id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            let p: Vec<u8> = buf[9..9 + len].to_vec();
            buf.drain(..9 + len);
            match ty {
                0x0 => {
                    let m = api_options(&p);
                    answered.insert(id, m);
                }
                0x1 => {
                    let h = dec.decode(&p).unwrap();
                    if flags & 0x1 != 0 {
                        let status = h.iter().find(|f| f.0 == b"grpc-status");
                        assert_eq!(
                            status.map(|f| f.1.as_slice()),
                            Some(&b"0"[..]),
                            "stream {id}: {h:?}"
                        );
                        closed.insert(id);
                    }
                }
                0x3 => panic!(
                    "stream {id} (:authority {:?}) reset with code {:?}",
                    authorities.get(((id - 1) / 2) as usize),
                    &p
                ),
                0x4 if flags & 0x1 == 0 => c.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(),
                0x7 => panic!("GOAWAY {p:?}"),
                _ => {}
            }
        }
        if closed.len() == streams.len() {
            break;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline.into(), c.read(&mut chunk))
            .await
            .expect("answers in time")
            .unwrap();
        assert!(n > 0, "connection closed; answered {answered:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(answered.len(), streams.len());
    for (id, m) in &answered {
        assert!(m.get_preferred_allocation_available, "stream {id}");
    }
    fn api_options(p: &[u8]) -> gpusched_node_agent::api::DevicePluginOptions {
        assert_eq!(p[0], 0, "uncompressed");
        let n = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
        gpusched_node_agent::api::DevicePluginOptions::decode(&p[5..5 + n]).unwrap()
    }
    agent.shutdown().await.unwrap();
}

/// `replicas: 10000` on 8 GPUs made the first ListAndWatch message 5.1 MB,
/// over the 4 MiB a kubelet accepts; `100000` was accepted too.
#[test]
fn time_slicing_replicas_unbounded() {
    use gpusched_node_agent::api;
    use gpusched_node_agent::config::{ConfigFile, Settings};
    use gpusched_node_agent::plan::{MAX_DEVICES_PER_RESOURCE, build_plans};
    use prost::Message;

    let inv = FakeBackend::from_file(&fixture("dgx-h100.yaml"), None)
        .unwrap()
        .inventory_ref()
        .clone();
    let cfg = |n: u64| {
        format!(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {n}\n"
        )
    };
    let settings = |n: u64| -> Result<Settings, String> {
        let f = ConfigFile::parse(&cfg(n), std::path::Path::new("ts.yaml"))
            .map_err(|e| e.to_string())?;
        let mut s = Settings::default();
        f.apply(&mut s, "ts.yaml").map_err(|e| e.to_string())?;
        Ok(s)
    };
    // Refused at parse time: more than any node may advertise.
    let e = settings(100_000).unwrap_err();
    assert!(
        e.contains("ts.yaml") && e.contains("sharing.timeSlicing.resources[0].replicas"),
        "{e}"
    );
    // Refused once the GPU count is known: 10000 × 8 = 80000 devices.
    let e = build_plans(&inv, &settings(10_000).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sharing.timeSlicing.resources[0].replicas") && e.contains("80000"),
        "{e}"
    );
    // The largest accepted list still fits a kubelet's 4 MiB, unhealthy
    // (the longer health string) included.
    let n = (MAX_DEVICES_PER_RESOURCE / inv.gpus.len()) as u64;
    let plans = build_plans(&inv, &settings(n).unwrap()).unwrap();
    let devices = plans[0].device_list(&vec![false; inv.gpus.len()]);
    assert_eq!(devices.len(), MAX_DEVICES_PER_RESOURCE);
    let size = api::ListAndWatchResponse { devices }.encoded_len();
    eprintln!("{MAX_DEVICES_PER_RESOURCE} devices: ListAndWatch message {size} bytes");
    assert!(size < 4 * 1024 * 1024, "{size}");
}

/// `--discover-only` printed a resource error and exited 0, while serving
/// the same config exits 1.
#[test]
fn discover_only_exits_zero_after_resource_error() {
    use gpusched_node_agent::cli::{AgentArgs, run};
    use gpusched_node_agent::config::{BackendKind, MigStrategy};
    let args = |mig| AgentArgs {
        backend: Some(BackendKind::Fake),
        node_file: Some(fixture("mig-a100.yaml")),
        mig_strategy: Some(mig),
        feature_file: Some(String::new()),
        metrics_address: Some(String::new()),
        discover_only: true,
        log_format: "text".into(),
        ..Default::default()
    };
    let e = format!("{:#}", run(args(MigStrategy::Single)).unwrap_err());
    assert!(
        e.contains("mig strategy single") && e.contains("GPU 2"),
        "{e}"
    );
    run(args(MigStrategy::Mixed)).unwrap();
}

/// Errors echoed request ids whole: a 1 MB id made the status message
/// exceed gRPC metadata limits (RESOURCE_EXHAUSTED instead of
/// INVALID_ARGUMENT) and wrote a 1 MB log line.
#[tokio::test]
async fn huge_device_id_echoed_whole_in_error() {
    use gpusched_node_agent::api;
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let agent = start_agent(settings(dir.path(), "dgx-h100.yaml"));
    let (_, reg) = k.next_registration(Duration::from_secs(5)).await;
    let mut c = k.client(&reg.endpoint).await;
    let huge = "G".repeat(1 << 20);
    let e = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![huge.clone()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::InvalidArgument,
        "{}",
        e.message().len()
    );
    assert!(e.message().len() < 300, "{} bytes", e.message().len());
    assert!(e.message().contains("(1048576 bytes)"), "{}", e.message());
    let e = c
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec![huge.clone(), huge],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().len() < 300, "{} bytes", e.message().len());
    agent.shutdown().await.unwrap();
}

/// Config type errors did not name the field (`replicas: -2` → `line 6
/// column 19: invalid u32`; `ignoredXids: "13,31"` → `expected sequence
/// start`; unknown keys without their path), while value checks did.
#[test]
fn config_type_errors_do_not_name_the_field() {
    use gpusched_node_agent::config::ConfigFile;
    let err = |t: &str| {
        ConfigFile::parse(t, std::path::Path::new("agent.yaml"))
            .unwrap_err()
            .to_string()
    };
    for (text, field) in [
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: -2\n",
            "sharing.timeSlicing.resources[0].replicas",
        ),
        (
            "version: v1\nhealth:\n  ignoredXids: \"13,31\"\n",
            "health.ignoredXids",
        ),
        (
            "version: v1\nhealth: {ignoredXids: [13, x]}\n",
            "health.ignoredXids[1]",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        colour: red\n",
            "sharing.timeSlicing.resources[0].colour",
        ),
        (
            "version: v1\nplugin:\n  passDeviceSpecs: maybe\n",
            "plugin.passDeviceSpecs",
        ),
        (
            "version: v1\nplugin:\n  migStrategy: sometimes\n",
            "plugin.migStrategy",
        ),
        ("version: v1\nplugin: [1]\n", "plugin"),
        ("version: v1\nmetrics:\n  adress: x\n", "metrics.adress"),
        ("plugin: {}\n", "version"),
    ] {
        let e = err(text);
        assert!(
            e.contains("agent.yaml") && e.contains(&format!("field `{field}`")),
            "{field}: {e}"
        );
    }
    // Syntax errors have no field, but keep the file and the line.
    let e = err("version: v1\n  bad: indent\n x");
    assert!(e.contains("agent.yaml") && e.contains("line 2"), "{e}");
}

/// XID and health-transition counters had no series until their first
/// event, so `increase()` missed the first one.
#[test]
fn counters_have_no_series_until_first_event() {
    use gpusched_node_agent::agent::Agent;
    use gpusched_node_agent::backend::HealthEvent;
    let s = settings(std::path::Path::new("/nonexistent"), "pcie-l40s.yaml");
    let b = FakeBackend::from_file(&fixture("pcie-l40s.yaml"), None).unwrap();
    let uuid = b.inventory_ref().gpus[3].uuid.clone();
    let agent = Agent::new(s, std::sync::Arc::new(b)).unwrap();
    let text = agent.render_metrics();
    let zeros = |name: &str, t: &str| {
        t.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.ends_with(" 0"))
            .count()
    };
    assert_eq!(
        zeros("gpusched_agent_gpu_xid_errors_total", &text),
        8,
        "{text}"
    );
    assert_eq!(
        zeros("gpusched_agent_gpu_health_transitions_total", &text),
        8,
        "{text}"
    );
    assert_eq!(
        zeros("gpusched_agent_registrations_total", &text),
        1,
        "{text}"
    );
    assert_eq!(
        zeros("gpusched_agent_device_list_updates_total", &text),
        1,
        "{text}"
    );
    agent.on_event(
        HealthEvent::Xid {
            gpu: uuid.clone(),
            xid: 79,
        },
        Instant::now(),
    );
    let text = agent.render_metrics();
    assert_eq!(
        zeros("gpusched_agent_gpu_xid_errors_total", &text),
        7,
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("gpusched_agent_gpu_xid_errors_total{")
                && l.contains(&uuid)
                && l.ends_with(" 1")),
        "{text}"
    );
}

/// `quietPeriod: 0s` let a fault vanish in about a millisecond, before the
/// kubelet could see it.
#[test]
fn quiet_period_zero_lets_fault_vanish() {
    use gpusched_node_agent::cli::AgentArgs;
    use gpusched_node_agent::config::{BackendKind, ConfigFile, Settings};
    let f = ConfigFile::parse(
        "version: v1\nhealth:\n  quietPeriod: 0s\n",
        std::path::Path::new("q.yaml"),
    )
    .unwrap();
    let e = f
        .apply(&mut Settings::default(), "q.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("health.quietPeriod") && e.contains("1s"), "{e}");
    let e = AgentArgs {
        backend: Some(BackendKind::Fake),
        node_file: Some(fixture("pcie-l40s.yaml")),
        quiet_period: Some("999ms".into()),
        ..Default::default()
    }
    .settings()
    .unwrap_err()
    .to_string();
    assert!(e.contains("--quiet-period"), "{e}");
    let ok = AgentArgs {
        backend: Some(BackendKind::Fake),
        node_file: Some(fixture("pcie-l40s.yaml")),
        quiet_period: Some("1s".into()),
        ..Default::default()
    };
    assert_eq!(ok.settings().unwrap().quiet_period, Duration::from_secs(1));
}

/// A time-slicing entry for a MIG resource under `migStrategy: none` was
/// ignored without a warning.
#[test]
fn time_slicing_entry_for_absent_resource_ignored_silently() {
    use gpusched_node_agent::config::{ConfigFile, Settings};
    use gpusched_node_agent::plan::{build_plans, unused_replication};
    let inv = FakeBackend::from_file(&fixture("mig-a100.yaml"), None)
        .unwrap()
        .inventory_ref()
        .clone();
    let f = ConfigFile::parse(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 4\n",
        std::path::Path::new("t.yaml"),
    )
    .unwrap();
    let mut s = Settings::default();
    f.apply(&mut s, "t.yaml").unwrap();
    let plans = build_plans(&inv, &s).unwrap();
    let w = unused_replication(&plans, &s);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("sharing.timeSlicing.resources[1]")
            && w[0].contains("nvidia.com/mig-1g.10gb")
            && w[0].contains("migStrategy none"),
        "{w:?}"
    );
    s.mig_strategy = gpusched_node_agent::config::MigStrategy::Mixed;
    let plans = build_plans(&inv, &s).unwrap();
    assert!(unused_replication(&plans, &s).is_empty());
}

/// Labels were not GFD-equivalent: with `migStrategy: single` on an all-MIG
/// node the agent wrote the full GPU's count/memory/product; `mixed` had no
/// `nvidia.com/mig-<profile>.*`; `gpu.family`, `gpu.compute.*` and
/// `gpu.machine` were missing; time-slicing had no `-SHARED` product.
#[test]
fn labels_not_gfd_equivalent_for_mig_and_sharing() {
    use gpusched_node_agent::config::{MigStrategy, Replication, Settings};
    use gpusched_node_agent::labels::node_labels;
    let all_mig = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus:\n      count: 2\n      model: A100-SXM4-40GB\n      memory: 40Gi\n      devices:\n        - index: 0\n          mig: [{profile: 1g.5gb}, {profile: 1g.5gb}, {profile: 1g.5gb}]\n        - index: 1\n          mig: [{profile: 1g.5gb}, {profile: 1g.5gb}, {profile: 1g.5gb}]\n";
    let inv = FakeBackend::from_yaml(all_mig, "all-mig.yaml")
        .unwrap()
        .inventory_ref()
        .clone();
    let single = Settings {
        mig_strategy: MigStrategy::Single,
        ..Default::default()
    };
    let m = node_labels(&inv, &single);
    let want = [
        ("nvidia.com/mig.strategy", "single"),
        ("nvidia.com/gpu.product", "A100-SXM4-40GB-MIG-1g.5gb"),
        ("nvidia.com/gpu.count", "6"),
        ("nvidia.com/gpu.memory", "5120"),
        ("nvidia.com/gpu.slices.gi", "1"),
        ("nvidia.com/gpu.slices.ci", "1"),
        ("nvidia.com/gpu.family", "ampere"),
        ("nvidia.com/gpu.compute.major", "8"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/gpu.machine", "unknown"),
    ];
    for (k, v) in want {
        assert_eq!(m.get(k).map(String::as_str), Some(v), "{k}: {m:?}");
    }

    let inv = FakeBackend::from_file(&fixture("mig-a100.yaml"), None)
        .unwrap()
        .inventory_ref()
        .clone();
    let mixed = Settings {
        mig_strategy: MigStrategy::Mixed,
        ..Default::default()
    };
    let m = node_labels(&inv, &mixed);
    let want = [
        ("nvidia.com/gpu.count", "6"),
        ("nvidia.com/gpu.product", "A100-SXM4-80GB"),
        ("nvidia.com/mig-1g.10gb.count", "7"),
        ("nvidia.com/mig-1g.10gb.memory", "10240"),
        (
            "nvidia.com/mig-1g.10gb.product",
            "A100-SXM4-80GB-MIG-1g.10gb",
        ),
        ("nvidia.com/mig-3g.40gb.count", "2"),
        ("nvidia.com/mig-3g.40gb.memory", "40960"),
        ("nvidia.com/mig-3g.40gb.slices.gi", "3"),
    ];
    for (k, v) in want {
        assert_eq!(m.get(k).map(String::as_str), Some(v), "{k}: {m:?}");
    }

    let inv = FakeBackend::from_file(&fixture("dgx-h100.yaml"), None)
        .unwrap()
        .inventory_ref()
        .clone();
    let shared = |advertised: &str| Settings {
        replication: vec![Replication {
            name: "nvidia.com/gpu".into(),
            replicas: 4,
            advertised: advertised.into(),
        }],
        ..Default::default()
    };
    let m = node_labels(&inv, &shared("nvidia.com/gpu"));
    assert_eq!(m["nvidia.com/gpu.product"], "H100-SXM5-80GB-SHARED");
    assert_eq!(m["nvidia.com/gpu.replicas"], "4");
    assert_eq!(m["nvidia.com/gpu.sharing-strategy"], "time-slicing");
    assert_eq!(m["nvidia.com/gpu.count"], "8");
    assert_eq!(m["nvidia.com/gpu.family"], "hopper");
    // Renamed to nvidia.com/gpu.shared: GFD keeps the product as is.
    let m = node_labels(&inv, &shared("nvidia.com/gpu.shared"));
    assert_eq!(m["nvidia.com/gpu.product"], "H100-SXM5-80GB");
    assert_eq!(m["nvidia.com/gpu.replicas"], "4");
}
