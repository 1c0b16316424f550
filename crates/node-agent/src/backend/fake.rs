//! The `fake` backend: one node described in the cluster-file vocabulary
//! ([`gpusched_model::spec::ClusterSpec`]), plus fault injection through a
//! control file.
//!
//! The control file is an append-only list of commands, one a line, read
//! whenever it changes (a file that shrinks, or a new file renamed over it,
//! is read again from the top):
//!
//! ```text
//! xid <gpu> <code>           # an XID error (ignored XIDs are ignored)
//! fail <gpu> [reason]        # a failed periodic check
//! unhealthy <gpu> [reason]   # forced unhealthy until `healthy`
//! healthy <gpu>              # clear every fault now
//! ```
//!
//! `<gpu>` is a UUID or an index. Lines starting with `#` are skipped.

use super::{
    BackendError, DeviceBackend, GpuInfo, GpuSample, HealthEvent, HealthWatch, Inventory, MigInfo,
};
use gpusched_model::spec::{BuiltNode, ClusterSpec};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc::UnboundedSender;

/// How often the control file is looked at.
pub const CONTROL_POLL: Duration = Duration::from_millis(20);

/// A node read from a YAML file.
#[derive(Debug, Clone)]
pub struct FakeBackend {
    inventory: Inventory,
    control: Option<PathBuf>,
    /// GPUs marked `healthy: false` in the node file.
    unhealthy: Vec<String>,
}

fn mig_memory_mib(profile: &str) -> u64 {
    // `3g.40gb` → 40 GiB; `1g.10gb` → 10 GiB; unknown shapes → 0.
    profile
        .split('.')
        .nth(1)
        .and_then(|m| m.strip_suffix("gb"))
        .and_then(|n| n.parse::<u64>().ok())
        .map(|g| g * 1024)
        .unwrap_or(0)
}

/// The CUDA compute capability of a GPU model, for the fake backend (NVML
/// reports it for real GPUs). Matched on whole `-`-separated words.
pub fn compute_capability_of(model: &str) -> Option<(u32, u32)> {
    const TABLE: &[(&[&str], (u32, u32))] = &[
        (&["B200", "B100", "GB200", "B300", "GB300"], (10, 0)),
        (&["H100", "H200", "H20", "H800", "GH200"], (9, 0)),
        (&["L40", "L40S", "L4", "L20", "ADA"], (8, 9)),
        (
            &["A10", "A10G", "A40", "A16", "A2", "A6000", "A5000", "A4000"],
            (8, 6),
        ),
        (&["A100", "A30", "A800"], (8, 0)),
        (&["T4"], (7, 5)),
        (&["V100"], (7, 0)),
        (&["P40", "P4"], (6, 1)),
        (&["P100"], (6, 0)),
    ];
    let upper = model.to_ascii_uppercase();
    let words: Vec<&str> = upper.split(['-', ' ', '_']).collect();
    TABLE
        .iter()
        .find(|(names, _)| words.iter().any(|w| names.contains(w)))
        .map(|(_, cc)| *cc)
}

impl FakeBackend {
    /// Reads a node file: a cluster file with exactly one node.
    pub fn from_file(path: &Path, control: Option<PathBuf>) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|source| BackendError::ReadNodeFile {
            path: path.display().to_string(),
            source,
        })?;
        let mut b = Self::from_yaml(&text, &path.display().to_string())?;
        b.control = control;
        Ok(b)
    }

    /// Parses a node file's text; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, BackendError> {
        let err = |message: String| BackendError::NodeFile {
            path: origin.to_string(),
            message,
        };
        let spec: ClusterSpec = crate::config::parse_yaml(text).map_err(|e| {
            err(match e.field {
                Some(f) => format!("field `{f}`: {}", e.message),
                None => e.message,
            })
        })?;
        let node_count: u64 = spec.nodes.iter().map(|g| g.count as u64).sum();
        if node_count != 1 {
            return Err(err(format!(
                "field `nodes`: describes {node_count} nodes; the fake backend needs exactly one (one entry with count 1)"
            )));
        }
        let built = spec.build().map_err(|e| err(e.to_string()))?;
        // The model drops MIG-enabled GPUs from the node's whole GPUs; build
        // once more without MIG to recover their identity and topology.
        let mut whole = spec.clone();
        for g in &mut whole.nodes {
            if let Some(l) = &mut g.gpus {
                for d in &mut l.devices {
                    d.mig.clear();
                }
            }
        }
        let all = whole.build().map_err(|e| err(e.to_string()))?;
        let (Some(b), Some(a)) = (built.first(), all.first()) else {
            return Err(err("field `nodes`: no node".into()));
        };
        let unhealthy = a
            .node
            .gpus
            .iter()
            .filter(|g| !g.is_healthy())
            .map(|g| g.uuid.clone())
            .collect();
        Ok(FakeBackend {
            inventory: Self::inventory(b, a),
            control: None,
            unhealthy,
        })
    }

    fn inventory(built: &BuiltNode, all: &BuiltNode) -> Inventory {
        let mut gpus: Vec<GpuInfo> = all
            .node
            .gpus
            .iter()
            .map(|g| GpuInfo {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                product_name: g.model.clone(),
                memory_mib: g.memory_mib,
                pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + g.index * 0x10 % 0xe0),
                minor: g.index,
                topo: g.topo,
                nvlink_peers: Vec::new(),
                mig_enabled: false,
                mig: Vec::new(),
                compute_capability: compute_capability_of(&g.model),
            })
            .collect();
        for i in 0..gpus.len() {
            let peers: Vec<u32> = gpus
                .iter()
                .filter(|o| {
                    o.index != gpus[i].index
                        && gpus[i].topo.nvlink.is_some()
                        && o.topo.nvlink == gpus[i].topo.nvlink
                })
                .map(|o| o.index)
                .collect();
            gpus[i].nvlink_peers = peers;
        }
        for (gi, profile, uuid) in &built.mig {
            if let Some(g) = gpus.iter_mut().find(|g| g.index == *gi) {
                g.mig_enabled = true;
                g.mig.push(MigInfo {
                    uuid: uuid.clone(),
                    profile: profile.clone(),
                    memory_mib: mig_memory_mib(profile),
                    caps: Vec::new(),
                });
            }
        }
        Inventory {
            gpus,
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            // A fake node has no machine of its own; `gpu.machine` reads
            // `unknown` as GFD's does without a product name.
            machine: None,
        }
    }

    /// The inventory, without going through the trait.
    pub fn inventory_ref(&self) -> &Inventory {
        &self.inventory
    }
}

/// Parses one control-file line into an event. `Ok(None)`: blank/comment.
pub fn parse_control_line(line: &str, inv: &Inventory) -> Result<Option<HealthEvent>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let quoted = crate::text::shown(line);
    let mut parts = line.split_whitespace();
    let cmd = parts.next().unwrap_or_default();
    let who = parts
        .next()
        .ok_or_else(|| format!("{quoted}: missing GPU (uuid or index)"))?;
    let gpu = inv
        .gpus
        .iter()
        .find(|g| g.uuid == who || who.parse::<u32>().ok() == Some(g.index))
        .map(|g| g.uuid.clone())
        .ok_or_else(|| format!("{quoted}: unknown GPU {}", crate::text::shown(who)))?;
    let rest = parts.collect::<Vec<_>>().join(" ");
    let ev = match cmd {
        "xid" => {
            let xid = rest.parse::<u64>().ok().filter(|&x| x > 0).ok_or_else(|| {
                format!("{quoted}: xid needs a positive number (0 is not an XID)")
            })?;
            HealthEvent::Xid { gpu, xid }
        }
        "fail" => HealthEvent::CheckFailed {
            gpu,
            reason: if rest.is_empty() {
                "check failed".into()
            } else {
                rest
            },
        },
        "unhealthy" => HealthEvent::Force {
            gpu,
            reason: if rest.is_empty() {
                "marked unhealthy".into()
            } else {
                rest
            },
        },
        "healthy" => HealthEvent::Release { gpu },
        other => {
            return Err(format!(
                "{quoted}: unknown command {} (xid, fail, unhealthy, healthy)",
                crate::text::shown(other)
            ));
        }
    };
    Ok(Some(ev))
}

fn control_loop(path: PathBuf, inv: Inventory, tx: UnboundedSender<HealthEvent>) {
    use std::os::unix::fs::MetadataExt;
    let mut seen_lines = 0usize;
    // (device, inode, length, mtime): a file renamed over the old one is a
    // new file, read from the top whatever its length.
    type Stamp = (u64, u64, u64, Option<SystemTime>);
    let mut last: Option<Stamp> = None;
    loop {
        if tx.is_closed() {
            return;
        }
        if let Ok(meta) = std::fs::metadata(&path) {
            let stamp: Stamp = (meta.dev(), meta.ino(), meta.len(), meta.modified().ok());
            if last != Some(stamp) {
                if let Some((dev, ino, old_len, _)) = last
                    && (stamp.2 < old_len || (dev, ino) != (stamp.0, stamp.1))
                {
                    seen_lines = 0;
                }
                last = Some(stamp);
                if let Ok(text) = std::fs::read_to_string(&path) {
                    let lines: Vec<&str> = text.lines().collect();
                    // A last line without newline may still be being written.
                    let complete = if text.ends_with('\n') {
                        lines.len()
                    } else {
                        lines.len().saturating_sub(1)
                    };
                    if complete < seen_lines {
                        seen_lines = 0;
                    }
                    for l in &lines[seen_lines..complete] {
                        match parse_control_line(l, &inv) {
                            Ok(Some(ev)) => {
                                tracing::info!(event = ?ev, "fault injection");
                                if tx.send(ev).is_err() {
                                    return;
                                }
                            }
                            Ok(None) => {}
                            Err(e) => tracing::warn!(file = %path.display(), "control file: {e}"),
                        }
                    }
                    seen_lines = complete;
                    if !text.ends_with('\n') {
                        // Look again next time even if nothing changes size.
                        last = None;
                    }
                }
            }
        }
        std::thread::sleep(CONTROL_POLL);
    }
}

impl DeviceBackend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn discover(&self) -> Result<Inventory, BackendError> {
        Ok(self.inventory.clone())
    }

    fn watch_health(
        &self,
        _watch: HealthWatch,
        events: UnboundedSender<HealthEvent>,
    ) -> Result<(), BackendError> {
        if let Some(path) = self.control.clone() {
            let inv = self.inventory.clone();
            std::thread::Builder::new()
                .name("fake-control".into())
                .stack_size(64 * 1024)
                .spawn(move || control_loop(path, inv, events))
                .map_err(|e| BackendError::Health(e.to_string()))?;
        }
        Ok(())
    }

    fn initial_faults(&self) -> Vec<String> {
        self.unhealthy.clone()
    }

    fn sample(&self) -> Vec<GpuSample> {
        self.inventory
            .gpus
            .iter()
            .map(|g| GpuSample {
                uuid: g.uuid.clone(),
                utilization_ratio: Some(0.0),
                memory_used_bytes: Some(0),
                memory_total_bytes: Some(g.memory_mib * 1024 * 1024),
                power_watts: Some(70.0),
                temperature_celsius: Some(35.0),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus:\n      count: 4\n      model: A100-SXM4-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      pcie_switches: 2\n      devices:\n        - index: 1\n          mig: [{profile: 3g.40gb}, {profile: 3g.40gb}]\n";

    #[test]
    fn mig_gpus_keep_identity() {
        let b = FakeBackend::from_yaml(NODE, "n.yaml").unwrap();
        let inv = b.inventory_ref();
        assert_eq!(inv.gpus.len(), 4);
        assert!(inv.gpus[1].mig_enabled);
        assert_eq!(inv.gpus[1].mig.len(), 2);
        assert_eq!(inv.gpus[1].mig[0].memory_mib, 40 * 1024);
        assert_eq!(inv.gpus[0].nvlink_peers, vec![1, 2, 3]);
        assert!(b.initial_faults().is_empty());
        let sick = NODE.replace(
            "        - index: 1\n",
            "        - index: 2\n          healthy: false\n        - index: 1\n",
        );
        let b = FakeBackend::from_yaml(&sick, "n.yaml").unwrap();
        assert_eq!(
            b.initial_faults(),
            vec![b.inventory_ref().gpus[2].uuid.clone()]
        );
    }

    #[test]
    fn errors_name_file_and_field() {
        let e = FakeBackend::from_yaml(
            &NODE.replace("count: 4", "count: 4\n      bogus: 1"),
            "n.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("n.yaml") && e.contains("bogus"), "{e}");
        let e = FakeBackend::from_yaml(&NODE.replace("80Gi", "80Gx"), "n.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpus.memory"), "{e}");
        let e = FakeBackend::from_yaml(
            &NODE.replace("- name: n\n", "- name: n\n    count: 2\n"),
            "n.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("exactly one"), "{e}");
    }

    #[test]
    fn control_lines() {
        let b = FakeBackend::from_yaml(NODE, "n.yaml").unwrap();
        let inv = b.inventory_ref();
        let u0 = inv.gpus[0].uuid.clone();
        assert_eq!(
            parse_control_line("xid 0 79", inv).unwrap(),
            Some(HealthEvent::Xid {
                gpu: u0.clone(),
                xid: 79
            })
        );
        assert_eq!(
            parse_control_line(&format!("healthy {u0}"), inv).unwrap(),
            Some(HealthEvent::Release { gpu: u0 })
        );
        assert_eq!(parse_control_line("# c", inv).unwrap(), None);
        assert!(parse_control_line("xid 9 79", inv).is_err());
        // XID 0 is no XID (it used to count as a fault).
        assert!(parse_control_line("xid 0 0", inv).is_err());
        assert!(parse_control_line("explode 0", inv).is_err());
    }

    /// A control file replaced by a rename (editors, `mv`) kept its old
    /// line count, so its first lines were skipped.
    #[test]
    fn replaced_control_file_is_ignored() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("control");
        std::fs::write(&path, "xid 0 79\n").unwrap();
        let b = FakeBackend::from_yaml(NODE, "n.yaml").unwrap();
        let b = FakeBackend {
            control: Some(path.clone()),
            ..b
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        b.watch_health(
            HealthWatch {
                check_interval: Duration::from_secs(1),
            },
            tx,
        )
        .unwrap();
        let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<HealthEvent>| {
            let t0 = std::time::Instant::now();
            loop {
                if let Ok(ev) = rx.try_recv() {
                    return Some(ev);
                }
                if t0.elapsed() > Duration::from_secs(2) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let inv = b.inventory_ref();
        assert_eq!(
            next(&mut rx),
            Some(HealthEvent::Xid {
                gpu: inv.gpus[0].uuid.clone(),
                xid: 79
            })
        );
        // Same length, one line: only the inode tells it is new.
        let tmp = d.path().join("control.new");
        std::fs::write(&tmp, "xid 2 48\n").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(
            next(&mut rx),
            Some(HealthEvent::Xid {
                gpu: inv.gpus[2].uuid.clone(),
                xid: 48
            })
        );
    }
}
