//! Issue 38, item 9: a fuzzing harness. Arbitrary and mutated Pods,
//! Nodes, Queues, PodGroups, ResourceClaims, ResourceSlices,
//! DeviceClasses, DeviceTaintRules and workload objects (JobSet,
//! LeaderWorkerSet, the upstream PodGroup) go through translation, the
//! world, one scheduling cycle and the allocation of the bound pods'
//! claims. Each case must finish without a panic, with a whole cycle
//! (every pending pod of the snapshot decided or explained), within
//! [`CASE_TIME`] and within [`CASE_BYTES`] of heap above where it started
//! (a counting allocator, [`Counting`], measures it).
//!
//! # Why proptest, not cargo-fuzz
//!
//! cargo-fuzz (libFuzzer) needs a nightly toolchain and a separate
//! runner, and coverage-guided runs have no fixed length; the project
//! builds on stable and CI runs the README's `cargo test --workspace`.
//! proptest runs on stable inside that command, with a fixed number of
//! cases ([`CASES`]; `PROPTEST_CASES` overrides it for a longer local run)
//! from a seed CI sets (`PROPTEST_RNG_SEED`), so a CI run is reproducible
//! and its budget fixed. What coverage guidance would find by itself, the
//! corpus supplies: `corpus/*.json` holds seed scenarios (each a list of
//! objects in their API shape, the repros among them) that the
//! mutators start from; an input the fuzzer finds is added there once
//! fixed.
//!
//! The mutators walk an object to a random place and set it to a value
//! chosen to hurt (huge, negative and fractional quantities, empty and
//! long strings, nulls, wrong types, arbitrary JSON), delete it, or copy
//! a sibling (duplicate names, repeated devices). Objects that no longer
//! deserialize into their type are dropped, as the API server would
//! refuse them; everything the API server's schema lets through is
//! accepted by the types here.
//!
//! A longer local run: `PROPTEST_CASES=5000 PROPTEST_RNG_SEED=<n> cargo
//! test -p gpusched-k8s --test fuzz`; `FUZZ_INCREMENTAL=1` also checks
//! that the incremental snapshot equals a full build in every case.

use gpusched_k8s::world::World;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Cases per run (`PROPTEST_CASES` overrides it).
const CASES: u32 = 256;
/// Most time one case may take (a debug build, a shared CI machine).
const CASE_TIME: Duration = Duration::from_secs(20);
/// Most heap one case may add above where it started.
const CASE_BYTES: usize = 512 << 20;

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as given
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded as given
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The seed scenarios, by file name.
fn corpus() -> Vec<(String, Vec<Value>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let Value::Array(objects) = v else {
                panic!("{}: not a list of objects", p.display())
            };
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                objects,
            )
        })
        .collect()
}

fn key(o: &Value) -> String {
    let m = &o["metadata"];
    match m["namespace"].as_str() {
        Some(ns) => format!("{ns}/{}", m["name"].as_str().unwrap_or_default()),
        None => m["name"].as_str().unwrap_or_default().to_string(),
    }
}

/// Puts one object into the world by its `kind` (and `apiVersion`, for
/// the two PodGroups); an object its type refuses is dropped (`false`).
fn feed(w: &mut World, o: &Value) -> bool {
    use gpusched_k8s::workloads::{self as wl, WorkloadKind};
    fn typed<T: serde::de::DeserializeOwned>(o: &Value) -> Option<T> {
        serde_json::from_value(o.clone()).ok()
    }
    let api = o["apiVersion"].as_str().unwrap_or_default();
    match o["kind"].as_str().unwrap_or_default() {
        "Node" => typed(o).map(|n| w.upsert_node(&n)),
        "Pod" => typed(o).map(|p| w.upsert_pod(&p)),
        "Namespace" => typed(o).map(|n| w.upsert_namespace(&n)),
        "PriorityClass" => typed(o).map(|p| w.upsert_priority_class(&p)),
        "Queue" => typed(o).map(|q| w.upsert_queue(&q)),
        "PodGroup" if api.starts_with("scheduling.k8s.io") => typed(o).map(|g| {
            w.upsert_workload(WorkloadKind::PodGroup, &key(o), wl::upstream_pod_group(&g))
        }),
        "PodGroup" => typed(o).map(|g| w.upsert_group(&g)),
        "ResourceClaim" => typed(o).map(|c| w.upsert_claim(&c)),
        "ResourceSlice" => typed(o).map(|s| w.upsert_slice(&s)),
        "DeviceClass" => typed(o).map(|c| w.upsert_device_class(&c)),
        "DeviceTaintRule" => typed(o).map(|r| w.upsert_device_taint_rule(&r)),
        "JobSet" => {
            typed(o).map(|j| w.upsert_workload(WorkloadKind::JobSet, &key(o), wl::jobset(&j)))
        }
        "LeaderWorkerSet" => typed(o).map(|l| {
            w.upsert_workload(
                WorkloadKind::LeaderWorkerSet,
                &key(o),
                wl::leader_worker_set(&l),
            )
        }),
        _ => None,
    }
    .is_some()
}

/// Translation, the world, one cycle, and the claims of the pods it binds
/// allocated: `Err` when the cycle was not whole.
fn run(objects: &[Value]) -> Result<Outcome, String> {
    use gpusched_core::{Decision, PodPhase};
    let mut w = World::default();
    let mut fed = 0;
    for o in objects {
        fed += usize::from(feed(&mut w, o));
    }
    let b = w.build();
    if std::env::var_os("FUZZ_INCREMENTAL").is_some()
        && let Some(d) = gpusched_k8s::world::first_difference(&w.snapshot(), &b)
    {
        return Err(format!(
            "the incremental snapshot differs from a full build: {d}"
        ));
    }
    let mut cfg = gpusched_plugins::SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    let out = gpusched_plugins::build(&cfg)
        .map_err(|e| e.to_string())?
        .cycle(&b.snapshot, 1_800_000_000_000, 7);
    // whole: every pending pod is decided or explained
    let mut seen = vec![false; b.snapshot.pods.len()];
    for d in &out.decisions {
        if let Decision::Bind { pod, .. } | Decision::Nominate { pod, .. } = d {
            seen[*pod as usize] = true;
        }
    }
    for e in &out.explanations {
        seen[e.pod as usize] = true;
    }
    for (i, p) in b.snapshot.pods.iter().enumerate() {
        if matches!(p.phase, PodPhase::Pending { .. }) && !seen[i] {
            return Err(format!(
                "pending pod {} neither decided nor explained",
                p.pod.name
            ));
        }
    }
    // the binder's part: the claims of each bound pod allocated there
    let mut bound = 0;
    for d in &out.decisions {
        if let Decision::Bind { pod, node, .. } = d {
            let uid = &b.pods[*pod as usize].uid;
            let node = &b.snapshot.nodes[*node as usize].name;
            bound += usize::from(w.allocate_claims(uid, node).is_ok());
        }
    }
    let _ = w.build();
    Ok(Outcome {
        fed,
        bound,
        explained: out.explanations.len(),
        problems: b.problems.len(),
    })
}

/// What a case did.
#[derive(Debug)]
struct Outcome {
    /// Objects the world took.
    fed: usize,
    /// Pods bound (their claims allocated).
    bound: usize,
    /// Pods explained.
    explained: usize,
    /// Problems reported (pods kept from the core among them).
    problems: usize,
}

/// Runs one case within its time and memory bounds.
fn bounded(name: &str, objects: &[Value]) -> Result<Outcome, TestCaseError> {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let t = Instant::now();
    let o = run(objects).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
    let (took, peak) = (
        t.elapsed(),
        PEAK.load(Ordering::Relaxed).saturating_sub(base),
    );
    prop_assert!(took <= CASE_TIME, "{name}: took {took:?}");
    prop_assert!(peak <= CASE_BYTES, "{name}: {peak} bytes of heap");
    Ok(o)
}

/// A value chosen to hurt where a field is read.
fn nasty() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!("9223372036854775807")),
        Just(json!("18446744073709551617")),
        Just(json!("-1")),
        Just(json!("-0.001")),
        Just(json!("1e300")),
        Just(json!("1Ei")),
        Just(json!("0.5")),
        Just(json!("500m")),
        Just(json!("")),
        Just(json!("a/b/c")),
        Just(json!("device.driver == ")),
        Just(json!(i64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(u32::MAX)),
        Just(json!(true)),
        Just(Value::Null),
        Just(json!([])),
        Just(json!({})),
        "[a-z0-9./-]{0,12}".prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (1usize..20_000).prop_map(|n| Value::from("x".repeat(n))),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One mutation: where (a walk, one number per level), what.
#[derive(Clone, Debug)]
enum Mutation {
    Set(Vec<u32>, Value),
    Delete(Vec<u32>),
    CopySibling(Vec<u32>, u32),
    /// A value of the same JSON type (so the object still deserializes).
    Like(Vec<u32>, u32),
}

/// A value of `v`'s JSON type that hurts, picked by `n`.
fn like(v: &Value, n: u32) -> Value {
    const STRINGS: &[&str] = &[
        "9223372036854775807",
        "-1",
        "-0.001",
        "1e300",
        "1Ei",
        "0",
        "",
        "x/y",
        "In",
        "Exists",
        "NoSchedule",
        "All",
        "device.driver == 1",
        "metadata.name",
        "a",
    ];
    const NUMBERS: &[i64] = &[i64::MAX, i64::MIN, -1, 0, 1, 9, u32::MAX as i64, 1 << 53];
    match v {
        Value::String(_) => json!(STRINGS[n as usize % STRINGS.len()]),
        Value::Number(_) => json!(NUMBERS[n as usize % NUMBERS.len()]),
        Value::Bool(b) => json!(!b),
        other => other.clone(),
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(any::<u32>(), 1..7);
    prop_oneof![
        6 => (path.clone(), nasty()).prop_map(|(p, v)| Mutation::Set(p, v)),
        2 => path.clone().prop_map(Mutation::Delete),
        2 => (path.clone(), any::<u32>()).prop_map(|(p, s)| Mutation::CopySibling(p, s)),
        8 => (path, any::<u32>()).prop_map(|(p, s)| Mutation::Like(p, s)),
    ]
}

/// The child a walk's number picks: a key of an object, an element of an
/// array.
fn child(v: &mut Value, n: u32) -> Option<&mut Value> {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let k = m.keys().nth(n as usize % m.len())?.clone();
            m.get_mut(&k)
        }
        Value::Array(a) if !a.is_empty() => {
            let len = a.len();
            a.get_mut(n as usize % len)
        }
        _ => None,
    }
}

/// Applies `m` at the end of its walk (stopping early at a leaf).
fn apply(root: &mut Value, m: &Mutation) {
    let (path, last) = match m {
        Mutation::Set(p, _)
        | Mutation::Delete(p)
        | Mutation::CopySibling(p, _)
        | Mutation::Like(p, _) => (&p[..p.len() - 1], p[p.len() - 1]),
    };
    let mut at = root;
    for n in path {
        let is_container = child(at, *n).is_some_and(|c| c.is_object() || c.is_array());
        if !is_container {
            break;
        }
        at = child(at, *n).expect("checked");
    }
    match (m, &mut *at) {
        (Mutation::Set(_, v), Value::Object(o)) if !o.is_empty() => {
            let k = o
                .keys()
                .nth(last as usize % o.len())
                .cloned()
                .unwrap_or_default();
            o.insert(k, v.clone());
        }
        (Mutation::Set(_, v), Value::Object(o)) => {
            o.insert("x".into(), v.clone());
        }
        (Mutation::Set(_, v), Value::Array(a)) if !a.is_empty() => {
            let len = a.len();
            a[last as usize % len] = v.clone();
        }
        (Mutation::Delete(_), Value::Object(o)) if !o.is_empty() => {
            let k = o
                .keys()
                .nth(last as usize % o.len())
                .cloned()
                .unwrap_or_default();
            o.remove(&k);
        }
        (Mutation::Delete(_), Value::Array(a)) if !a.is_empty() => {
            let len = a.len();
            a.remove(last as usize % len);
        }
        (Mutation::CopySibling(_, s), Value::Array(a)) if !a.is_empty() => {
            let len = a.len();
            let c = a[*s as usize % len].clone();
            a.insert(last as usize % (len + 1), c);
        }
        (Mutation::Like(_, n), Value::Object(o)) if !o.is_empty() => {
            let k = o
                .keys()
                .nth(last as usize % o.len())
                .cloned()
                .unwrap_or_default();
            let v = like(&o[&k], *n);
            o.insert(k, v);
        }
        (Mutation::Like(_, n), Value::Array(a)) if !a.is_empty() => {
            let len = a.len();
            let i = last as usize % len;
            a[i] = like(&a[i], *n);
        }
        (Mutation::CopySibling(_, s), Value::Object(o)) if o.len() > 1 => {
            let keys: Vec<String> = o.keys().cloned().collect();
            let from = o[&keys[*s as usize % keys.len()]].clone();
            o.insert(keys[last as usize % keys.len()].clone(), from);
        }
        _ => {}
    }
}

/// Every corpus scenario as it is: a whole cycle, in bounds.
#[test]
fn the_corpus_goes_through_a_cycle_within_bounds() {
    for (name, objects) in corpus() {
        let o = bounded(&name, &objects).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{name}: {o:?}");
        // every seed object is one its type takes, and the cycle does work
        for x in &objects {
            assert!(
                feed(&mut World::default(), x),
                "{name}: {} {} refused",
                x["kind"],
                key(x)
            );
        }
        assert_eq!(o.fed, objects.len(), "{name}");
        assert!(o.bound + o.explained + o.problems > 0, "{name}: {o:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Mutated corpus scenarios, with arbitrary objects mixed in.
    #[test]
    fn mutated_objects_never_stop_a_cycle(
        pick in any::<u32>(),
        mutations in prop::collection::vec(mutation(), 1..24),
        extra in prop::collection::vec((any::<u32>(), nasty()), 0..3),
    ) {
        let corpus = corpus();
        let (name, objects) = &corpus[pick as usize % corpus.len()];
        let mut root = Value::Array(objects.clone());
        for m in &mutations {
            apply(&mut root, m);
        }
        // arbitrary objects: a kind of the corpus, arbitrary content
        let Value::Array(mut objects) = root else { unreachable!() };
        for (k, v) in extra {
            let kinds = ["Pod", "Node", "ResourceClaim", "ResourceSlice", "DeviceClass", "Queue", "PodGroup", "JobSet"];
            let mut o = json!({"kind": kinds[k as usize % kinds.len()], "metadata": {"name": "arb", "namespace": "ml"}});
            if let Value::Object(m) = v {
                for (f, x) in m {
                    o[f] = x;
                }
            }
            objects.push(o);
        }
        bounded(name, &objects)?;
    }
}
