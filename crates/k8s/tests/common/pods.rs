//! Pods and what the tests wait for and check: creating, binding, decisions,
//! events, no GPU double-booked.

use super::*;

/// The reason and message of the pod's `PodScheduled` condition.
pub fn scheduled_reason(p: &Pod) -> Option<(String, String)> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    Some((c.reason.clone()?, c.message.clone().unwrap_or_default()))
}

/// Polls `f` until it returns Some, or gives up after `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let t0 = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if t0.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod of ours asking `gpus` whole GPUs (limits only).
pub fn gpu_pod(name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {}},
        "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}, "requests": {"cpu": "100m"}}}]}
    })
}

pub async fn create(api: &Api<Pod>, v: Value) -> Pod {
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap()
}

pub async fn create_obj<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap()
}

/// Pods of the namespace bound to a node and not terminating, by name.
pub async fn bound(api: &Api<Pod>) -> BTreeMap<String, Pod> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect()
}

/// The recorded decision of a bound pod.
pub fn decision(p: &Pod) -> GpuDecision {
    let text = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_DECISION))
        .unwrap_or_else(|| panic!("{:?} has no decision", p.metadata.name));
    GpuDecision::parse(text).unwrap()
}

/// Asserts no GPU (node, index) is held by two live pods, over all namespaces.
pub async fn assert_no_double_booking(client: &Client) {
    let api: Api<Pod> = Api::all(client.clone());
    let mut held: BTreeMap<(String, u32), String> = BTreeMap::new();
    for p in api.list(&ListParams::default()).await.unwrap().items {
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Some(text) = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_DECISION))
        else {
            continue;
        };
        let d = GpuDecision::parse(text).unwrap();
        assert_eq!(d.node, node, "decision node matches nodeName");
        if d.share.is_some() {
            continue;
        }
        for i in d.indices {
            let name = p.metadata.name.clone().unwrap();
            if let Some(prev) = held.insert((node.clone(), i), name.clone()) {
                panic!("GPU {i} of {node} held by {prev} and {name}");
            }
        }
    }
}

/// Events about one object, as `reason: note` lines.
pub async fn events_for(client: &Client, ns: &str, name: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

pub async fn patch_labels(api: &Api<Pod>, name: &str, labels: Value) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": labels}})),
    )
    .await
    .unwrap();
}

/// Waits until an event about `ns/name` starts with `prefix` (`reason:
/// note`); returns all its events.
pub async fn wait_event(
    c: &Cluster,
    ns: &str,
    name: &str,
    prefix: &str,
    secs: u64,
) -> Option<Vec<String>> {
    wait_for(Duration::from_secs(secs), || async {
        let e = events_for(&c.client, ns, name).await;
        e.iter().any(|e| e.starts_with(prefix)).then_some(e)
    })
    .await
}
