//! `gpusched doctor`: the GPU troubleshooting checklist.
//!
//! [`gather`] reads the cluster once (nodes, pods, queues, groups, priority
//! classes, disruption budgets) into [`Facts`]; [`checks::run`] is pure: it
//! builds the scheduler's snapshot from the facts exactly as the scheduler
//! does ([`crate::world::World`]), runs one core cycle offline to learn why
//! each pending pod waits (the core's typed reasons), and checks nodes,
//! agents, topology labels and the agents' published allocations. The
//! result is a [`Report`] of findings, each ✓ / ! / ✗ with a hint.
//!
//! Exit codes of the CLI ([`Report::exit_code`]): 0 all checks passed, 1
//! warnings only, 2 at least one failure; 3 is the CLI's own for "could
//! not run" (cluster unreachable).

pub mod checks;
pub mod gather;
pub mod probe;
pub mod scheduler;

pub use checks::{PendingClass, run};
pub use gather::{Facts, gather};

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Outcome of one check on one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Worth knowing; nothing is broken.
    Warn,
    /// Broken: needs someone to act.
    Fail,
}

impl Status {
    /// ✓, ! or ✗.
    pub fn symbol(self) -> &'static str {
        match self {
            Status::Ok => "✓",
            Status::Warn => "!",
            Status::Fail => "✗",
        }
    }
}

/// One line of the checklist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Which check (`gpu-resources`, `agent`, `node`, `pending`, `topology`,
    /// `leaks`, `config`, `scheduler`, `probe`).
    pub check: String,
    /// Outcome.
    pub status: Status,
    /// What it is about: `node/NAME`, `pod/NS/NAME`, `queue/NAME`, `cluster`.
    pub subject: String,
    /// What was found.
    pub message: String,
    /// What to do (empty when nothing).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hint: String,
    /// For `pending` findings: the class of the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<PendingClass>,
    /// For `leaks` findings: GPUs (milli) that would be freed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimable_milli: Option<u64>,
}

impl Finding {
    /// A finding without class or reclaimable capacity.
    pub fn new(
        check: &str,
        status: Status,
        subject: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Finding {
            check: check.to_string(),
            status,
            subject: subject.into(),
            message: message.into(),
            hint: hint.into(),
            class: None,
            reclaimable_milli: None,
        }
    }
}

/// Totals over the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nodes seen.
    pub nodes: u32,
    /// Nodes with GPUs.
    pub gpu_nodes: u32,
    /// GPUs on them.
    pub gpus: u32,
    /// GPUs the scheduler takes as unhealthy.
    pub unhealthy_gpus: u32,
    /// GPU milli held by pods (scheduler's view).
    pub allocated_milli: u64,
    /// Pods of gpusched waiting (gated and invalid ones included).
    pub pending_pods: u32,
    /// GPU milli held for pods that are gone or finished.
    pub leaked_milli: u64,
}

/// Everything `doctor` found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Format version of this JSON.
    pub v: u32,
    /// No warnings and no failures.
    pub healthy: bool,
    /// What the CLI exits with ([`Report::exit_code`]).
    pub exit_code: i32,
    /// Totals.
    pub summary: Summary,
    /// The checklist, in check order then subject.
    pub findings: Vec<Finding>,
}

/// Version of the report's JSON. 2: pending classes in CamelCase (the
/// one vocabulary of #39), and the classes and findings from every kind
/// the scheduler reads (claims, volumes, workloads, gang Jobs), with a
/// `config` finding for a kind that could not be read.
pub const REPORT_VERSION: u32 = 2;

impl Report {
    /// A report of these findings (sets `healthy` and `exit_code`).
    pub fn new(summary: Summary, findings: Vec<Finding>) -> Self {
        let mut r = Report {
            v: REPORT_VERSION,
            healthy: false,
            exit_code: 0,
            summary,
            findings,
        };
        r.exit_code = r.exit_code();
        r.healthy = r.exit_code == 0;
        r
    }

    /// 0: every check passed; 1: warnings only; 2: at least one failure.
    pub fn exit_code(&self) -> i32 {
        match self.findings.iter().map(|f| f.status).max() {
            None | Some(Status::Ok) => 0,
            Some(Status::Warn) => 1,
            Some(Status::Fail) => 2,
        }
    }

    /// Findings of one check.
    pub fn of<'a>(&'a self, check: &'a str) -> impl Iterator<Item = &'a Finding> + 'a {
        self.findings.iter().filter(move |f| f.check == check)
    }

    /// The checklist as text: one line per finding, its hint under it.
    pub fn render(&self) -> String {
        let s = &self.summary;
        let mut out = format!(
            "gpusched doctor: {} nodes ({} with GPUs), {} GPUs ({} unhealthy), {} GPUs allocated, {} pods pending\n",
            s.nodes,
            s.gpu_nodes,
            s.gpus,
            s.unhealthy_gpus,
            gpus_text(s.allocated_milli),
            s.pending_pods
        );
        let mut last = "";
        // the same finding on many nodes is one line with a count (ten
        // identical "no gpusched-agent pod" lines said one thing ten times)
        let same = |a: &Finding, b: &Finding| {
            (&a.check, a.status, &a.message, &a.hint, a.class)
                == (&b.check, b.status, &b.message, &b.hint, b.class)
        };
        let mut shown = vec![false; self.findings.len()];
        for (i, f) in self.findings.iter().enumerate() {
            if shown[i] {
                continue;
            }
            if f.check != last {
                let _ = writeln!(out, "\n[{}]", f.check);
                last = &f.check;
            }
            let mut subjects = vec![f.subject.as_str()];
            if f.subject.starts_with("node/") {
                for (j, g) in self.findings.iter().enumerate().skip(i + 1) {
                    if !shown[j] && g.subject.starts_with("node/") && same(f, g) {
                        shown[j] = true;
                        subjects.push(g.subject.as_str());
                    }
                }
            }
            let subject = match subjects.len() {
                1 => f.subject.clone(),
                n => {
                    let names: Vec<&str> = subjects
                        .iter()
                        .map(|s| s.trim_start_matches("node/"))
                        .collect();
                    let listed = if n > 4 {
                        format!("{}, … ({} more)", names[..3].join(", "), n - 3)
                    } else {
                        names.join(", ")
                    };
                    format!("{n} nodes ({listed})")
                }
            };
            let class = f
                .class
                .map(|c| format!(" ({})", c.as_str()))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{} {}{}: {}",
                f.status.symbol(),
                subject,
                class,
                f.message
            );
            if !f.hint.is_empty() {
                let _ = writeln!(out, "    hint: {}", f.hint);
            }
        }
        let fails = self
            .findings
            .iter()
            .filter(|f| f.status == Status::Fail)
            .count();
        let warns = self
            .findings
            .iter()
            .filter(|f| f.status == Status::Warn)
            .count();
        let _ = writeln!(
            out,
            "\n{} failure(s), {} warning(s){}",
            fails,
            warns,
            if s.leaked_milli > 0 {
                format!(
                    "; {} GPUs held for exited pods would be reclaimed",
                    gpus_text(s.leaked_milli)
                )
            } else {
                String::new()
            }
        );
        out
    }
}

/// What `gpusched doctor` is asked.
#[derive(Clone, Debug, Default)]
pub struct DoctorOptions {
    /// Kubeconfig (`None`: in-cluster, then the default).
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig's context (`None`: its current one).
    pub context: Option<String>,
    /// Report only pods of this namespace (nodes are always checked).
    pub namespace: Option<String>,
    /// The scheduler configuration the offline cycle runs with.
    pub config: gpusched_plugins::SchedulerConfig,
    /// Run the GPU probe pod.
    pub probe: Option<probe::ProbeOptions>,
    /// Check the scheduler itself (Deployment, lease, `/readyz`,
    /// permissions); `None`: skip.
    pub scheduler: Option<scheduler::SchedulerTarget>,
}

/// Gathers the cluster's state and runs every check (and the probe when
/// asked).
pub async fn diagnose(client: &kube::Client, opts: &DoctorOptions) -> anyhow::Result<Report> {
    let facts = gather(client).await?;
    let mut scheduler = gpusched_plugins::config::build(&opts.config)
        .map_err(|e| anyhow::anyhow!("scheduler config: {e}"))?;
    let mut report = run(&facts, &mut scheduler, opts.namespace.as_deref());
    if let Some(t) = &opts.scheduler {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let f = scheduler::gather(client, t, now).await;
        report.findings.extend(scheduler::findings(&f, t));
        report = Report::new(report.summary, report.findings);
    }
    if let Some(p) = &opts.probe {
        let f = probe::run(client, p).await;
        report.findings.push(f);
        report = Report::new(report.summary, report.findings);
    }
    Ok(report)
}

/// [`diagnose`] on its own runtime (for the binary).
pub fn diagnose_blocking(opts: &DoctorOptions) -> anyhow::Result<Report> {
    super::block_on(async {
        let client = crate::client::KubeconfigChoice {
            path: opts.kubeconfig.clone(),
            context: opts.context.clone(),
        }
        .client()
        .await?;
        diagnose(&client, opts).await
    })
}

/// Milli-GPU as GPUs (`3`, `2.5`): the reports' text.
pub use gpusched_core::report::gpus_text;

#[cfg(test)]
mod tests;
