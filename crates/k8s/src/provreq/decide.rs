//! The pure decision: from what the last cycle said of each gang
//! ([`gangs`]) and the requests that exist for it ([`pr_state`]) to a
//! [`Plan`] ([`decide`]).

use super::*;

/// Why a gang's pending members wait, as far as requests are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Every pending member reads `Unschedulable`: more nodes would let
    /// the gang run.
    Capacity,
    /// gpusched itself holds the gang (its quota, an incomplete gang, …):
    /// the `PodScheduled` reason that says so.
    Held(String),
    /// It fits now, or waits for nodes being freed or provisioned for it.
    Waiting,
}

/// A pending member of a gang.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
}

/// A gang with pending members, as the last cycle saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangState {
    /// Its namespace.
    pub namespace: String,
    /// Why it waits.
    pub blocked: Blocked,
    /// Its pending members, by name.
    pub pending: Vec<Member>,
}

/// The gangs with pending members of one cycle, by group name
/// (`namespace/…`). Pods bound by the cycle are not pending; a gang none
/// of whose members is pending is absent (it runs, or is gone).
pub fn gangs(
    built: &Built,
    out: &CycleOutput,
    classes: &BTreeMap<PodId, Vec<PendingClass>>,
) -> BTreeMap<String, GangState> {
    let bound = out.bound_pods();
    let mut reasons: BTreeMap<String, (String, BTreeSet<&'static str>, Vec<Member>)> =
        BTreeMap::new();
    for e in &out.explanations {
        if bound.contains(&e.pod) {
            continue;
        }
        let (Some(ps), Some(pr)) = (
            built.snapshot.pods.get(e.pod as usize),
            built.pods.get(e.pod as usize),
        ) else {
            continue;
        };
        let Some(group) = ps.pod.group.as_ref() else {
            continue;
        };
        if !ps.is_pending() {
            continue;
        }
        let cls = classes.get(&e.pod).map(Vec::as_slice).unwrap_or(&[]);
        let reason = gpusched_core::report::classify::condition_reason(e, cls);
        let entry = reasons
            .entry(group.clone())
            .or_insert_with(|| (pr.namespace.clone(), BTreeSet::new(), Vec::new()));
        entry.1.insert(reason);
        entry.2.push(Member {
            uid: pr.uid.clone(),
            name: pr.name.clone(),
        });
    }
    reasons
        .into_iter()
        .map(|(g, (namespace, rs, mut pending))| {
            pending.sort();
            let waiting = [
                PendingClass::WaitingForNode.condition_reason(),
                PendingClass::FitsNow.condition_reason(),
            ];
            let held = rs
                .iter()
                .find(|r| **r != "Unschedulable" && !waiting.contains(r));
            let blocked = match held {
                Some(r) => Blocked::Held((*r).to_string()),
                None if rs.iter().all(|r| *r == "Unschedulable") => Blocked::Capacity,
                None => Blocked::Waiting,
            };
            (
                g,
                GangState {
                    namespace,
                    blocked,
                    pending,
                },
            )
        })
        .collect()
}

/// Where a request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrPhase {
    /// Not answered yet (or `Accepted`).
    Waiting,
    /// `Provisioned=True`: the capacity is there (booked for the gang).
    Provisioned,
    /// `Failed`, `BookingExpired` or `CapacityRevoked` is `True`: this
    /// request will not (or no longer) give the gang capacity.
    Failed {
        /// Which of the three.
        condition: String,
        /// Its reason and message.
        why: String,
        /// When it became true (Unix ms; 0 when not given).
        at_ms: u64,
    },
}

/// A request gpusched wrote for a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrState {
    /// Its name.
    pub name: String,
    /// Its attempt number (1 for the first request of the gang).
    pub attempt: u32,
    /// Its creation (Unix ms).
    pub created_ms: u64,
    /// What the autoscaler says.
    pub phase: PrPhase,
}

fn rfc3339_ms(s: &str) -> Option<u64> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .and_then(|t| u64::try_from(t.as_millisecond()).ok())
}

/// The phase of a request from its conditions. A failure condition wins
/// over `Provisioned` (a booking that expired was provisioned first).
pub fn phase(status: Option<&ProvisioningRequestStatus>) -> PrPhase {
    let conds = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let is_true = |t: &str| conds.iter().find(|c| c.type_ == t && c.status == "True");
    for t in ["Failed", "CapacityRevoked", "BookingExpired"] {
        if let Some(c) = is_true(t) {
            let why = match (c.reason.as_deref(), c.message.as_deref()) {
                (Some(r), Some(m)) if !m.is_empty() => format!("{r}: {m}"),
                (Some(r), _) => r.to_string(),
                (None, Some(m)) => m.to_string(),
                (None, None) => String::new(),
            };
            return PrPhase::Failed {
                condition: t.to_string(),
                why,
                at_ms: c
                    .last_transition_time
                    .as_deref()
                    .and_then(rfc3339_ms)
                    .unwrap_or(0),
            };
        }
    }
    if is_true("Provisioned").is_some() {
        PrPhase::Provisioned
    } else {
        PrPhase::Waiting
    }
}

/// The gang a request of ours is for, and its state (`None`: not one of
/// ours, or its annotations are unreadable).
pub fn pr_state(pr: &ProvisioningRequest) -> Option<(String, PrState)> {
    let ann = pr.metadata.annotations.as_ref()?;
    let gang = ann.get(ANNOTATION_GANG)?.clone();
    let attempt = ann.get(ANNOTATION_ATTEMPT)?.parse().ok()?;
    let created_ms = pr
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
        .unwrap_or(0);
    Some((
        gang,
        PrState {
            name: pr.metadata.name.clone()?,
            attempt,
            created_ms,
            phase: phase(pr.status.as_ref()),
        },
    ))
}

/// What to do next for a gang (after the deletions of its [`Plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: no request wanted, none to watch.
    Nothing,
    /// Write request number `attempt` for the gang.
    Create {
        /// Its attempt number.
        attempt: u32,
    },
    /// The request is pending: the members wait for it.
    Pending {
        /// Its name.
        pr: String,
    },
    /// The request is provisioned: reserve the nodes that came for it.
    Reserve {
        /// Its name.
        pr: String,
        /// Its creation (Unix ms): nodes created since came for it.
        since_ms: u64,
    },
    /// The request failed; a new one is written at `until_ms`.
    Backoff {
        /// Its name.
        pr: String,
        /// What failed and why.
        why: String,
        /// When the next attempt is made (Unix ms).
        until_ms: u64,
    },
}

/// A gang's plan: requests to delete (with why), then [`Next`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Requests to delete, and why.
    pub delete: Vec<(String, String)>,
    /// What then.
    pub next: Next,
}

/// The plan for one gang: `gang` is what the last cycle said of it
/// (`None`: no member pending — it runs or is gone), `prs` the requests
/// gpusched wrote for it. Pure.
///
/// - No member pending, or gpusched holds the gang (quota, incomplete …):
///   every request is deleted; none is written.
/// - Capacity-blocked and no request: request 1 is written.
/// - The newest request pending → the members wait for it; provisioned →
///   its nodes are reserved for the gang; failed (`Failed`,
///   `BookingExpired`, `CapacityRevoked`) → kept (its status says why)
///   until the backoff of its attempt has passed, then replaced by the
///   next attempt if the gang still needs capacity.
/// - Older requests than the newest are deleted.
pub fn decide(gang: Option<&GangState>, prs: &[PrState], now_ms: u64, cfg: &Config) -> Plan {
    let mut delete = Vec::new();
    let newest = prs.iter().max_by_key(|p| (p.attempt, &p.name));
    for p in prs {
        if newest.is_some_and(|n| n.name != p.name) {
            delete.push((p.name.clone(), "superseded by a newer request".to_string()));
        }
    }
    let reason = match gang {
        None => Some("the gang has no pending member (it runs, or is gone)".to_string()),
        Some(GangState {
            blocked: Blocked::Held(r),
            ..
        }) => Some(format!(
            "gpusched holds the gang ({r}): new nodes would not start it"
        )),
        Some(_) => None,
    };
    if let Some(why) = reason {
        if let Some(n) = newest {
            delete.push((n.name.clone(), why));
        }
        return Plan {
            delete,
            next: Next::Nothing,
        };
    }
    let blocked = gang.map(|g| &g.blocked);
    let next = match newest {
        None if blocked == Some(&Blocked::Capacity) => Next::Create { attempt: 1 },
        None => Next::Nothing,
        Some(n) => match &n.phase {
            PrPhase::Waiting => Next::Pending { pr: n.name.clone() },
            PrPhase::Provisioned => Next::Reserve {
                pr: n.name.clone(),
                since_ms: n.created_ms,
            },
            PrPhase::Failed {
                condition,
                why,
                at_ms,
            } => {
                let until_ms = at_ms.saturating_add(cfg.backoff(n.attempt).as_millis() as u64);
                let why = if why.is_empty() {
                    condition.clone()
                } else {
                    format!("{condition} ({why})")
                };
                if now_ms < until_ms {
                    Next::Backoff {
                        pr: n.name.clone(),
                        why,
                        until_ms,
                    }
                } else if blocked == Some(&Blocked::Capacity) {
                    delete.push((n.name.clone(), format!("{why}; replaced by a new request")));
                    Next::Create {
                        attempt: n.attempt + 1,
                    }
                } else {
                    Next::Backoff {
                        pr: n.name.clone(),
                        why,
                        until_ms,
                    }
                }
            }
        },
    };
    Plan { delete, next }
}
