use super::*;

use serde_json::json;

fn facts(min: u32, scheduled: u32, pending: u32) -> GroupFacts {
    GroupFacts {
        min_member: min,
        scheduled,
        running: scheduled,
        pending,
        ..Default::default()
    }
}

#[test]
fn phase_follows_the_members_not_the_order_of_writes() {
    use GroupPhase::*;
    // 4 of minMember 4 scheduled: Running, whatever was written before
    // (the group that stayed Pending with 4 running)
    for before in [None, Some(Pending), Some(Inqueue), Some(TimedOut)] {
        assert_eq!(wanted_phase(&facts(4, 4, 0), before), Running);
    }
    assert_eq!(wanted_phase(&facts(4, 1, 0), None), Pending);
    assert_eq!(wanted_phase(&facts(4, 1, 2), Some(Running)), Pending);
    assert_eq!(wanted_phase(&facts(4, 1, 3), Some(Pending)), Inqueue);
    let mut t = facts(4, 0, 4);
    t.timed_out = true;
    assert_eq!(wanted_phase(&t, Some(Inqueue)), TimedOut);
    // a finished gang (members gone, none pending) keeps its phase
    assert_eq!(wanted_phase(&facts(4, 0, 0), Some(Running)), Running);
    let mut bad = facts(4, 4, 0);
    bad.invalid = Some("minMember: must be 1 or more".into());
    assert_eq!(wanted_phase(&bad, Some(Running)), Pending);
}

#[test]
fn group_facts_count_pending_members_and_name_invalid_groups() {
    use gpusched_core::PodState;
    use gpusched_model::{Pod, PodGroup as MGroup};
    let mut built = Built::default();
    built.snapshot.groups.push(MGroup {
        name: "ml/four".into(),
        queue: "default".into(),
        min_member: 4,
        priority: 0,
        topology: None,
        schedule_timeout_ms: None,
    });
    for i in 0..3 {
        let mut p = Pod::new(format!("ml/four-{i}"), "default");
        p.group = Some("ml/four".into());
        built.snapshot.pods.push(PodState::pending(p));
    }
    built.problems.push(Problem::InvalidGroup {
        group: "ml/bad".into(),
        error: "spec.minMember: invalid value".into(),
    });
    let counts = BTreeMap::from([
        ("ml/four".to_string(), (1, 1)),
        ("ml/bad".to_string(), (0, 0)),
    ]);
    let timed_out = BTreeSet::from(["ml/four".to_string()]);
    let waiting = BTreeMap::from([(
        "ml/four".to_string(),
        (PendingClass::GangShort, "only 2 of the 4 fit".to_string()),
    )]);
    let f = group_facts(&built, &counts, &timed_out, &waiting);
    assert_eq!(
        f["ml/four"],
        GroupFacts {
            min_member: 4,
            scheduled: 1,
            running: 1,
            pending: 3,
            timed_out: true,
            invalid: None,
            waiting: Some((PendingClass::GangShort, "only 2 of the 4 fit".to_string())),
        }
    );
    assert_eq!(wanted_phase(&f["ml/four"], None), GroupPhase::TimedOut);
    assert_eq!(
        f["ml/bad"].invalid.as_deref(),
        Some("spec.minMember: invalid value")
    );
    let bad = wanted_group(&f["ml/bad"], None);
    assert_eq!(bad.phase, Some(GroupPhase::Pending));
    assert_eq!(bad.conditions[0].status, "False");
    assert_eq!(bad.conditions[1].reason, "InvalidSpec");
    // a group the world does not count (scheduler-plugins') is not ours
    assert_eq!(f.len(), 2);
}

/// `kubectl get podgroup -o yaml` says why the gang waits.
#[test]
fn the_scheduled_condition_says_why_the_gang_waits() {
    let cond = |f: &GroupFacts| {
        let w = wanted_group(f, None);
        let c = w.conditions[1].clone();
        assert_eq!(c.type_, SCHEDULED_CONDITION);
        (c.status, c.reason, c.message)
    };
    let mut f = facts(4, 1, 3);
    f.waiting = Some((PendingClass::Quota, "queue \"a\"'s limit …".into()));
    assert_eq!(
        cond(&f),
        (
            "False".into(),
            "QueueQuota".into(),
            "queue \"a\"'s limit …".into()
        )
    );
    f.waiting = Some((PendingClass::Topology, "no rack holds 4".into()));
    assert_eq!(cond(&f).1, "NoTopologyDomain");
    // members missing and nothing explained yet
    let f = facts(4, 0, 2);
    assert_eq!(
        cond(&f),
        (
            "False".into(),
            "GangIncomplete".into(),
            "2 of minMember 4 members exist".into()
        )
    );
    let mut f = facts(4, 0, 4);
    f.timed_out = true;
    assert_eq!(cond(&f).1, "GangTimedOut");
    let f = facts(4, 4, 0);
    assert_eq!(
        cond(&f),
        (
            "True".into(),
            "Scheduled".into(),
            "4 of minMember 4 members placed".into()
        )
    );
}

#[test]
fn a_status_differing_from_the_observed_one_is_written_until_they_agree() {
    let mut w: StatusWriter<PodGroupStatus> = StatusWriter::default();
    let t0 = Instant::now();
    let want = wanted_group(&facts(4, 4, 0), None);
    let stale = PodGroupStatus {
        phase: Some(GroupPhase::Pending),
        scheduled: 4,
        running: 4,
        ..Default::default()
    };
    let wanted = || BTreeMap::from([("ml/g".to_string(), want.clone())]);
    let mut observed = BTreeMap::from([("ml/g".to_string(), Some(stale.clone()))]);
    // differs: written
    let d = w.due(wanted(), &observed, t0);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].1.phase, Some(GroupPhase::Running));
    // in flight: not written twice at once
    assert!(w.due(wanted(), &observed, t0).is_empty());
    drop(d);
    // done, but the watch still shows the old status: wait for it ...
    let t1 = t0 + Duration::from_secs(1);
    assert!(w.due(wanted(), &observed, t1).is_empty());
    // ... not forever: a late Pending overtook the write; write again
    let t2 = t0 + STATUS_SETTLE;
    let d = w.due(wanted(), &observed, t2);
    assert_eq!(d.len(), 1);
    drop(d);
    // a status that never reads back equal is written less and less
    assert_eq!(settle_after(2), STATUS_SETTLE * 2);
    let t3 = t2 + STATUS_SETTLE;
    assert!(w.due(wanted(), &observed, t3).is_empty());
    assert_eq!(w.due(wanted(), &observed, t2 + settle_after(2)).len(), 1);
    assert_eq!(settle_after(40), STATUS_SETTLE_MAX);
    // agreed: nothing more to write, however long
    observed.insert("ml/g".into(), Some(want.clone()));
    assert!(
        w.due(wanted(), &observed, t2 + STATUS_SETTLE * 3)
            .is_empty()
    );
    // a changed wanted status is written at once
    let mut changed = want.clone();
    changed.running = 3;
    let d = w.due(
        BTreeMap::from([("ml/g".to_string(), changed)]),
        &observed,
        t2 + Duration::from_millis(1),
    );
    assert_eq!(d.len(), 1);
    // an object that does not exist (no observed entry) is never written
    drop(d);
    let gone = BTreeMap::from([("ml/gone".to_string(), want.clone())]);
    assert!(w.due(gone, &observed, t2).is_empty());
}

#[test]
fn conditions_keep_their_time_while_their_status_holds() {
    let t = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
    let mut old = valid_condition(None);
    old.last_transition_time = t(100);
    let mut same = vec![valid_condition(None)];
    settle_conditions(&mut same, std::slice::from_ref(&old), &t(200));
    assert_eq!(same[0].last_transition_time, t(100));
    let mut flipped = vec![valid_condition(Some("weight: must be 1 or more"))];
    settle_conditions(&mut flipped, &[old], &t(200));
    assert_eq!(flipped[0].last_transition_time, t(200));
    let mut fresh = vec![valid_condition(None)];
    settle_conditions(&mut fresh, &[], &t(300));
    assert_eq!(fresh[0].last_transition_time, t(300));
}

#[test]
fn merge_diff_nulls_what_is_gone_and_keeps_what_is_equal() {
    let from = json!({"phase": "Invalid", "scheduled": 4, "allocated": {"cpu": "1", "example.com/x": "2"}, "conditions": [{"type": "Valid"}]});
    let to = json!({"phase": "Running", "scheduled": 4, "allocated": {"cpu": "1"}, "running": 4, "conditions": [{"type": "Valid"}]});
    assert_eq!(
        merge_diff(&from, &to),
        Some(json!({"phase": "Running", "allocated": {"example.com/x": null}, "running": 4}))
    );
    assert_eq!(merge_diff(&to, &to), None);
    assert_eq!(merge_diff(&Value::Null, &to), Some(to.clone()));
}

#[test]
fn queue_status_is_typed_and_shows_the_figures() {
    let f = QueueFigures {
        allocated: ResourceVec {
            cpu_milli: 500,
            memory: 1 << 30,
            gpu_milli: 1500,
            ..Default::default()
        },
        fair_share: ResourceVec {
            gpu_milli: 4000,
            ..Default::default()
        },
        pending: 3,
        pending_by_reason: BTreeMap::from([
            ("QueueQuota".to_string(), 2),
            ("SchedulingGated".to_string(), 1),
        ]),
    };
    let st = wanted_queue(Some(&f), None);
    assert_eq!(st.pending_by_reason, f.pending_by_reason);
    assert_eq!(st.allocated_gpus.as_deref(), Some("1.5"));
    assert_eq!(st.fair_share_gpus.as_deref(), Some("4"));
    assert_eq!(st.allocated["cpu"], "500m");
    assert_eq!(st.pending_pods, 3);
    assert_eq!(st.conditions[0].status, "True");
    let bad = wanted_queue(None, Some("parent: queue \"x\" does not exist"));
    assert_eq!(bad.allocated_gpus, None);
    assert_eq!(
        (
            bad.conditions[0].status.as_str(),
            bad.conditions[0].reason.as_str()
        ),
        ("False", "InvalidSpec")
    );
}

#[test]
fn the_pod_condition_is_a_typed_status_patch_of_podscheduled() {
    let at = Time("2026-12-06T21:00:00Z".parse().unwrap());
    let long = "x".repeat(5000);
    let p = pod_condition_patch("Unschedulable", &long, at);
    let v = serde_json::to_value(&p).unwrap();
    // only the status, with the one condition the list merges by type
    assert_eq!(v.as_object().unwrap().len(), 1);
    let c = &v["status"]["conditions"];
    assert_eq!(c.as_array().unwrap().len(), 1);
    assert_eq!(v["status"].as_object().unwrap().len(), 1);
    assert_eq!(c[0]["type"], "PodScheduled");
    assert_eq!(c[0]["status"], "False");
    assert_eq!(c[0]["reason"], "Unschedulable");
    assert_eq!(c[0]["lastTransitionTime"], "2026-12-06T21:00:00Z");
    let m = c[0]["message"].as_str().unwrap();
    assert!(m.len() < long.len() && m.starts_with("xxx"), "{}", m.len());
    assert_eq!(c[0].as_object().unwrap().len(), 5, "{c}");
}

/// #39: every class has one name, and every surface of the scheduler shows
/// it verbatim — the Queue status (a parent's counting its children's),
/// the PodGroup condition, the pod's event note and condition, the
/// metrics label, doctor's text and JSON.
#[test]
fn every_class_reads_one_name_on_every_surface() {
    use crate::tools::doctor::{Finding, Report, Status, Summary};
    use gpusched_core::report::classify::tagged_message;
    let metrics = crate::metrics::Metrics::new();
    let exposition = metrics.render();
    for c in PendingClass::ALL {
        let name = c.reason_name();
        assert_eq!(c.as_str(), name);
        assert_eq!(c.to_string(), name);
        // JSON (doctor --json, the debug endpoint) round-trips the name
        assert_eq!(serde_json::to_value(c).unwrap(), json!(name));
        assert_eq!(
            serde_json::from_value::<PendingClass>(json!(name)).unwrap(),
            c
        );
        // metrics label
        assert!(
            exposition.contains(&format!(
                "gpusched_pending_pods_by_reason{{reason=\"{name}\"}}"
            )),
            "{name}"
        );
        // Queue status: the child's and its parent's
        let mut built = Built::default();
        let mut team = gpusched_model::Queue::new("team");
        team.parent = Some("org".into());
        built.snapshot.queues = vec![gpusched_model::Queue::new("org"), team];
        built.pending_by_queue.insert("team".into(), 1);
        let waiting = BTreeMap::from([("team".to_string(), BTreeMap::from([(c, 1)]))]);
        let (figures, _) = queue_figures(&built, &[&waiting]);
        for q in ["team", "org"] {
            let st = wanted_queue(figures.get(q), None);
            assert_eq!(st.pending_pods, 1, "{q} {name}");
            assert_eq!(
                st.pending_by_reason,
                BTreeMap::from([(name.to_string(), 1)]),
                "{q}"
            );
        }
        // PodGroup condition
        let mut f = facts(4, 1, 3);
        f.waiting = Some((c, "why".into()));
        let w = wanted_group(&f, None);
        assert_eq!(w.conditions[1].reason, name);
        // the pod's event note and condition
        let note = tagged_message("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", c);
        assert!(note.ends_with(&format!(" [{name}]")), "{note}");
        let cond = c.condition_reason();
        assert!(
            cond == name || (cond == "Unschedulable" && c.more_nodes_help()),
            "{name}"
        );
        // doctor
        let mut finding = Finding::new("pending", Status::Warn, "pod/ns/p", "why", c.hint());
        finding.class = Some(c);
        let text = Report::new(Summary::default(), vec![finding]).render();
        assert!(text.contains(&format!("pod/ns/p ({name}): why")), "{text}");
    }
}
