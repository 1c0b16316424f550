//! The leader's task ([`run`]): carries the plans out against the API —
//! PodTemplates and the request, the consume annotation, deletion — and
//! reports to the gang's members with events.

use super::*;

/// The gangs of the last status cycle, sent by the loop to [`run`].
pub type Gangs = Arc<BTreeMap<String, GangState>>;

/// Everything [`run`] needs.
pub struct Ctx {
    /// The scheduler's client.
    pub client: Client,
    /// What to write.
    pub config: Config,
    /// The world (nominations and the members' condition notes).
    pub shared: Shared,
    /// The gangs of each status cycle (`None` until the first).
    pub gangs: tokio_watch::Receiver<Option<Gangs>>,
    /// Leadership: only the leader writes.
    pub leading: tokio_watch::Receiver<bool>,
    /// The reporting instance for events.
    pub instance: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the ProvisioningRequest side of the scheduler until dropped:
/// waits until `autoscaling.x-k8s.io/v1` serves `provisioningrequests`
/// (checking every [`crate::watch::OPTIONAL_RECHECK`]), then watches the
/// requests labelled [`LABEL_MANAGED_BY`]=[`MANAGED_BY`] and carries out
/// [`decide`]'s plans whenever the gangs or the requests change (and every
/// few seconds, for backoffs).
pub async fn run(mut ctx: Ctx) {
    let ar = kube::api::ApiResource::erase::<ProvisioningRequest>(&());
    let mut said = false;
    while !crate::watch::served(&ctx.client, &ar).await {
        if !said {
            tracing::info!(
                "autoscaling.x-k8s.io/v1 provisioningrequests is not served (CRD not installed): no ProvisioningRequests for gangs; checking again every {}s",
                crate::watch::OPTIONAL_RECHECK.as_secs()
            );
            said = true;
        }
        tokio::time::sleep(crate::watch::OPTIONAL_RECHECK).await;
    }
    tracing::info!(class = %ctx.config.class, "writing ProvisioningRequests for gangs that need nodes");
    let api: Api<ProvisioningRequest> = Api::all(ctx.client.clone());
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let changed = Arc::new(tokio::sync::Notify::new());
    let notify = changed.clone();
    let stream = reflector(writer, watcher(api, cfg))
        .default_backoff()
        .touched_objects();
    let watch_task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::debug!("ProvisioningRequest watch: {e}");
            }
            notify.notify_one();
        }
    });
    let _guard = AbortOnDrop(watch_task);
    let recorder = Recorder::new(ctx.client.clone(), "gpusched", &ctx.instance);
    let mut state = RunState::default();
    loop {
        tokio::select! {
            r = ctx.gangs.changed() => if r.is_err() { return },
            _ = changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        if !*ctx.leading.borrow() {
            continue;
        }
        let Some(gangs) = ctx.gangs.borrow().clone() else {
            continue;
        };
        if reader.wait_until_ready().await.is_err() {
            return;
        }
        let prs = reader.state();
        reconcile(&ctx, &recorder, &mut state, &gangs, &prs).await;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What [`run`] remembers between rounds.
#[derive(Default)]
struct RunState {
    /// (request, what) already reported by an event.
    reported: BTreeSet<(String, String)>,
    /// Provisioned requests whose existing nodes were listed (once: the
    /// nodes that register later are reserved by the world as they come).
    listed: BTreeSet<String>,
}

async fn reconcile(
    ctx: &Ctx,
    recorder: &Recorder,
    st: &mut RunState,
    gangs: &BTreeMap<String, GangState>,
    prs: &[Arc<ProvisioningRequest>],
) {
    let now = now_ms();
    let mut by_gang: BTreeMap<String, Vec<(PrState, Arc<ProvisioningRequest>)>> = BTreeMap::new();
    for pr in prs {
        if let Some((g, s)) = pr_state(pr) {
            by_gang.entry(g).or_default().push((s, pr.clone()));
        }
    }
    let keys: BTreeSet<&String> = gangs
        .keys()
        .filter(|k| gangs[*k].blocked != Blocked::Waiting || by_gang.contains_key(*k))
        .chain(by_gang.keys())
        .collect();
    let mut notes: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes_cache: Option<Vec<Node>> = None;
    let mut keep_reserved: BTreeSet<String> = BTreeSet::new();
    for key in keys {
        let gang = gangs.get(key);
        let mine = by_gang.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let states: Vec<PrState> = mine.iter().map(|(s, _)| s.clone()).collect();
        let plan = decide(gang, &states, now, &ctx.config);
        for (name, why) in &plan.delete {
            if let Some((_, pr)) = mine.iter().find(|(s, _)| &s.name == name) {
                delete(ctx, pr, why).await;
            }
        }
        let ns = gang
            .map(|g| g.namespace.clone())
            .or_else(|| mine.first().and_then(|(_, p)| p.namespace()))
            .unwrap_or_default();
        match plan.next {
            Next::Nothing => {}
            Next::Create { attempt } => {
                let Some(g) = gang else { continue };
                match create(ctx, key, g, attempt).await {
                    Ok(name) => {
                        let msg = format!(
                            "the gang {key} needs new nodes: ProvisioningRequest {ns}/{name} ({}) asks for all {} pending member(s) at once (attempt {attempt})",
                            ctx.config.class,
                            g.pending.len()
                        );
                        tracing::info!("{msg}");
                        event_members(
                            recorder,
                            g,
                            EventType::Normal,
                            "ProvisioningRequested",
                            &msg,
                        );
                        notes.insert(
                            key.clone(),
                            format!(
                                "waiting for ProvisioningRequest {ns}/{name} ({})",
                                ctx.config.class
                            ),
                        );
                    }
                    Err(e) => {
                        tracing::warn!("ProvisioningRequest for the gang {key}: {e}");
                        if st.reported.insert((pr_name(key, attempt), e.clone())) {
                            event_members(
                                recorder,
                                g,
                                EventType::Warning,
                                "ProvisioningRequestFailed",
                                &format!(
                                    "cannot write a ProvisioningRequest for the gang {key}: {e}"
                                ),
                            );
                        }
                    }
                }
            }
            Next::Pending { pr } => {
                notes.insert(
                    key.clone(),
                    format!(
                        "waiting for ProvisioningRequest {ns}/{pr} ({})",
                        ctx.config.class
                    ),
                );
            }
            Next::Reserve { pr, since_ms } => {
                notes.insert(
                    key.clone(),
                    format!("ProvisioningRequest {ns}/{pr} is provisioned: the new nodes are reserved for the gang"),
                );
                let Some(g) = gang else { continue };
                let first = !st.listed.contains(&pr);
                if first && nodes_cache.is_none() {
                    let api: Api<Node> = Api::all(ctx.client.clone());
                    match api.list(&ListParams::default()).await {
                        Ok(l) => nodes_cache = Some(l.items),
                        Err(e) => {
                            tracing::warn!("listing nodes for ProvisioningRequest {ns}/{pr}: {e}")
                        }
                    }
                }
                let nodes = match (&nodes_cache, first) {
                    (Some(all), true) => {
                        st.listed.insert(pr.clone());
                        new_nodes(all, since_ms)
                    }
                    _ => Vec::new(),
                };
                if st.reported.insert((pr.clone(), "Provisioned".into())) {
                    let msg = format!(
                        "ProvisioningRequest {ns}/{pr} is provisioned; the nodes that come for it are reserved for the gang {key} ({} there now)",
                        nodes.len()
                    );
                    tracing::info!("{msg}");
                    event_members(recorder, g, EventType::Normal, "Provisioned", &msg);
                }
                let uids = g.pending.iter().map(|m| m.uid.clone()).collect();
                keep_reserved.insert(key.clone());
                if ctx
                    .shared
                    .with(|w| w.reserve_provisioned(key, since_ms, uids, &nodes))
                {
                    ctx.shared.changed.notify_one();
                }
            }
            Next::Backoff { pr, why, until_ms } => {
                let secs = until_ms.saturating_sub(now).div_ceil(1000);
                // the note holds the time, not a countdown: it changes
                // only when the request does (a changed note rewrites the
                // members' conditions)
                let at = i64::try_from(until_ms)
                    .ok()
                    .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
                    .map_or_else(|| "later".to_string(), |t| format!("at {t:.0}"));
                let next = if gang.is_some_and(|g| g.blocked == Blocked::Capacity) {
                    format!("a new request {at}")
                } else {
                    "no new request while the gang does not need nodes".to_string()
                };
                notes.insert(
                    key.clone(),
                    format!("ProvisioningRequest {ns}/{pr} failed: {why}; {next}"),
                );
                if let Some(g) = gang
                    && st.reported.insert((pr.clone(), why.clone()))
                {
                    let msg = format!(
                        "ProvisioningRequest {ns}/{pr} for the gang {key} failed: {why}; a new request in {secs}s"
                    );
                    tracing::warn!("{msg}");
                    event_members(recorder, g, EventType::Warning, "ProvisioningFailed", &msg);
                }
            }
        }
    }
    // reservations of gangs whose request is no longer provisioned
    if ctx.shared.with(|w| w.retain_provisioned(&keep_reserved)) {
        ctx.shared.changed.notify_one();
    }
    let live: BTreeSet<String> = prs.iter().filter_map(|p| p.metadata.name.clone()).collect();
    st.reported.retain(|(pr, _)| live.contains(pr));
    st.listed.retain(|pr| live.contains(pr));
    let changed = ctx.shared.with(|w| w.set_provisioning_notes(notes));
    if changed {
        ctx.shared.changed.notify_one();
    }
}

fn event_members(recorder: &Recorder, g: &GangState, type_: EventType, reason: &str, note: &str) {
    for m in &g.pending {
        let ev = recorder.prepare(
            Event {
                type_,
                reason: reason.into(),
                action: "Provisioning".into(),
                note: note.into(),
            },
            crate::exec::pod_ref(&g.namespace, &m.name, &m.uid),
        );
        tokio::spawn(async move {
            if let Err(e) = ev.publish().await {
                tracing::debug!("event: {e}");
            }
        });
    }
}

/// Who owns a gang's request (and its templates), so the garbage
/// collector removes them with the gang: the gpusched PodGroup when the
/// gang is one, else the first member's controller (Job, JobSet's Job,
/// StatefulSet, …), else the members themselves (removed when all are).
async fn owners(client: &Client, key: &str, pods: &[Pod]) -> Vec<OwnerReference> {
    if let Some((ns, name)) = key.split_once('/')
        && !name.contains(':')
    {
        let api: Api<crate::crd::PodGroup> = Api::namespaced(client.clone(), ns);
        if let Ok(Some(g)) = api.get_opt(name).await
            && let Some(uid) = g.metadata.uid.clone()
        {
            return vec![OwnerReference {
                api_version: crate::crd::PodGroup::api_version(&()).into(),
                kind: "PodGroup".into(),
                name: name.into(),
                uid,
                ..Default::default()
            }];
        }
    }
    if let Some(o) = pods
        .first()
        .and_then(|p| p.metadata.owner_references.as_ref())
        .and_then(|os| os.iter().find(|o| o.controller == Some(true)))
    {
        return vec![OwnerReference {
            controller: None,
            block_owner_deletion: None,
            ..o.clone()
        }];
    }
    pods.iter()
        .filter_map(|p| {
            Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: p.metadata.name.clone()?,
                uid: p.metadata.uid.clone()?,
                ..Default::default()
            })
        })
        .collect()
}

fn managed_meta(
    name: &str,
    ns: &str,
    gang: &str,
    attempt: u32,
    owners: &[OwnerReference],
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        labels: Some(BTreeMap::from([(
            LABEL_MANAGED_BY.to_string(),
            MANAGED_BY.to_string(),
        )])),
        annotations: Some(BTreeMap::from([
            (ANNOTATION_GANG.to_string(), gang.to_string()),
            (ANNOTATION_ATTEMPT.to_string(), attempt.to_string()),
        ])),
        owner_references: (!owners.is_empty()).then(|| owners.to_vec()),
        ..Default::default()
    }
}

/// Writes request `attempt` for the gang: reads the pending members,
/// writes one PodTemplate per shape, then the request naming them, then
/// the consume annotation on each member. Returns the request's name.
async fn create(ctx: &Ctx, key: &str, g: &GangState, attempt: u32) -> Result<String, String> {
    let ns = &g.namespace;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut pods = Vec::new();
    for m in &g.pending {
        match pods_api.get_opt(&m.name).await {
            Ok(Some(p)) if p.metadata.uid.as_deref() == Some(m.uid.as_str()) => pods.push(p),
            Ok(_) => {}
            Err(e) => return Err(format!("reading pod {ns}/{}: {e}", m.name)),
        }
    }
    if pods.is_empty() {
        return Err("its pending members are gone".into());
    }
    let sets = pod_sets(&pods)?;
    let owners = owners(&ctx.client, key, &pods).await;
    let name = pr_name(key, attempt);
    let templates: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let mut pod_sets = Vec::new();
    for (i, (template, count)) in sets.into_iter().enumerate() {
        let tname = format!("{name}-{i}");
        let t = PodTemplate {
            metadata: managed_meta(&tname, ns, key, attempt, &owners),
            template: Some(template),
        };
        match templates.create(&crate::exec::post_params(), &t).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating PodTemplate {ns}/{tname}: {e}")),
        }
        pod_sets.push(PodSet {
            pod_template_ref: Reference { name: tname },
            count,
        });
    }
    let pr = ProvisioningRequest {
        metadata: managed_meta(&name, ns, key, attempt, &owners),
        spec: ProvisioningRequestSpec {
            pod_sets,
            provisioning_class_name: ctx.config.class.clone(),
            parameters: ctx.config.parameters.clone(),
        },
        status: None,
    };
    let api: Api<ProvisioningRequest> = Api::namespaced(ctx.client.clone(), ns);
    match api.create(&crate::exec::post_params(), &pr).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating ProvisioningRequest {ns}/{name}: {e}")),
    }
    let patch = crate::exec::patch::annotations(&[
        (ANNOTATION_CONSUME, name.as_str()),
        (ANNOTATION_CLASS, ctx.config.class.as_str()),
    ]);
    for p in &pods {
        let Some(pname) = p.metadata.name.as_deref() else {
            continue;
        };
        if let Err(e) = pods_api
            .patch(pname, &crate::exec::patch_params(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!("annotating pod {ns}/{pname} with {ANNOTATION_CONSUME}: {e}");
        }
    }
    Ok(name)
}

/// Deletes a request and the PodTemplates it names.
async fn delete(ctx: &Ctx, pr: &ProvisioningRequest, why: &str) {
    let (Some(ns), Some(name)) = (
        pr.metadata.namespace.as_deref(),
        pr.metadata.name.as_deref(),
    ) else {
        return;
    };
    tracing::info!("deleting ProvisioningRequest {ns}/{name}: {why}");
    let api: Api<ProvisioningRequest> = Api::namespaced(ctx.client.clone(), ns);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!("deleting ProvisioningRequest {ns}/{name}: {e}"),
    }
    let templates: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), ns);
    for s in &pr.spec.pod_sets {
        match templates
            .delete(&s.pod_template_ref.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!("deleting PodTemplate {ns}/{}: {e}", s.pod_template_ref.name),
        }
    }
}
