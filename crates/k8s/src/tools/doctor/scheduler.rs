//! `doctor`'s checks of the scheduler itself: its Deployment's replicas are
//! ready, a replica holds the lease (and renews it), `/readyz` answers, and
//! its ServiceAccount holds every permission [`crate::rbac`] lists (a
//! SubjectAccessReview each). The facts are gathered here; [`findings`] is
//! pure and unit-tested.

use super::{Finding, Status};
use crate::rbac;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::{Api, Client};

const CHECK: &str = "scheduler";

/// Where the scheduler is installed (the chart's names by default).
#[derive(Clone, Debug)]
pub struct SchedulerTarget {
    /// Namespace of the Deployment, Lease, Service and ServiceAccount.
    pub namespace: String,
    /// The Deployment.
    pub deployment: String,
    /// The Lease (`--lease-name`).
    pub lease: String,
    /// The ServiceAccount the scheduler runs as.
    pub service_account: String,
    /// The Service in front of its HTTP port (for `/readyz` through the
    /// apiserver's proxy).
    pub service: String,
    /// The scheduler's HTTP address instead of the proxy (e.g.
    /// `http://127.0.0.1:10259`).
    pub endpoint: Option<String>,
}

impl Default for SchedulerTarget {
    fn default() -> Self {
        SchedulerTarget {
            namespace: "gpusched-system".into(),
            deployment: "gpusched-scheduler".into(),
            lease: "gpusched".into(),
            service_account: "gpusched-scheduler".into(),
            service: "gpusched-scheduler-metrics".into(),
            endpoint: None,
        }
    }
}

/// What the scheduler's Lease says.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseFacts {
    /// Who holds it (`None`: nobody).
    pub holder: Option<String>,
    /// Seconds since it was last renewed (`None`: never).
    pub renewed_ago_s: Option<i64>,
    /// Its duration in seconds.
    pub duration_s: i64,
}

/// What was read of the scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerFacts {
    /// `(wanted, ready)` replicas; `None`: no such Deployment; `Err`: could not read.
    pub deployment: Result<Option<(i32, i32)>, String>,
    /// The Lease; `None`: no Lease.
    pub lease: Result<Option<LeaseFacts>, String>,
    /// `/readyz`: `Ok(body)` on 200, else what went wrong.
    pub readyz: Result<String, NotReady>,
    /// Permissions denied to the ServiceAccount (`verb resource.group`).
    pub denied: Result<Vec<String>, String>,
    /// How many permissions were checked.
    pub checked: usize,
    /// Whether the ServiceAccount exists (`None`: could not read it). When
    /// it does not, its permissions are not checked: one finding says so,
    /// not every verb denied.
    pub service_account: Option<bool>,
}

/// Why `/readyz` gave no 200.
#[derive(Clone, Debug, PartialEq)]
pub enum NotReady {
    /// No Service to reach it through (without `--scheduler-endpoint`):
    /// nothing was asked, so nothing is known of a scheduler run elsewhere.
    NoService,
    /// Anything else, said.
    Failed(String),
}

impl NotReady {
    fn text(&self, t: &SchedulerTarget) -> String {
        match self {
            NotReady::NoService => format!("no Service {}/{}", t.namespace, t.service),
            NotReady::Failed(e) => e.clone(),
        }
    }
}

/// Reads the facts (each failure is kept, not fatal).
pub async fn gather(client: &Client, t: &SchedulerTarget, now_s: i64) -> SchedulerFacts {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &t.namespace);
    let deployment = match deployments.get_opt(&t.deployment).await {
        Ok(Some(d)) => {
            let wanted = d.spec.replicas.unwrap_or(1);
            let ready = d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            Ok(Some((wanted, ready)))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), &t.namespace);
    let lease = match leases.get_opt(&t.lease).await {
        Ok(Some(l)) => {
            let spec = l.spec.unwrap_or_default();
            let age = spec.renew_time.as_ref().map(|r| now_s - r.0.as_second());
            Ok(Some(LeaseFacts {
                holder: spec.holder_identity.filter(|h| !h.is_empty()),
                renewed_ago_s: age,
                duration_s: i64::from(spec.lease_duration_seconds.unwrap_or(15)),
            }))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    };
    let readyz = readyz(client, t).await;
    let user = format!(
        "system:serviceaccount:{}:{}",
        t.namespace, t.service_account
    );
    let mut denied = Ok(Vec::new());
    let mut checked = 0;
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), &t.namespace);
    let service_account = accounts
        .get_opt(&t.service_account)
        .await
        .ok()
        .map(|a| a.is_some());
    if service_account == Some(false) {
        return SchedulerFacts {
            deployment,
            lease,
            readyz,
            denied,
            checked,
            service_account,
        };
    }
    let sars: Api<SubjectAccessReview> = Api::all(client.clone());
    let wanted = rbac::CLUSTER
        .iter()
        .map(|p| (p, None))
        .chain(rbac::LEASE.iter().map(|p| (p, Some(t.namespace.clone()))));
    'all: for (p, ns) in wanted {
        for verb in p.verbs {
            let (resource, sub) = match p.resource.split_once('/') {
                Some((r, s)) => (r.to_string(), Some(s.to_string())),
                None => (p.resource.to_string(), None),
            };
            let sar = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.clone()),
                    groups: Some(vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{}", t.namespace),
                        "system:authenticated".into(),
                    ]),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(p.group.to_string()),
                        resource: Some(resource),
                        subresource: sub,
                        verb: Some(verb.to_string()),
                        namespace: ns.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            checked += 1;
            match sars.create(&PostParams::default(), &sar).await {
                Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
                Ok(_) => {
                    if let Ok(d) = denied.as_mut() {
                        d.push(rbac::describe(p.group, p.resource, verb));
                    }
                }
                Err(e) => {
                    denied = Err(e.to_string());
                    break 'all;
                }
            }
        }
    }
    SchedulerFacts {
        deployment,
        lease,
        readyz,
        denied,
        checked,
        service_account,
    }
}

/// `GET /readyz` of the scheduler: directly when an endpoint is given, else
/// through the apiserver's proxy to the Service (the leader's pod when a
/// standby answers).
async fn readyz(client: &Client, t: &SchedulerTarget) -> Result<String, NotReady> {
    use crate::tools::debug_client::{Target, fetch};
    let target = match &t.endpoint {
        // /readyz says nothing secret: the scheduler's own self-signed
        // certificate (the chart's default) is accepted
        Some(url) => Target::Endpoint {
            url: url.clone(),
            token: None,
            ca: None,
            insecure: true,
        },
        None => {
            let (port, https, pod_port) = service_port(client, t).await?;
            Target::Proxy {
                namespace: t.namespace.clone(),
                service: t.service.clone(),
                port,
                pod_port,
                token: None,
                https,
            }
        }
    };
    let failed = NotReady::Failed;
    // the apiserver's proxy answers 503 while it finds no endpoint, and
    // the client retries those: bounded here
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        fetch(&target, Some(client), "/readyz"),
    )
    .await
    .map_err(|_| failed("no answer within 15 s".to_string()))?
    .map_err(|e| failed(format!("{e:#}")))?;
    let body = r.body.trim();
    match r.status {
        200 => Ok(body.to_string()),
        503 if body.contains("no endpoints available") => Err(failed(format!(
            "the Service {}/{} has no ready endpoints",
            t.namespace, t.service
        ))),
        404 if t.endpoint.is_none() => Err(NotReady::NoService),
        s => Err(failed(format!(
            "HTTP {s}: {}",
            body.lines().next().unwrap_or_default()
        ))),
    }
}

/// The Service's first port (name, HTTPS?, target port number) once it
/// exists and one of its EndpointSlices has a ready endpoint (else the
/// proxy has nowhere to go: said plainly instead of a 503).
async fn service_port(
    client: &Client,
    t: &SchedulerTarget,
) -> Result<(String, bool, u16), NotReady> {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let failed = NotReady::Failed;
    let services: Api<Service> = Api::namespaced(client.clone(), &t.namespace);
    let svc = match services.get_opt(&t.service).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(NotReady::NoService),
        Err(e) => return Err(failed(format!("reading the Service: {e}"))),
    };
    let port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref()?.first().cloned())
        .ok_or_else(|| {
            failed(format!(
                "the Service {}/{} has no port",
                t.namespace, t.service
            ))
        })?;
    let name = port.name.clone().unwrap_or_else(|| port.port.to_string());
    let https = name == "https" || port.app_protocol.as_deref() == Some("https");
    let pod_port = match &port.target_port {
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => *n as u16,
        _ => port.port as u16,
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &t.namespace);
    let lp = kube::api::ListParams::default()
        .labels(&format!("kubernetes.io/service-name={}", t.service));
    let list = slices
        .list(&lp)
        .await
        .map_err(|e| failed(format!("listing its EndpointSlices: {e}")))?;
    let ready = list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true));
    if ready {
        Ok((name, https, pod_port))
    } else {
        Err(failed(format!(
            "the Service {}/{} has no ready endpoints (no scheduler pod is ready)",
            t.namespace, t.service
        )))
    }
}

/// The findings for these facts.
pub fn findings(f: &SchedulerFacts, t: &SchedulerTarget) -> Vec<Finding> {
    const OUTSIDE_HINT: &str = "--scheduler-namespace names where the chart is installed; --scheduler-endpoint URL (or $GPUSCHED_ENDPOINT) checks a scheduler run outside the cluster";
    let mut out = Vec::new();
    let no_service = f.readyz == Err(NotReady::NoService);
    let dep = format!("deployment/{}/{}", t.namespace, t.deployment);
    out.push(match &f.deployment {
        Ok(Some((wanted, ready))) if *ready >= *wanted && *wanted > 0 => Finding::new(
            CHECK,
            Status::Ok,
            &dep,
            format!("{ready}/{wanted} replicas ready"),
            "",
        ),
        Ok(Some((wanted, 0))) => Finding::new(
            CHECK,
            Status::Fail,
            &dep,
            format!("0/{wanted} replicas ready: no scheduler runs, gpusched pods stay pending"),
            format!(
                "kubectl -n {} describe deployment {}; kubectl -n {} logs deployment/{}",
                t.namespace, t.deployment, t.namespace, t.deployment
            ),
        ),
        Ok(Some((wanted, ready))) => Finding::new(
            CHECK,
            Status::Warn,
            &dep,
            format!("{ready}/{wanted} replicas ready: no standby to take over"),
            format!(
                "kubectl -n {} get pods -l app.kubernetes.io/name=gpusched-scheduler",
                t.namespace
            ),
        ),
        // run outside the cluster and named by --scheduler-endpoint: no
        // Deployment is expected
        Ok(None) if t.endpoint.is_some() => Finding::new(
            CHECK,
            Status::Ok,
            &dep,
            "none in the cluster: the scheduler at --scheduler-endpoint is checked instead",
            "",
        ),
        // nor its Service: one line for both (readiness not checked), not
        // a "not ready" for a scheduler that may well run elsewhere
        Ok(None) if no_service => Finding::new(
            CHECK,
            Status::Warn,
            &dep,
            format!(
                "not found, nor the Service {}: readiness not checked (a scheduler installed elsewhere, or run outside the cluster?)",
                t.service
            ),
            OUTSIDE_HINT,
        ),
        Ok(None) => Finding::new(
            CHECK,
            Status::Warn,
            &dep,
            "not found (a scheduler installed elsewhere, or run outside the cluster?)",
            OUTSIDE_HINT,
        ),
        Err(e) => Finding::new(
            CHECK,
            Status::Warn,
            &dep,
            format!("cannot read it: {e}"),
            "",
        ),
    });
    let lease = format!("lease/{}/{}", t.namespace, t.lease);
    out.push(match &f.lease {
        Ok(Some(LeaseFacts {
            holder: Some(holder),
            renewed_ago_s: Some(age),
            duration_s,
        })) if age <= duration_s => Finding::new(
            CHECK,
            Status::Ok,
            &lease,
            format!("held by {holder}, renewed {age}s ago"),
            "",
        ),
        Ok(Some(LeaseFacts {
            holder: Some(holder),
            renewed_ago_s: age,
            duration_s,
        })) => Finding::new(
            CHECK,
            Status::Fail,
            &lease,
            format!(
                "held by {holder} but not renewed for {} (lease {duration_s}s): no replica leads",
                age.map(|a| format!("{a}s"))
                    .unwrap_or_else(|| "ever".into())
            ),
            "the leader may be stuck or partitioned from the apiserver: look at its log",
        ),
        Ok(Some(LeaseFacts { holder: None, .. })) => Finding::new(
            CHECK,
            Status::Fail,
            &lease,
            "nobody holds it: no replica leads",
            "a replica takes it within a lease period once one runs; check the Deployment",
        ),
        Ok(None) => Finding::new(
            CHECK,
            Status::Warn,
            &lease,
            "no such Lease (leader election off, or another --lease-name)",
            "",
        ),
        Err(e) => Finding::new(
            CHECK,
            Status::Warn,
            &lease,
            format!("cannot read it: {e}"),
            "",
        ),
    });
    let readyz = "readyz".to_string();
    out.extend(match &f.readyz {
        // said by the Deployment's line
        Err(NotReady::NoService) if f.deployment == Ok(None) => None,
        Ok(body) => Some(Finding::new(
            CHECK,
            Status::Ok,
            &readyz,
            format!("ready: {}", body.trim()),
            "",
        )),
        Err(e) => Some(Finding::new(
            CHECK,
            if f.deployment == Ok(None) {
                Status::Warn
            } else {
                Status::Fail
            },
            &readyz,
            format!("not ready: {}", e.text(t)),
            "a 503 body names what the scheduler waits for (a watch not synced, a missing permission)",
        )),
    });
    let sa = format!("serviceaccount/{}/{}", t.namespace, t.service_account);
    out.push(match &f.denied {
        // one line, not every verb "denied" to an account that is not there
        _ if f.service_account == Some(false) && t.endpoint.is_some() => Finding::new(
            CHECK,
            Status::Ok,
            &sa,
            "none in the cluster: the scheduler at --scheduler-endpoint runs with its own credentials; permissions not checked",
            "",
        ),
        _ if f.service_account == Some(false) => Finding::new(
            CHECK,
            Status::Warn,
            &sa,
            "not found: permissions not checked (a scheduler installed elsewhere, or run outside the cluster?)",
            "--scheduler-namespace names where the chart is installed",
        ),
        Ok(d) if d.is_empty() => Finding::new(
            CHECK,
            Status::Ok,
            &sa,
            format!("all {} permissions the scheduler uses are granted", f.checked),
            "",
        ),
        Ok(d) => Finding::new(
            CHECK,
            Status::Fail,
            &sa,
            format!("denied: {}", d.join(", ")),
            "grant them as deploy/helm/gpusched/templates/scheduler-rbac.yaml does (crates/k8s/src/rbac.rs says what uses each)",
        ),
        Err(e) => Finding::new(
            CHECK,
            Status::Warn,
            &sa,
            format!("cannot check its permissions: {e}"),
            "doctor needs create on subjectaccessreviews.authorization.k8s.io",
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> SchedulerFacts {
        SchedulerFacts {
            deployment: Ok(Some((2, 2))),
            lease: Ok(Some(LeaseFacts {
                holder: Some("sched-a".into()),
                renewed_ago_s: Some(3),
                duration_s: 15,
            })),
            readyz: Ok("ok (leader)".into()),
            denied: Ok(vec![]),
            checked: 20,
            service_account: Some(true),
        }
    }

    fn statuses(f: &SchedulerFacts) -> Vec<Status> {
        findings(f, &SchedulerTarget::default())
            .iter()
            .map(|f| f.status)
            .collect()
    }

    #[test]
    fn healthy_scheduler_is_all_ok() {
        let f = findings(&healthy(), &SchedulerTarget::default());
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:?}");
        assert!(f[1].message.contains("sched-a"), "{:?}", f[1]);
        assert!(f[3].message.contains("20"), "{:?}", f[3]);
    }

    #[test]
    fn each_problem_is_named() {
        let mut f = healthy();
        f.deployment = Ok(Some((2, 0)));
        assert_eq!(statuses(&f)[0], Status::Fail);
        f.deployment = Ok(Some((2, 1)));
        assert_eq!(statuses(&f)[0], Status::Warn);
        let mut f = healthy();
        f.lease = Ok(Some(LeaseFacts {
            holder: Some("old".into()),
            renewed_ago_s: Some(60),
            duration_s: 15,
        }));
        let fs = findings(&f, &SchedulerTarget::default());
        assert_eq!(fs[1].status, Status::Fail);
        assert!(fs[1].message.contains("60s"), "{:?}", fs[1]);
        f.lease = Ok(Some(LeaseFacts {
            holder: None,
            renewed_ago_s: None,
            duration_s: 15,
        }));
        assert_eq!(statuses(&f)[1], Status::Fail);
        let mut f = healthy();
        f.readyz = Err(NotReady::Failed(
            "the Service x/y has no ready endpoints".into(),
        ));
        assert_eq!(statuses(&f)[2], Status::Fail);
        let mut f = healthy();
        f.denied = Ok(vec!["create pods/binding".into()]);
        let fs = findings(&f, &SchedulerTarget::default());
        assert_eq!(fs[3].status, Status::Fail);
        assert!(fs[3].message.contains("create pods/binding"), "{:?}", fs[3]);
        // run outside the cluster: warnings, not failures
        let mut f = healthy();
        f.deployment = Ok(None);
        f.readyz = Err(NotReady::Failed("HTTP 500: boom".into()));
        assert_eq!(statuses(&f)[..3], [Status::Warn, Status::Ok, Status::Warn]);
        // a Deployment but no Service: its readiness is a failure, named
        let mut f = healthy();
        f.readyz = Err(NotReady::NoService);
        let fs = findings(&f, &SchedulerTarget::default());
        assert_eq!(fs[2].status, Status::Fail, "{:?}", fs[2]);
        assert!(
            fs[2]
                .message
                .contains("no Service gpusched-system/gpusched-scheduler-metrics"),
            "{:?}",
            fs[2]
        );
    }

    /// #39 item 1: neither Deployment nor Service (a scheduler run outside
    /// the cluster, asked without --scheduler-endpoint) is one warning,
    /// not a Deployment "not found" and a "not ready" besides.
    #[test]
    fn no_deployment_and_no_service_is_one_line() {
        let mut f = healthy();
        f.deployment = Ok(None);
        f.readyz = Err(NotReady::NoService);
        let fs = findings(&f, &SchedulerTarget::default());
        assert!(!fs.iter().any(|f| f.subject == "readyz"), "{fs:?}");
        let warned: Vec<_> = fs.iter().filter(|f| f.status != Status::Ok).collect();
        assert_eq!(warned.len(), 1, "{fs:?}");
        assert_eq!(warned[0].status, Status::Warn);
        assert!(
            warned[0].message.contains("nor the Service"),
            "{:?}",
            warned[0]
        );
        assert!(
            warned[0].hint.contains("GPUSCHED_ENDPOINT"),
            "{:?}",
            warned[0]
        );
    }

    /// #39 item 1: a ServiceAccount that does not exist is one line, not
    /// some 35 verbs "denied"; with --scheduler-endpoint (the try-out's
    /// scheduler runs outside the cluster) neither it nor the Deployment
    /// is expected.
    #[test]
    fn a_missing_account_is_one_line_and_expected_outside_the_cluster() {
        let mut f = healthy();
        f.deployment = Ok(None);
        f.service_account = Some(false);
        f.denied = Ok(Vec::new());
        let fs = findings(&f, &SchedulerTarget::default());
        assert_eq!(fs[3].status, Status::Warn);
        assert!(fs[3].message.starts_with("not found"), "{:?}", fs[3]);
        assert!(!fs[3].message.contains("denied"), "{:?}", fs[3]);
        let t = SchedulerTarget {
            endpoint: Some("http://127.0.0.1:1234".into()),
            ..Default::default()
        };
        let fs = findings(&f, &t);
        assert_eq!(fs[0].status, Status::Ok, "{:?}", fs[0]);
        assert_eq!(fs[3].status, Status::Ok, "{:?}", fs[3]);
    }
}
