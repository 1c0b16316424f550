//! What a PodGroup's status should be: its phase and its `Scheduled`
//! condition from the facts of its members ([`group_facts`]).

use super::*;

/// What a PodGroup's status follows from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupFacts {
    /// `spec.minMember` (0 when the spec is invalid).
    pub min_member: u32,
    /// Members bound or being bound.
    pub scheduled: u32,
    /// Members running.
    pub running: u32,
    /// Members pending (not bound, not being bound).
    pub pending: u32,
    /// The last cycle timed the group out.
    pub timed_out: bool,
    /// Why the spec cannot be used.
    pub invalid: Option<String>,
    /// Why its pending members wait: the most specific class among them
    /// and that member's message (the last cycle's explanations).
    pub waiting: Option<(PendingClass, String)>,
}

/// The phase a group should show. With members pending: `Running` once
/// minMember are placed, else `TimedOut` when the core gave up, else
/// `Inqueue` when enough members exist, else `Pending`. With no member
/// pending and fewer than minMember placed (members finished or deleted)
/// the phase stays what it is (a finished gang stays `Running`); `Pending`
/// if it has none yet. An invalid group is `Pending`.
pub fn wanted_phase(f: &GroupFacts, observed: Option<GroupPhase>) -> GroupPhase {
    if f.invalid.is_some() {
        GroupPhase::Pending
    } else if f.scheduled >= f.min_member.max(1) {
        GroupPhase::Running
    } else if f.timed_out {
        GroupPhase::TimedOut
    } else if f.pending > 0 && f.scheduled + f.pending >= f.min_member {
        GroupPhase::Inqueue
    } else if f.pending > 0 {
        GroupPhase::Pending
    } else {
        observed.unwrap_or(GroupPhase::Pending)
    }
}

/// Type of the PodGroup condition that says whether the gang is placed
/// and, while it is not, why (the reasons of [`PendingClass::reason_name`]).
pub const SCHEDULED_CONDITION: &str = "Scheduled";

/// The `Scheduled` condition for a group in `phase`, its time left at the
/// epoch for [`settle_conditions`].
pub fn scheduled_condition(f: &GroupFacts, phase: GroupPhase) -> Condition {
    let (status, reason, message) = if f.invalid.is_some() {
        (
            "False",
            "InvalidSpec",
            "the PodGroup's spec is invalid (see the Valid condition)".to_string(),
        )
    } else if phase == GroupPhase::Running {
        (
            "True",
            "Scheduled",
            format!(
                "{} of minMember {} members placed",
                f.scheduled, f.min_member
            ),
        )
    } else if phase == GroupPhase::TimedOut {
        let msg = f
            .waiting
            .as_ref()
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| "the gang gave up after its schedule timeout".into());
        ("False", PendingClass::GangTimedOut.reason_name(), msg)
    } else {
        match &f.waiting {
            Some((c, m)) => ("False", c.reason_name(), m.clone()),
            None => (
                "False",
                PendingClass::GangIncomplete.reason_name(),
                format!(
                    "{} of minMember {} members exist",
                    f.scheduled + f.pending,
                    f.min_member
                ),
            ),
        }
    };
    Condition {
        type_: SCHEDULED_CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message: crate::exec::clip(&message),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// The status a PodGroup should have (conditions still to be settled).
pub fn wanted_group(f: &GroupFacts, observed: Option<&PodGroupStatus>) -> PodGroupStatus {
    let phase = wanted_phase(f, observed.and_then(|o| o.phase));
    PodGroupStatus {
        phase: Some(phase),
        scheduled: f.scheduled,
        running: f.running,
        conditions: vec![
            valid_condition(f.invalid.as_deref()),
            scheduled_condition(f, phase),
        ],
    }
}

/// The facts of every gpusched PodGroup (`counts`: members scheduled and
/// running per group, from the world; `timed_out`: groups the last cycle
/// timed out).
pub fn group_facts(
    built: &Built,
    counts: &BTreeMap<String, (u32, u32)>,
    timed_out: &BTreeSet<String>,
    waiting: &BTreeMap<String, (PendingClass, String)>,
) -> BTreeMap<String, GroupFacts> {
    let mut pending: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &built.snapshot.pods {
        if p.is_pending()
            && let Some(g) = &p.pod.group
        {
            *pending.entry(g.as_str()).or_default() += 1;
        }
    }
    let min: BTreeMap<&str, u32> = built
        .snapshot
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.min_member))
        .collect();
    let mut invalid: BTreeMap<&str, &str> = BTreeMap::new();
    for p in &built.problems {
        if let Problem::InvalidGroup { group, error } = p {
            invalid.insert(group, error);
        }
    }
    counts
        .iter()
        .map(|(k, &(scheduled, running))| {
            let facts = GroupFacts {
                min_member: min.get(k.as_str()).copied().unwrap_or(0),
                scheduled,
                running,
                pending: pending.get(k.as_str()).copied().unwrap_or(0),
                timed_out: timed_out.contains(k),
                invalid: invalid.get(k.as_str()).map(|e| e.to_string()),
                waiting: waiting.get(k).cloned(),
            };
            (k.clone(), facts)
        })
        .collect()
}

/// Text of a phase for logs.
pub fn phase_text(p: Option<GroupPhase>) -> &'static str {
    p.map(phase_name).unwrap_or("-")
}
