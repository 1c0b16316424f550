//! The DRA mode over real unix sockets: plugin registration, the DRA
//! service in v1 and v1beta1 (tonic clients from our own protos), CDI specs,
//! the checkpoint across a restart, and the node's ResourceSlice (against
//! in-memory claims and slices; the real API server and kubelet are in
//! kubelet_e2e.rs).
mod common;
mod dra_env;

use dra_env::*;
use gpusched_node_agent::server::unix_channel;
use gpusched_node_agent::{
    dra_health_v1 as health, dra_v1 as v1, dra_v1beta1 as v1beta1, registration_api as reg,
};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_the_kubelet_and_publishes_the_node_slice() {
    let env = Env::new();
    let agent = env.start();
    let mut r = env.registration().await;
    let info = r.get_info(reg::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.gpusched.io");
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/gpu.gpusched.io/dra.sock"
    );
    assert_eq!(
        info.supported_versions,
        vec!["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"]
    );
    r.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();

    let s = env
        .slices
        .wait("8 devices", |s| {
            s.devices.as_ref().is_some_and(|d| d.len() == 8)
        })
        .await;
    assert_eq!(s.driver, "gpu.gpusched.io");
    assert_eq!(s.pool.name, NODE);
    assert_eq!(s.node_name.as_deref(), Some(NODE));
    let gen0 = s.pool.generation;
    assert!(gen0 >= 1);
    let devs = s.devices.unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    let a = devs[3].attributes.as_ref().unwrap();
    assert_eq!(a["uuid"].string.as_deref(), Some(env.uuid(3).as_str()));
    assert_eq!(a["index"].int, Some(3));
    assert!(a["numaNode"].int.is_some());
    assert!(devs.iter().all(|d| d.taints.is_none()));

    // Nothing changes: the periodic check leaves the slice alone.
    let applies = *env.slices.applies.lock().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(*env.slices.applies.lock().unwrap(), applies);

    // The health stream: every device at once, healthy.
    let p = env.dra().dra_socket();
    let mut h = health::dra_resource_health_client::DraResourceHealthClient::new(
        unix_channel(&p).await.unwrap(),
    );
    let mut stream = h
        .node_watch_resources(health::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 8);
    for d in &first.devices {
        assert_eq!(d.health, health::HealthStatus::Healthy as i32);
        assert_eq!(d.device.as_ref().unwrap().pool_name, NODE);
        assert!(d.last_updated_time > 0 && d.health_check_timeout_seconds == 30);
    }

    // A fatal XID taints the GPU NoExecute and bumps the generation.
    std::fs::write(&env.control, "xid 2 79\n").unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a health update after the XID")
        .unwrap()
        .unwrap();
    let d2 = next
        .devices
        .iter()
        .find(|d| d.device.as_ref().unwrap().device_name == "gpu-2")
        .unwrap();
    assert_eq!(d2.health, health::HealthStatus::Unhealthy as i32);
    assert_eq!(d2.message, "xid 79");
    assert_eq!(
        next.devices
            .iter()
            .filter(|d| d.health == health::HealthStatus::Healthy as i32)
            .count(),
        7
    );
    let s = env
        .slices
        .wait("a taint on gpu-2", |s| {
            s.devices.as_ref().unwrap()[2].taints.is_some()
        })
        .await;
    let t = &s.devices.as_ref().unwrap()[2].taints.as_ref().unwrap()[0];
    assert_eq!(t.key, "gpu.gpusched.io/unhealthy");
    assert_eq!(t.effect, "NoExecute");
    assert!(s.pool.generation > gen0);
    let gen1 = s.pool.generation;

    // The kubelet deletes the node's slices: the agent publishes again,
    // with a newer generation.
    env.slices.cur.lock().unwrap().clear();
    let s = env.slices.wait("the slice back", |_| true).await;
    assert!(s.pool.generation > gen1, "{} > {gen1}", s.pool.generation);

    agent.shutdown().await;
    assert!(!env.dra().registration_socket().exists());
    assert!(!env.dra().dra_socket().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepares_claims_idempotently_and_refuses_bad_ones() {
    let env = Env::new();
    let agent = env.start();
    let mut c = env.v1().await;
    let (u1, u5) = (env.uuid(1), env.uuid(5));
    env.claims.put(claim(
        "two",
        "uid-two",
        &[("gpu", NODE, "gpu-1"), ("gpu", NODE, "gpu-5")],
        true,
    ));

    let r = prepare(&mut c, vec![v1_claim("two", "uid-two")]).await;
    let got = &r["uid-two"];
    assert_eq!(got.error, "");
    let ids: Vec<&str> = got
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().map(|s| s.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            format!("k8s.gpu.gpusched.io/gpu={u1}"),
            format!("k8s.gpu.gpusched.io/gpu={u5}")
        ]
    );
    assert_eq!(got.devices[0].device_name, "gpu-1");
    assert_eq!(got.devices[0].pool_name, NODE);
    assert_eq!(got.devices[0].request_names, ["gpu"]);
    let spec = env.cdi_spec("uid-two").expect("CDI spec written");
    assert_eq!(spec["kind"], "k8s.gpu.gpusched.io/gpu");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [u1.as_str(), u5.as_str()]);
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia1"
    );
    let env_list = spec["containerEdits"]["env"].as_array().unwrap();
    assert!(env_list.contains(&json!(format!("NVIDIA_VISIBLE_DEVICES={u1},{u5}"))));

    // Idempotent: the same answer, even with the claim gone from the API.
    env.claims.clear();
    let again = prepare(&mut c, vec![v1_claim("two", "uid-two")]).await;
    assert_eq!(again["uid-two"], *got);

    // Bad claims, each with its own error naming it.
    env.claims
        .put(claim("steal", "uid-steal", &[("gpu", NODE, "gpu-5")], true));
    env.claims.put(claim(
        "unreserved",
        "uid-unres",
        &[("gpu", NODE, "gpu-0")],
        false,
    ));
    env.claims.put(claim(
        "elsewhere",
        "uid-else",
        &[("gpu", "other-node", "gpu-0")],
        true,
    ));
    env.claims.put(claim(
        "nosuchgpu",
        "uid-nosuch",
        &[("gpu", NODE, "gpu-9")],
        true,
    ));
    env.claims.put(claim(
        "recreated",
        "uid-new",
        &[("gpu", NODE, "gpu-0")],
        true,
    ));
    let r = prepare(
        &mut c,
        vec![
            v1_claim("steal", "uid-steal"),
            v1_claim("unreserved", "uid-unres"),
            v1_claim("elsewhere", "uid-else"),
            v1_claim("nosuchgpu", "uid-nosuch"),
            v1_claim("recreated", "uid-old"),
            v1_claim("missing", "uid-missing"),
        ],
    )
    .await;
    let err = |uid: &str| r[uid].error.clone();
    assert!(
        err("uid-steal").contains("claim ns/steal")
            && err("uid-steal").contains("prepared for claim ns/two"),
        "{}",
        err("uid-steal")
    );
    assert!(
        err("uid-unres").contains("not reserved"),
        "{}",
        err("uid-unres")
    );
    assert!(
        err("uid-else").contains("pool \"other-node\""),
        "{}",
        err("uid-else")
    );
    assert!(
        err("uid-nosuch").contains("no whole GPU with index 9"),
        "{}",
        err("uid-nosuch")
    );
    assert!(
        err("uid-old").contains("uid \"uid-new\""),
        "{}",
        err("uid-old")
    );
    assert!(
        err("uid-missing").contains("does not exist"),
        "{}",
        err("uid-missing")
    );
    for uid in [
        "uid-steal",
        "uid-unres",
        "uid-else",
        "uid-nosuch",
        "uid-old",
        "uid-missing",
    ] {
        assert!(r[uid].devices.is_empty());
        assert!(env.cdi_spec(uid).is_none(), "{uid}");
    }

    // A claim without a uid is a bad request.
    let e = c
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![v1_claim("x", "")],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("\"ns\"/\"x\"") && e.message().contains("no uid"),
        "{}",
        e.message()
    );

    // Unprepare frees the GPU (twice is fine); then the other claim gets it.
    for _ in 0..2 {
        let r = c
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                claims: vec![v1_claim("two", "uid-two")],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.claims["uid-two"].error, "");
    }
    assert!(env.cdi_spec("uid-two").is_none());
    let r = prepare(&mut c, vec![v1_claim("steal", "uid-steal")]).await;
    assert_eq!(r["uid-steal"].error, "");

    // v1beta1 speaks the same.
    env.claims
        .put(claim("beta", "uid-beta", &[("gpu", NODE, "gpu-7")], true));
    let mut b = env.v1beta1().await;
    let r = b
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ns".into(),
                name: "beta".into(),
                uid: "uid-beta".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.claims["uid-beta"].devices[0].cdi_device_ids,
        [format!("k8s.gpu.gpusched.io/gpu={}", env.uuid(7))]
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_what_it_prepared() {
    let env = Env::new();
    let agent = env.start();
    let mut c = env.v1().await;
    env.claims
        .put(claim("a", "uid-a", &[("gpu", NODE, "gpu-4")], true));
    let first = prepare(&mut c, vec![v1_claim("a", "uid-a")]).await;
    assert_eq!(first["uid-a"].error, "");
    drop(c);
    agent.shutdown().await;

    // The CDI dir lost its files (a tmpfs): the restart writes them back.
    std::fs::remove_dir_all(env.dra().cdi_dir).unwrap();
    env.claims.clear();
    env.claims
        .put(claim("b", "uid-b", &[("gpu", NODE, "gpu-4")], true));
    let agent = env.start();
    let mut c = env.v1().await;
    assert!(env.cdi_spec("uid-a").is_some());
    let r = prepare(&mut c, vec![v1_claim("a", "uid-a"), v1_claim("b", "uid-b")]).await;
    assert_eq!(r["uid-a"], first["uid-a"]);
    assert!(
        r["uid-b"].error.contains("prepared for claim ns/a"),
        "{}",
        r["uid-b"].error
    );
    agent.shutdown().await;

    // A checkpoint that cannot be read stops the agent with its path.
    std::fs::write(env.dra().checkpoint(), "{not json").unwrap();
    let agent = env.start();
    let e = agent.task.await.unwrap().unwrap_err().to_string();
    assert!(
        e.contains("checkpoint.json") && e.contains("not valid"),
        "{e}"
    );
}
