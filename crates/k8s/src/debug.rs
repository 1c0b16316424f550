//! The scheduler's HTTP server: `/healthz` and `/readyz` (open), `/metrics`
//! and the read-only debug endpoint behind delegated authentication:
//!
//! - `GET /gpusched/debug/pods/NAMESPACE/NAME`: the pod's [`PodReport`] (JSON);
//! - `GET /gpusched/debug/queues/NAME`: the queue's [`QueueReport`] (JSON);
//! - `GET /gpusched/debug/pending` and `GET /gpusched/debug/pending/QUEUE`: the pending pods
//!   (of one queue) in queue order with their reasons
//!   ([`report::PendingList`], JSON; `kubectl gpusched pending`);
//!
//! all from the leader's latest cycle. A standby answers 503 naming the
//! leader (the lease holder, which is the leader's pod name).
//!
//! The paths sit under gpusched's own prefix ([`PATH_PREFIX`]) so that the
//! chart's `gpusched-debug-reader` ClusterRole grants `get` on
//! `/gpusched/*` only: a grant of `/metrics` or `/debug/*` would also open
//! the API server's own `/metrics` and `/debug/pprof/*` (and those of other
//! components that authorize through it; issue 38). `/metrics` is served
//! also as `/gpusched/metrics`; the old `/debug/…` paths still answer, for
//! callers allowed them some other way.
//!
//! With [`HttpAuth::Delegated`] a request to a protected path needs
//! a bearer token: the apiserver authenticates it (TokenReview) and
//! authorizes `get` on the request's path as a non-resource URL
//! (SubjectAccessReview), as kube-scheduler's own secure port does. Missing
//! or invalid token: 401; not allowed: 403. Answers are cached for 10 s.
//!
//! [`crate::tools::debug_client`] is the client side (the CLI's `gpusched
//! explain`).

use crate::metrics::Metrics;
use crate::watch::Shared;
use crate::world::{Built, Problem};
use anyhow::Context;
use gpusched_core::CycleOutput;
use gpusched_core::report::{self, CycleView, PodReport, PodStatus};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How `/metrics` and the debug endpoint are protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HttpAuth {
    /// Open to anyone who reaches the port.
    #[default]
    None,
    /// Bearer token checked with a TokenReview, `get` on the path checked
    /// with a SubjectAccessReview.
    Delegated,
}

impl std::str::FromStr for HttpAuth {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(HttpAuth::None),
            "delegated" => Ok(HttpAuth::Delegated),
            _ => Err(format!("--http-auth {s:?}: expected delegated or none")),
        }
    }
}

/// Header the CLI also sends its token in: the apiserver's service proxy
/// drops `Authorization` after authenticating the caller, so a request
/// through it reaches the scheduler without one.
pub const FORWARDED_AUTH_HEADER: &str = "x-gpusched-authorization";

/// gpusched's own non-resource URL prefix: what the chart's
/// `gpusched-debug-reader` ClusterRole grants (`/gpusched/*`).
pub const PATH_PREFIX: &str = "/gpusched";

/// The debug endpoint's prefix (`/gpusched/debug`): clients append
/// `/pods/NAMESPACE/NAME`, `/queues/NAME` or `/pending[/QUEUE]`.
pub const DEBUG_PREFIX: &str = "/gpusched/debug";

/// The debug path of `rest` (`pods/ml/p0` → `/gpusched/debug/pods/ml/p0`).
pub fn debug_path(rest: &str) -> String {
    format!("{DEBUG_PREFIX}/{}", rest.trim_start_matches('/'))
}

/// The debug route's part of a protected path (after `/gpusched/debug/` or
/// the older `/debug/`), or `None` when `path` is not a debug path.
fn debug_rest(path: &str) -> Option<&str> {
    path.strip_prefix("/gpusched/debug/")
        .or_else(|| path.strip_prefix("/debug/"))
}

/// How long an authentication + authorization answer is reused.
const AUTH_TTL: Duration = Duration::from_secs(10);
/// At most this many cached answers (the cache is cleared when full).
const AUTH_CACHE_MAX: usize = 1024;

/// A debug path.
enum Route {
    /// `/gpusched/debug/pods/NAMESPACE/NAME`.
    Pod(String),
    /// `/gpusched/debug/queues/NAME`.
    Queue(String),
    /// `/gpusched/debug/pending[/QUEUE]`.
    Pending(Option<String>),
}

/// The last cycle of the leader.
struct Latest {
    built: Built,
    out: CycleOutput,
    now_ms: u64,
}

#[derive(Clone, Debug)]
enum Verdict {
    Allowed,
    Unauthenticated(String),
    Forbidden(String),
}

/// The HTTP server's state, shared with the scheduler loop.
pub struct Server {
    metrics: Arc<Metrics>,
    /// Every required watch has listed.
    pub ready: AtomicBool,
    /// This replica holds the lease.
    pub leader: AtomicBool,
    /// What keeps the scheduler from working (a watch it may not make):
    /// `/healthz` and `/readyz` fail with it.
    problem: Mutex<Option<String>>,
    latest: Mutex<Option<Arc<Latest>>>,
    auth: HttpAuth,
    client: Client,
    shared: Shared,
    lease: Option<(String, String)>,
    cache: Mutex<BTreeMap<(String, String), (Instant, Verdict)>>,
}

fn reply(code: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn error(
    code: StatusCode,
    msg: impl Into<String>,
    leader: Option<String>,
) -> Response<Full<Bytes>> {
    let mut v = json!({"error": msg.into()});
    if let Some(l) = leader {
        v["leader"] = json!(l);
    }
    reply(code, "application/json", format!("{v}\n"))
}

fn bearer(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

impl Server {
    /// A server for `client`'s cluster; `lease`: `(namespace, name)` of the
    /// leader lease, to name the leader from a standby.
    pub fn new(
        metrics: Arc<Metrics>,
        auth: HttpAuth,
        client: Client,
        shared: Shared,
        lease: Option<(String, String)>,
        leader: bool,
    ) -> Self {
        Server {
            metrics,
            ready: AtomicBool::new(false),
            leader: AtomicBool::new(leader),
            problem: Mutex::new(None),
            latest: Mutex::new(None),
            auth,
            client,
            shared,
            lease,
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// Sets (or clears) what keeps the scheduler from working.
    pub fn set_problem(&self, p: Option<String>) {
        *self.problem.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }

    fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keeps a cycle's input and output for the debug endpoint.
    pub fn publish(&self, built: Built, out: CycleOutput, now_ms: u64) {
        let new = Arc::new(Latest { built, out, now_ms });
        // the old one is dropped after the lock is released
        let old = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(new);
        drop(old);
    }

    fn latest(&self) -> Option<Arc<Latest>> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_string();
        if (path == "/healthz" || path == "/readyz")
            && let Some(p) = self.problem()
        {
            return reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{p}\n"),
            );
        }
        match path.as_str() {
            "/healthz" => return reply(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" if self.ready.load(Ordering::SeqCst) => {
                let body = if self.leader.load(Ordering::SeqCst) {
                    "ready (leader)\n"
                } else {
                    "ready (standby)\n"
                };
                return reply(StatusCode::OK, "text/plain", body.into());
            }
            "/readyz" => {
                return reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "watches not synced\n".into(),
                );
            }
            _ => {}
        }
        let metrics = path == "/metrics" || path == "/gpusched/metrics";
        let protected = metrics || debug_rest(&path).is_some();
        if !protected {
            return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
        }
        if req.method() != hyper::Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "only GET", None);
        }
        if self.auth == HttpAuth::Delegated {
            let h = req.headers();
            let token = [hyper::header::AUTHORIZATION.as_str(), FORWARDED_AUTH_HEADER]
                .iter()
                .find_map(|name| h.get(*name)?.to_str().ok().and_then(bearer))
                .map(str::to_string);
            let verdict = match token {
                None => Verdict::Unauthenticated("a bearer token is required".into()),
                Some(t) => self.authorize(&t, &path).await,
            };
            match verdict {
                Verdict::Allowed => {}
                Verdict::Unauthenticated(m) => {
                    return error(StatusCode::UNAUTHORIZED, m, None);
                }
                Verdict::Forbidden(m) => return error(StatusCode::FORBIDDEN, m, None),
            }
        }
        if metrics {
            return reply(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.render(),
            );
        }
        self.debug(&path).await
    }

    async fn leader_name(&self) -> Option<String> {
        let (ns, name) = self.lease.as_ref()?;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name).await.ok()??.spec?.holder_identity
    }

    async fn debug(&self, path: &str) -> Response<Full<Bytes>> {
        let rest = debug_rest(path).unwrap_or_default();
        let parts: Vec<&str> = rest.split('/').collect();
        let route = match parts.as_slice() {
            ["pods", ns, name] if !ns.is_empty() && !name.is_empty() => {
                Some(Route::Pod(format!("{ns}/{name}")))
            }
            ["queues", name] if !name.is_empty() => Some(Route::Queue(name.to_string())),
            ["pending"] | ["pending", ""] => Some(Route::Pending(None)),
            ["pending", name] => Some(Route::Pending(Some(name.to_string()))),
            _ => None,
        };
        let Some(route) = route else {
            return error(
                StatusCode::NOT_FOUND,
                format!(
                    "unknown debug path {path:?}: use /gpusched/debug/pods/NAMESPACE/NAME, /gpusched/debug/queues/NAME or /gpusched/debug/pending[/QUEUE]"
                ),
                None,
            );
        };
        if !self.leader.load(Ordering::SeqCst) {
            let leader = self.leader_name().await;
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                match &leader {
                    Some(l) => format!("this replica is a standby; ask the leader {l}"),
                    None => "this replica is a standby; the leader is not known".into(),
                },
                leader,
            );
        }
        let Some(latest) = self.latest() else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no cycle has run yet (watches still listing?)",
                None,
            );
        };
        let view = CycleView {
            snapshot: &latest.built.snapshot,
            output: &latest.out,
            now_ms: latest.now_ms,
        };
        let body = match route {
            Route::Pod(key) => match self.pod(&latest, &view, &key) {
                Some(r) => serde_json::to_string_pretty(&r),
                None => {
                    return error(
                        StatusCode::NOT_FOUND,
                        format!(
                            "pod {key} is not in the last cycle (not found, or pending for another scheduler)"
                        ),
                        None,
                    );
                }
            },
            Route::Queue(key) => match self.queue(&latest, &view, &key) {
                Some(r) => serde_json::to_string_pretty(&r),
                None => {
                    return error(
                        StatusCode::NOT_FOUND,
                        format!("queue {key} is not in the last cycle"),
                        None,
                    );
                }
            },
            Route::Pending(queue) => {
                let classes = gpusched_core::report::classify::classify_cycle(
                    &latest.out,
                    &latest.built.snapshot,
                );
                let reason_of = |p| {
                    classes
                        .get(&p)
                        .and_then(|cs: &Vec<gpusched_core::report::classify::PendingClass>| {
                            cs.first()
                        })
                        .map(|c| c.reason_name().to_string())
                };
                match report::pending_list(&view, queue.as_deref(), &reason_of) {
                    Some(r) => serde_json::to_string_pretty(&r),
                    None => {
                        return error(
                            StatusCode::NOT_FOUND,
                            format!(
                                "queue {} is not in the last cycle",
                                queue.unwrap_or_default()
                            ),
                            None,
                        );
                    }
                }
            }
        };
        match body {
            Ok(b) => reply(StatusCode::OK, "application/json", b + "\n"),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), None),
        }
    }

    fn queue_label(&self, uid: &str) -> String {
        self.shared
            .with(|w| w.pod(uid).and_then(|v| v.queue_label.clone()))
            .unwrap_or_else(|| crate::translate::DEFAULT_QUEUE.to_string())
    }

    fn pod(&self, latest: &Latest, view: &CycleView<'_>, key: &str) -> Option<PodReport> {
        if let Some(i) = latest
            .built
            .pods
            .iter()
            .position(|p| format!("{}/{}", p.namespace, p.name) == key)
        {
            let name = &latest.built.snapshot.pods.get(i)?.pod.name;
            return report::pod_report(view, name);
        }
        latest.built.problems.iter().find_map(|p| {
            let (pod, status) = match p {
                Problem::GatedPod { pod, gates } => (
                    pod,
                    PodStatus::Gated {
                        gates: gates.clone(),
                    },
                ),
                Problem::InvalidPod { pod, error } => (
                    pod,
                    PodStatus::Invalid {
                        error: error.clone(),
                    },
                ),
                Problem::ClaimsPending {
                    pod,
                    message,
                    class,
                } => (
                    pod,
                    PodStatus::Pending {
                        verdict: None,
                        classes: vec![*class],
                        condition: Some(class.condition_reason().to_string()),
                        message: message.clone(),
                        reasons: Vec::new(),
                        evictions: Vec::new(),
                        queue_position: None,
                        nominated: None,
                    },
                ),
                _ => return None,
            };
            (format!("{}/{}", pod.namespace, pod.name) == key).then(|| {
                PodReport::outside(
                    key.to_string(),
                    self.queue_label(&pod.uid),
                    status,
                    latest.now_ms,
                )
            })
        })
    }

    fn queue(
        &self,
        latest: &Latest,
        view: &CycleView<'_>,
        name: &str,
    ) -> Option<report::QueueReport> {
        // the core's classification (what the Queue's status shows), plus
        // the gated and invalid pods the core never sees
        let mut r = report::queue_report(view, name)?;
        // its subtree's, as the Queue status counts them
        let (tree, _) = report::queue_tree(&latest.built.snapshot);
        let unseen = gpusched_core::report::classify::roll_up(
            &tree,
            latest
                .built
                .unseen_by_queue
                .iter()
                .map(|(q, m)| (q.as_str(), m)),
        );
        for (c, n) in unseen.get(name).into_iter().flatten() {
            *r.pending_by_reason
                .entry(c.reason_name().to_string())
                .or_default() += n;
        }
        Some(r)
    }

    async fn authorize(&self, token: &str, path: &str) -> Verdict {
        let key = (token.to_string(), path.to_string());
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, v)) = cache.get(&key)
                && at.elapsed() < AUTH_TTL
            {
                return v.clone();
            }
        }
        let v = match self.review(token, path).await {
            Ok(v) => v,
            // an apiserver error is not cached
            Err(e) => return Verdict::Unauthenticated(format!("could not check the token: {e:#}")),
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= AUTH_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), v.clone()));
        v
    }

    async fn review(&self, token: &str, path: &str) -> anyhow::Result<Verdict> {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let tr = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &tr)
            .await
            .context("TokenReview")?;
        let status = tr.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(Verdict::Unauthenticated(format!(
                "invalid token{}",
                status.error.map(|e| format!(": {e}")).unwrap_or_default()
            )));
        }
        let user = status.user.unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let sar = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .context("SubjectAccessReview")?;
        let status = sar.status.unwrap_or_default();
        let who = user.username.unwrap_or_default();
        if status.allowed {
            Ok(Verdict::Allowed)
        } else {
            Ok(Verdict::Forbidden(format!(
                "user {who:?} may not get {path}{}",
                status
                    .reason
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )))
        }
    }
}

/// Serves `server` on `addr` until `stop` turns true: HTTPS unless `tls`
/// is [`crate::tls::Tls::Off`]. A bad certificate or key fails here, before
/// anything is served.
pub async fn serve(
    addr: std::net::SocketAddr,
    tls: &crate::tls::Tls,
    server: Arc<Server>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let acceptor = crate::tls::acceptor(tls)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    tracing::info!(
        auth = ?server.auth,
        "serving /metrics, /debug, /healthz, /readyz on {scheme}://{}",
        listener.local_addr()?
    );
    if let Some((_, Some(pem))) = &acceptor {
        tracing::info!(
            "serving a self-signed certificate (no --tls-cert-file); clients that verify it need:\n{pem}"
        );
    }
    let acceptor = acceptor.map(|(a, _)| a);
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Ok((stream, peer)) = conn else { continue };
            let server = server.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let server = server.clone();
                    async move { Ok::<_, std::convert::Infallible>(server.handle(req).await) }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    None => {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    }
                    Some(a) => {
                        // a client that never finishes its handshake must
                        // not hold a task forever
                        let hs = tokio::time::timeout(Duration::from_secs(10), a.accept(stream));
                        match hs.await {
                            Ok(Ok(tls)) => {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                                    .await;
                            }
                            Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                        }
                    }
                }
            });
        }
    });
    Ok(())
}
