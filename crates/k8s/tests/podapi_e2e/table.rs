//! The issue's table of Pod API fields, each read as kube-scheduler reads it.

use super::*;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler (e2e/run)"]
async fn the_issue_table_reads_honoured() {
    let mut e = env().await;
    let anchor = {
        let mut a = spec_pod("anchor", 1, json!({"app": "db"}), json!({}));
        a["spec"]["nodeName"] = json!("n3");
        a
    };

    // required anti-affinity on hostname, 3 replicas: 3 nodes
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(
                &format!("web-{i}"),
                1,
                json!({"app": "web"}),
                json!({"affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term("app", "web", HOST)]}}}),
            )
        })
        .collect();
    let o = compare(&e, "required anti-affinity", &pods).await;
    assert_eq!((distinct(&o.kube, "web"), distinct(&o.ours, "web")), (3, 3));

    // preferred anti-affinity: spread over nodes as kube-scheduler does
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(&format!("web-{i}"), 1, json!({"app": "web"}), json!({"affinity": {"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term("app", "web", HOST)}]}}}))
        })
        .collect();
    let o = compare(&e, "preferred anti-affinity", &pods).await;
    assert_eq!(distinct(&o.ours, "web"), distinct(&o.kube, "web"));
    assert_eq!(distinct(&o.ours, "web"), 3);

    // required / preferred affinity to an anchor: the anchor's node
    for (kind, name) in [
        ("requiredDuringSchedulingIgnoredDuringExecution", "required"),
        (
            "preferredDuringSchedulingIgnoredDuringExecution",
            "preferred",
        ),
    ] {
        let t = if name == "required" {
            json!([term("app", "db", HOST)])
        } else {
            json!([{"weight": 100, "podAffinityTerm": term("app", "db", HOST)}])
        };
        let pods = vec![
            anchor.clone(),
            spec_pod(
                "client",
                1,
                json!({}),
                json!({"affinity": {"podAffinity": {kind: t}}}),
            ),
        ];
        let o = compare(&e, &format!("{name} affinity"), &pods).await;
        assert_eq!(o.kube["client"].as_deref(), Some("n3"));
        assert_eq!(o.ours["client"].as_deref(), Some("n3"), "{name}");
    }

    // zone spread maxSkew 1, 6 pods: 2/2/2
    let pods: Vec<Value> = (0..6)
        .map(|i| {
            spec_pod(
                &format!("s-{i}"),
                1,
                json!({"app": "s"}),
                json!({"topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                 "labelSelector": {"matchLabels": {"app": "s"}}}]}),
            )
        })
        .collect();
    let o = compare(&e, "zone spread", &pods).await;
    for p in [&o.kube, &o.ours] {
        let mut per_zone: BTreeMap<&str, u32> = BTreeMap::new();
        for n in p.values().flatten() {
            let z = match n.as_str() {
                "n1" | "n2" => "a",
                "n3" => "b",
                _ => "c",
            };
            *per_zone.entry(z).or_insert(0) += 1;
        }
        assert_eq!(
            per_zone.values().copied().collect::<Vec<_>>(),
            [2, 2, 2],
            "{p:?}"
        );
    }

    // preferred node affinity weight 100: the preferred node
    let pods = vec![spec_pod(
        "picky",
        1,
        json!({}),
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["n4"]}]}}]}}}),
    )];
    let o = compare(&e, "preferred node affinity", &pods).await;
    assert_eq!(o.kube["picky"].as_deref(), Some("n4"));
    assert_eq!(o.ours["picky"].as_deref(), Some("n4"));

    // required node affinity with Gt and Lt on an integer label (gen 3/4/4/5):
    // only n2 and n3 have 3 < gen < 5; three 8-GPU pods, the third pending
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(
                &format!("gen-{i}"),
                8,
                json!({}),
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "gen", "operator": "Gt", "values": ["3"]},
                        {"key": "gen", "operator": "Lt", "values": ["5"]}]}]}}}}),
            )
        })
        .collect();
    let o = compare(&e, "node affinity Gt/Lt", &pods).await;
    assert_eq!((Outcome::bound(&o.kube), Outcome::bound(&o.ours)), (2, 2));
    for p in [&o.kube, &o.ours] {
        let on: BTreeSet<String> = p.values().flatten().cloned().collect();
        assert_eq!(
            on,
            BTreeSet::from(["n2".to_string(), "n3".to_string()]),
            "{p:?}"
        );
    }

    // matchFields on metadata.name: a DaemonSet-style pin (In n3, 1 GPU)
    // and three 7-GPU pods kept off n1 (NotIn): the pin on n3 and one pod
    // on each of n2, n3, n4, none on n1. (The sizes leave room for every
    // pod whatever order the pods are tried in: the pods are created one
    // after another and either scheduler may see some before the others.)
    let field = |op: &str, node: &str| {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": op, "values": [node]}]}]}}}})
    };
    let mut pods = vec![spec_pod("ds", 1, json!({}), field("In", "n3"))];
    pods.extend((0..3).map(|i| spec_pod(&format!("off-{i}"), 7, json!({}), field("NotIn", "n1"))));
    let o = compare(&e, "node affinity matchFields", &pods).await;
    for p in [&o.kube, &o.ours] {
        assert_eq!(p["ds"].as_deref(), Some("n3"), "{p:?}");
        assert_eq!(Outcome::bound(p), 4, "{p:?}");
        let off: BTreeSet<&str> = p
            .iter()
            .filter(|(k, _)| k.starts_with("off"))
            .filter_map(|(_, n)| n.as_deref())
            .collect();
        assert_eq!(off, BTreeSet::from(["n2", "n3", "n4"]), "{p:?}");
    }

    // hostPort 8080, two pods pinned to one node: the second pending
    let pods: Vec<Value> = (0..2)
        .map(|i| {
            spec_pod(
                &format!("port-{i}"),
                1,
                json!({}),
                json!({"nodeSelector": {HOST: "n2"}, "ports": [{"containerPort": 80, "hostPort": 8080}]}),
            )
        })
        .collect();
    let o = compare(&e, "host port", &pods).await;
    assert_eq!((Outcome::bound(&o.kube), Outcome::bound(&o.ours)), (1, 1));
    // and gpusched says why, as kube-scheduler does
    let api = e.c.pods("ml");
    for p in &pods {
        let mut p = p.clone();
        p["spec"]["schedulerName"] = json!("gpusched");
        create(&api, p).await;
    }
    let pending = wait_for(Duration::from_secs(30), || async {
        let b = bound(&api).await;
        (b.len() == 1).then(|| {
            if b.contains_key("port-0") {
                "port-1"
            } else {
                "port-0"
            }
        })
    })
    .await
    .expect("one bound");
    let ev = wait_event(&e.c, "ml", pending, "FailedScheduling: ", 30)
        .await
        .expect("told why");
    assert!(
        ev.iter()
            .any(|m| m.contains("didn't have free ports for the requested pod ports")),
        "{ev:?}"
    );
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}
