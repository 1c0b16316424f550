//! The DRA mode's parts of GPUs over real unix sockets: shares as
//! consumable capacity (`--shares`: every whole GPU allows multiple
//! allocations of its 1000 milli) and MIG instances as devices consuming
//! their GPU's shared counter set — the slice, prepare and unprepare per
//! share or instance, the CDI specs, the refusals, and the checkpoint
//! across a restart.

mod common;
mod dra_env;

use dra_env::*;
use gpusched_node_agent::dra_v1 as v1;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

/// A claim allocated `results` (device results as JSON) and reserved.
fn claim_of(name: &str, uid: &str, results: Vec<Value>) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpusched.io"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
        }
    }))
    .unwrap()
}

/// A device result of `device` as a share `share` of `milli` (a quantity).
fn share(device: &str, share: &str, milli: Option<&str>) -> Value {
    let mut r = json!({"request": "gpu", "driver": "gpu.gpusched.io", "pool": NODE,
        "device": device, "shareID": share});
    if let Some(m) = milli {
        r["consumedCapacity"] = json!({"milli": m, "memory": "0"});
    }
    r
}

fn whole(device: &str) -> Value {
    json!({"request": "gpu", "driver": "gpu.gpusched.io", "pool": NODE, "device": device})
}

fn env_of(spec: &Value) -> Vec<String> {
    spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

async fn unprepare(
    c: &mut v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    claims: Vec<v1::Claim>,
) {
    let r = c
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    for (uid, e) in r.claims {
        assert_eq!(e.error, "", "unprepare {uid}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_are_consumable_capacity_prepared_per_share() {
    let env = Env::with("dgx-h100.yaml", true);
    let agent = env.start();
    let slice = env
        .slices
        .wait("devices", |s| {
            s.devices.as_ref().is_some_and(|d| d.len() == 8)
        })
        .await;
    for d in slice.devices.as_ref().unwrap() {
        assert_eq!(d.allow_multiple_allocations, Some(true), "{}", d.name);
        let milli = &d.capacity.as_ref().unwrap()["milli"];
        assert_eq!(milli.value.0, "1k");
        let range = milli
            .request_policy
            .as_ref()
            .unwrap()
            .valid_range
            .as_ref()
            .unwrap();
        assert_eq!(
            (
                range.min.0.as_str(),
                range.step.as_ref().unwrap().0.as_str()
            ),
            ("1", "1")
        );
    }
    assert!(env.slices.counters().is_none(), "no MIG GPU, no counters");

    let u1 = env.uuid(1);
    env.claims.put(claim_of(
        "a",
        "uid-a",
        vec![share("gpu-1", "s-a", Some("300"))],
    ));
    env.claims.put(claim_of(
        "b",
        "uid-b",
        vec![share("gpu-1", "s-b", Some("500"))],
    ));
    let mut c = env.v1().await;
    let r = prepare(&mut c, vec![v1_claim("a", "uid-a"), v1_claim("b", "uid-b")]).await;
    for (uid, id, milli) in [("uid-a", "s-a", "300"), ("uid-b", "s-b", "500")] {
        let resp = &r[uid];
        assert_eq!(resp.error, "", "{uid}");
        let d = &resp.devices[0];
        assert_eq!(d.device_name, "gpu-1");
        assert_eq!(d.share_id.as_deref(), Some(id));
        assert_eq!(
            d.cdi_device_ids,
            [format!("k8s.gpu.gpusched.io/gpu={u1}-share-{id}")]
        );
        let spec = env.cdi_spec(uid).unwrap();
        assert_eq!(spec["devices"][0]["name"], format!("{u1}-share-{id}"));
        let e = env_of(&spec);
        assert!(e.contains(&format!("NVIDIA_VISIBLE_DEVICES={u1}")), "{e:?}");
        assert!(e.contains(&format!("GPUSCHED_GPU_MILLI={milli}")), "{e:?}");
    }

    // 300 + 500 taken: 300 more would be 1100 of the GPU's 1000
    env.claims.put(claim_of(
        "c",
        "uid-c",
        vec![share("gpu-1", "s-c", Some("300"))],
    ));
    let r = prepare(&mut c, vec![v1_claim("c", "uid-c")]).await;
    assert!(
        r["uid-c"].error.contains("1100 milli"),
        "{}",
        r["uid-c"].error
    );
    assert!(env.cdi_spec("uid-c").is_none());
    // a whole-GPU allocation of a shared GPU
    env.claims.put(claim_of("d", "uid-d", vec![whole("gpu-1")]));
    let r = prepare(&mut c, vec![v1_claim("d", "uid-d")]).await;
    assert!(
        r["uid-d"].error.contains("is prepared for claim ns/a"),
        "{}",
        r["uid-d"].error
    );
    // a share without the milli it consumed, and one out of range
    env.claims
        .put(claim_of("e", "uid-e", vec![share("gpu-2", "s-e", None)]));
    env.claims.put(claim_of(
        "f",
        "uid-f",
        vec![share("gpu-2", "s-f", Some("2k"))],
    ));
    let r = prepare(&mut c, vec![v1_claim("e", "uid-e"), v1_claim("f", "uid-f")]).await;
    assert!(
        r["uid-e"].error.contains("no consumedCapacity milli"),
        "{}",
        r["uid-e"].error
    );
    assert!(
        r["uid-f"].error.contains("is not 1 to 1000"),
        "{}",
        r["uid-f"].error
    );
    // the canonical "1k" is the whole GPU, as a share
    env.claims.put(claim_of(
        "g",
        "uid-g",
        vec![share("gpu-2", "s-g", Some("1k"))],
    ));
    let r = prepare(&mut c, vec![v1_claim("g", "uid-g")]).await;
    assert_eq!(r["uid-g"].error, "");
    assert!(env_of(&env.cdi_spec("uid-g").unwrap()).contains(&"GPUSCHED_GPU_MILLI=1000".into()));

    // unprepare is per share: a's 300 goes, c's 300 fits beside b's 500
    unprepare(&mut c, vec![v1_claim("a", "uid-a")]).await;
    assert!(env.cdi_spec("uid-a").is_none());
    assert!(env.cdi_spec("uid-b").is_some());
    let r = prepare(&mut c, vec![v1_claim("c", "uid-c")]).await;
    assert_eq!(r["uid-c"].error, "");

    // the checkpoint keeps each share across a restart
    agent.shutdown().await;
    std::fs::remove_dir_all(env.dra().cdi_dir).unwrap();
    env.claims.clear();
    let agent = env.start();
    let mut c = env.v1().await;
    let r = prepare(&mut c, vec![v1_claim("b", "uid-b"), v1_claim("c", "uid-c")]).await;
    assert_eq!(r["uid-b"].devices[0].share_id.as_deref(), Some("s-b"));
    assert_eq!(r["uid-c"].devices[0].share_id.as_deref(), Some("s-c"));
    assert!(env_of(&env.cdi_spec("uid-b").unwrap()).contains(&"GPUSCHED_GPU_MILLI=500".into()));
    let cp: Value =
        serde_json::from_slice(&std::fs::read(env.dra().checkpoint()).unwrap()).unwrap();
    assert_eq!(cp["claims"]["uid-c"]["devices"][0]["milli"], 300);
    // still 800 taken: 300 more is refused after the restart too
    env.claims.put(claim_of(
        "h",
        "uid-h",
        vec![share("gpu-1", "s-h", Some("300"))],
    ));
    let r = prepare(&mut c, vec![v1_claim("h", "uid-h")]).await;
    assert!(
        r["uid-h"].error.contains("1100 milli"),
        "{}",
        r["uid-h"].error
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_instances_are_partitions_of_their_gpus_counter_set() {
    // 8 A100s; GPU 0 has 7x 1g.10gb, GPU 1 2x 3g.40gb
    let env = Env::with("mig-a100.yaml", false);
    let agent = env.start();
    let slice = env
        .slices
        .wait("devices", |s| {
            s.devices.as_ref().is_some_and(|d| d.len() == 15)
        })
        .await;
    let names: Vec<String> = slice
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert!(!names.contains(&"gpu-0".to_string()), "{names:?}");
    assert!(names.contains(&"gpu-0-mig-6".to_string()), "{names:?}");
    assert!(names.contains(&"gpu-1-mig-1".to_string()), "{names:?}");
    let counters = env.slices.counters().expect("the counters' slice");
    assert!(counters.devices.is_none());
    let sets = counters.shared_counters.as_ref().unwrap();
    assert_eq!(
        sets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["gpu-0-counters", "gpu-1-counters"]
    );
    assert_eq!(
        (
            slice.pool.resource_slice_count,
            counters.pool.resource_slice_count
        ),
        (2, 2)
    );
    assert_eq!(slice.pool.generation, counters.pool.generation);
    // what the instances of GPU 1 consume fits its set
    let big = slice
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .find(|d| d.name == "gpu-1-mig-0")
        .unwrap();
    let use_ = &big.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(use_.counter_set, "gpu-1-counters");
    assert_eq!(use_.counters["compute-slices"].value.0, "3");
    assert_eq!(use_.counters["memory-slices"].value.0, "4");
    let attrs = big.attributes.as_ref().unwrap();
    assert_eq!(attrs["profile"].string.as_deref(), Some("3g.40gb"));
    assert_eq!(
        attrs["parentUUID"].string.as_deref(),
        Some(env.uuid(1).as_str())
    );
    let mig_uuid = attrs["uuid"].string.clone().unwrap();
    assert!(mig_uuid.starts_with("MIG-"), "{mig_uuid}");

    // an instance prepares as its MIG UUID
    env.claims
        .put(claim_of("m", "uid-m", vec![whole("gpu-1-mig-0")]));
    let mut c = env.v1().await;
    let r = prepare(&mut c, vec![v1_claim("m", "uid-m")]).await;
    assert_eq!(r["uid-m"].error, "");
    assert_eq!(
        r["uid-m"].devices[0].cdi_device_ids,
        [format!("k8s.gpu.gpusched.io/gpu={mig_uuid}")]
    );
    let spec = env.cdi_spec("uid-m").unwrap();
    assert_eq!(spec["devices"][0]["name"], mig_uuid.as_str());
    assert!(env_of(&spec).contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}")));
    let node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        node.starts_with("/dev/nvidia"),
        "the parent GPU's node: {node}"
    );

    // refused: the same instance twice, the MIG GPU whole, an instance
    // that does not exist, a share on a node without shares
    env.claims
        .put(claim_of("twice", "uid-2", vec![whole("gpu-1-mig-0")]));
    env.claims
        .put(claim_of("whole", "uid-w", vec![whole("gpu-0")]));
    env.claims
        .put(claim_of("ghost", "uid-g", vec![whole("gpu-1-mig-5")]));
    env.claims.put(claim_of(
        "shared",
        "uid-s",
        vec![share("gpu-3", "s", Some("100"))],
    ));
    let r = prepare(
        &mut c,
        vec![
            v1_claim("twice", "uid-2"),
            v1_claim("whole", "uid-w"),
            v1_claim("ghost", "uid-g"),
            v1_claim("shared", "uid-s"),
        ],
    )
    .await;
    for (uid, why) in [
        ("uid-2", "is prepared for claim ns/m"),
        ("uid-w", "no whole GPU with index 0"),
        ("uid-g", "no MIG instance 5 on GPU 1"),
        ("uid-s", "does not publish it for sharing"),
    ] {
        assert!(r[uid].error.contains(why), "{uid}: {}", r[uid].error);
        assert!(env.cdi_spec(uid).is_none());
    }

    // the checkpoint keeps the instance across a restart
    agent.shutdown().await;
    std::fs::remove_dir_all(env.dra().cdi_dir).unwrap();
    let agent = env.start();
    let mut c = env.v1().await;
    assert_eq!(env.cdi_spec("uid-m").unwrap(), spec);
    let r = prepare(&mut c, vec![v1_claim("twice", "uid-2")]).await;
    assert!(r["uid-2"].error.contains("is prepared for claim ns/m"));
    unprepare(&mut c, vec![v1_claim("m", "uid-m")]).await;
    assert!(env.cdi_spec("uid-m").is_none());
    let r = prepare(&mut c, vec![v1_claim("twice", "uid-2")]).await;
    assert_eq!(r["uid-2"].error, "");
    agent.shutdown().await;
}
