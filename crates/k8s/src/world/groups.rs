//! Queues, PodGroups (gpusched's and the scheduler-plugins'), workloads
//! (JobSet, LeaderWorkerSet, ...), PodDisruptionBudgets and priority
//! classes.

use super::*;

impl World {
    /// A Queue was added or changed.
    pub fn upsert_queue(&mut self, q: &Queue) {
        let name = q.metadata.name.clone().unwrap_or_default();
        self.observed.queues.insert(name.clone(), q.status.clone());
        self.queues
            .insert(name, translate::queue(q).map_err(|e| e.to_string()));
        self.cache.dirty.queues = true;
        self.generation += 1;
    }

    /// A Queue that could not be decoded (`error` names the field): kept as
    /// invalid, so it is reported with `Valid=False` and its pods are told
    /// why, while every other queue works.
    pub fn invalid_queue(&mut self, name: &str, error: String) {
        self.queues.insert(name.to_string(), Err(error));
        self.cache.dirty.queues = true;
        self.observed.queues.entry(name.to_string()).or_insert(None);
        self.generation += 1;
    }

    /// A Queue is gone.
    pub fn delete_queue(&mut self, name: &str) {
        self.queues.remove(name);
        self.cache.dirty.queues = true;
        self.observed.queues.remove(name);
        self.generation += 1;
    }

    /// A PodGroup was added or changed.
    pub fn upsert_group(&mut self, g: &PodGroup) {
        let k = key(g.metadata.namespace.as_ref(), g.metadata.name.as_ref());
        let for_job = g
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(translate::ANNOTATION_FOR_JOB));
        self.observed.groups.insert(k.clone(), g.status.clone());
        match &g.metadata.uid {
            Some(uid) => self.observed.group_uids.insert(k.clone(), uid.clone()),
            None => self.observed.group_uids.remove(&k),
        };
        self.cache.dirty.groups = true;
        self.groups.insert(
            k,
            GroupEntry {
                group: translate::group(g, 0).map_err(|e| e.to_string()),
                priority_class: g.spec.priority_class_name.clone(),
                for_job,
            },
        );
        self.generation += 1;
    }

    /// A PodGroup that could not be decoded (`key`: `namespace/name`).
    pub fn invalid_group(&mut self, key: &str, error: String) {
        self.observed.groups.entry(key.to_string()).or_insert(None);
        self.cache.dirty.groups = true;
        self.groups.insert(
            key.to_string(),
            GroupEntry {
                group: Err(error),
                priority_class: None,
                for_job: false,
            },
        );
        self.generation += 1;
    }

    /// A PodGroup is gone.
    pub fn delete_group(&mut self, key: &str) {
        self.groups.remove(key);
        self.cache.dirty.groups = true;
        self.observed.groups.remove(key);
        self.observed.group_uids.remove(key);
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup was added or changed.
    pub fn upsert_sp_group(&mut self, g: &SpPodGroup) {
        let k = key(g.metadata.namespace.as_ref(), g.metadata.name.as_ref());
        self.sp_groups
            .insert(k, translate::sp_group(g).map_err(|e| e.to_string()));
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup that could not be decoded.
    pub fn invalid_sp_group(&mut self, key: &str, error: String) {
        self.sp_groups.insert(key.to_string(), Err(error));
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup is gone.
    pub fn delete_sp_group(&mut self, key: &str) {
        self.sp_groups.remove(key);
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A JobSet or LeaderWorkerSet was added or changed (`key`:
    /// `namespace/name`; an `Err` names what is wrong with it: its pods
    /// wait, and the problem is reported).
    pub fn upsert_workload(&mut self, kind: WorkloadKind, key: &str, w: Result<Workload, String>) {
        self.workloads.insert((kind, key.to_string()), w);
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A `batch/v1` Job labelled `gpusched.io/gang` was added or changed
    /// (its PodGroup is made by the leader, [`crate::watch::run_job_gangs`]):
    /// a value that is not a flag keeps the Job's pending pods waiting,
    /// told why, rather than placed as independent pods.
    pub fn upsert_gang_job(&mut self, j: &k8s_openapi::api::batch::v1::Job) {
        let k = key(j.metadata.namespace.as_ref(), j.metadata.name.as_ref());
        let Some(v) = j
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(translate::LABEL_GANG))
        else {
            self.delete_gang_job(&k);
            return;
        };
        let r = gpusched_model::labels::parse_flag(v).map_err(|e| {
            format!(
                "Job {k}: metadata.labels[{}]: {e} (a gang is never placed as independent pods: the Job's pods wait until the value is fixed)",
                translate::LABEL_GANG
            )
        });
        if self.gang_jobs.get(&k) != Some(&r) {
            self.gang_jobs.insert(k, r);
            self.cache.dirty.groups = true;
            self.generation += 1;
        }
    }

    /// A Job labelled `gpusched.io/gang` is gone (or lost the label).
    pub(super) fn delete_gang_job(&mut self, key: &str) {
        if self.gang_jobs.remove(key).is_some() {
            self.cache.dirty.groups = true;
            self.generation += 1;
        }
    }

    /// Why a pod's Job keeps it waiting: the Job's `gpusched.io/gang`
    /// label is not a flag.
    pub(super) fn gang_job_error(&self, v: &PodView) -> Option<&str> {
        let job = v.job.as_ref()?;
        match self.gang_jobs.get(&format!("{}/{job}", v.namespace))? {
            Err(e) => Some(e),
            Ok(_) => None,
        }
    }

    /// A PodDisruptionBudget was added or changed.
    pub fn upsert_pdb(&mut self, p: &k8s_openapi::api::policy::v1::PodDisruptionBudget) {
        let k = key(p.metadata.namespace.as_ref(), p.metadata.name.as_ref());
        self.pdbs.insert(k, translate::pdb(p));
        self.generation += 1;
    }

    /// Pods (by uid) whose PodDisruptionBudget allows no disruption now.
    pub(super) fn budget_exhausted(&self) -> BTreeSet<&str> {
        let mut out = BTreeSet::new();
        for pdb in self.pdbs.values() {
            let Some(sel) = &pdb.selector else { continue };
            let covered: Vec<&PodView> = self
                .pods
                .values()
                .filter(|v| {
                    v.namespace == pdb.namespace
                        && matches!(
                            v.kind,
                            PodKind::Bound {
                                terminating: false,
                                ..
                            }
                        )
                        && translate::selects(sel, &v.labels)
                })
                .collect();
            let healthy = covered.iter().filter(|v| v.running).count() as u32;
            if pdb.allowed(covered.len() as u32, healthy) <= 0 {
                out.extend(covered.iter().map(|v| v.uid.as_str()));
            }
        }
        out
    }

    /// A PriorityClass was added or changed.
    pub fn upsert_priority_class(&mut self, pc: &PriorityClass) {
        let name = pc.metadata.name.clone().unwrap_or_default();
        self.priority_classes.insert(name, pc.value.unwrap_or(0));
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A PriorityClass is gone.
    pub fn delete_priority_class(&mut self, name: &str) {
        self.priority_classes.remove(name);
        self.cache.dirty.groups = true;
        self.generation += 1;
    }
}
