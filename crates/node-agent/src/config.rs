//! The agent's configuration: a versioned YAML file (`version: v1`), with
//! command-line flags and environment variables layered on top.
//!
//! Every struct denies unknown fields, and every refused value names its
//! field (`sharing.timeSlicing.resources[0].replicas: must be at least 1`).

use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Shortest recovery quiet period: a shorter one lets a fault come and go
/// (in about a millisecond at 0s) before the kubelet reads the device list
/// that shows it.
pub const MIN_QUIET_PERIOD: Duration = Duration::from_secs(1);

/// Recovery quiet period unless configured (`health.quietPeriod`).
pub const DEFAULT_QUIET_PERIOD: Duration = Duration::from_secs(300);
/// Health check period unless configured (`health.checkInterval`).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// Shortest health check period accepted.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// Application XIDs: errors caused by the workload, not the GPU.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// A refused configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The file is not valid YAML (no field to name).
    #[error("config file {path}: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A field of the file has the wrong type, is unknown or missing.
    #[error("config file {path}: field `{field}`: {message}")]
    Field {
        /// The config file.
        path: PathBuf,
        /// Path of the field in the file's spelling (`health.ignoredXids`).
        field: String,
        /// What is wrong, with the line and column where known.
        message: String,
    },
    /// A value read is out of range or inconsistent.
    #[error("{origin}: field `{field}`: {why}")]
    Value {
        /// Where the value came from (the file, a flag or an environment variable).
        origin: String,
        /// The field, flag or variable, as spelled there.
        field: String,
        /// Why it is refused.
        why: String,
    },
}

fn value_err(origin: &str, field: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        origin: origin.to_string(),
        field: field.to_string(),
        why: why.into(),
    }
}

/// Which device source the agent uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// NVIDIA's management library (real GPUs).
    #[default]
    Nvml,
    /// GPUs described by a node file (`backend.nodeFile`), with faults injected through a control file.
    Fake,
}

/// How device ids are spelled towards the kubelet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceIdStrategy {
    /// The GPU or MIG device UUID.
    #[default]
    Uuid,
    /// The GPU index (`<gpu>:<mig>` for MIG devices).
    Index,
}

/// How MIG devices are offered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MigStrategy {
    /// Whole GPUs only, whatever their MIG mode.
    #[default]
    None,
    /// Every GPU in MIG mode with one profile; MIG devices as `nvidia.com/gpu`.
    Single,
    /// One resource per profile, `nvidia.com/mig-<profile>`.
    Mixed,
}

/// A YAML document that could not be read into its type: `field` is the
/// path of the offending value in the document's spelling
/// (`sharing.timeSlicing.resources[0].replicas`), absent for syntax errors.
#[derive(Debug)]
pub struct YamlError {
    /// Path of the offending value, absent for syntax errors.
    pub field: Option<String>,
    /// The parser's message, without its `error: ` prefix.
    pub message: String,
}

/// Parses YAML into `T`, tracking the path of the value being read so that
/// type errors, unknown keys and missing fields name their field.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let mut field = None;
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
            let p = e.path().to_string();
            // "." is the document itself, "?" an unknown place (syntax).
            if p != "." && p != "?" {
                field = Some(p);
            }
            e.into_inner()
        })
    })
    .map_err(|e| {
        let m = e.to_string();
        YamlError {
            field,
            message: m.strip_prefix("error: ").unwrap_or(&m).to_string(),
        }
    })
}

/// The file, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    /// Required; `Option` so that a missing version is reported like a
    /// wrong one.
    pub version: Option<String>,
    /// `plugin:`: sockets and device ids.
    #[serde(default)]
    pub plugin: PluginSection,
    /// `backend:`: where GPUs come from.
    #[serde(default)]
    pub backend: BackendSection,
    /// `health:`: fault handling.
    #[serde(default)]
    pub health: HealthSection,
    /// `sharing:`: time-slicing.
    #[serde(default)]
    pub sharing: SharingSection,
    /// `labels:`: node labels for node-feature-discovery.
    #[serde(default)]
    pub labels: LabelsSection,
    /// `metrics:`: the HTTP server.
    #[serde(default)]
    pub metrics: MetricsSection,
}

/// `plugin:` section of the file (see `docs/agent.md`, *Config file*).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginSection {
    /// Device plugin directory (`/var/lib/kubelet/device-plugins`).
    pub dir: Option<PathBuf>,
    /// The kubelet's registration socket, a file name inside `dir`.
    pub kubelet_socket: Option<String>,
    /// `uuid` or `index`.
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// Also pass `/dev/nvidia*` device nodes in `Allocate` answers.
    pub pass_device_specs: Option<bool>,
    /// Also answer `Allocate` with CDI device names.
    pub cdi_enabled: Option<bool>,
    /// `none`, `single` or `mixed`.
    pub mig_strategy: Option<MigStrategy>,
}

/// `backend:` section of the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendSection {
    /// `nvml` or `fake`.
    pub kind: Option<BackendKind>,
    /// The node fixture the fake backend serves.
    pub node_file: Option<PathBuf>,
    /// The file the fake backend reads fault commands from.
    pub control_file: Option<PathBuf>,
}

/// `health:` section of the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthSection {
    /// Never mark a GPU unhealthy.
    pub disabled: Option<bool>,
    /// Bring a GPU back after a quiet period without faults (`false`: unhealthy until restart).
    pub recover: Option<bool>,
    /// The quiet period (`5m`; at least [`MIN_QUIET_PERIOD`]).
    pub quiet_period: Option<String>,
    /// How often GPUs are checked (`30s`).
    pub check_interval: Option<String>,
    /// XIDs that are not faults (default [`DEFAULT_IGNORED_XIDS`]).
    pub ignored_xids: Option<Vec<u64>>,
}

/// `sharing:` section of the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SharingSection {
    /// `timeSlicing:`: resources advertised several times per device.
    #[serde(default)]
    pub time_slicing: Option<TimeSlicingSection>,
}

/// `sharing.timeSlicing:` section of the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicingSection {
    /// Advertise every time-sliced resource as `<name>.shared`.
    #[serde(default)]
    pub rename_by_default: bool,
    /// Refuse containers that ask for more than one replica.
    #[serde(default)]
    pub fail_requests_greater_than_one: bool,
    /// The resources to time-slice.
    #[serde(default)]
    pub resources: Vec<ReplicatedResource>,
}

/// One entry of `sharing.timeSlicing.resources`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicatedResource {
    /// The resource to share (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
    pub name: String,
    /// Device ids advertised per device (at least 1).
    pub replicas: u32,
    /// The name to advertise instead.
    #[serde(default)]
    pub rename: Option<String>,
}

/// `labels:` section of the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelsSection {
    /// Write no feature file.
    pub disabled: Option<bool>,
    /// Where the node-feature-discovery feature file is written.
    pub feature_file: Option<PathBuf>,
}

/// `metrics:` section of the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsSection {
    /// `host:port`; empty disables the HTTP server.
    pub address: Option<String>,
}

/// Time-slicing of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replication {
    /// The resource being shared (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
    pub name: String,
    /// Device ids advertised per device.
    pub replicas: u32,
    /// Name advertised to the kubelet (`nvidia.com/gpu.shared` when renamed).
    pub advertised: String,
}

/// Effective settings after file, environment and flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Device plugin directory.
    pub plugin_dir: PathBuf,
    /// The kubelet's registration socket, a file name inside `plugin_dir`.
    pub kubelet_socket: String,
    /// How device ids are spelled.
    pub device_id_strategy: DeviceIdStrategy,
    /// Pass `/dev/nvidia*` device nodes in `Allocate` answers.
    pub pass_device_specs: bool,
    /// Answer `Allocate` with CDI device names too.
    pub cdi_enabled: bool,
    /// How MIG devices are offered.
    pub mig_strategy: MigStrategy,
    /// Where GPUs come from.
    pub backend: BackendKind,
    /// The fake backend's node fixture.
    pub node_file: Option<PathBuf>,
    /// The fake backend's fault command file.
    pub control_file: Option<PathBuf>,
    /// Never mark a GPU unhealthy.
    pub health_disabled: bool,
    /// Recover after a quiet period without faults.
    pub recover: bool,
    /// The recovery quiet period (at least [`MIN_QUIET_PERIOD`]).
    pub quiet_period: Duration,
    /// How often GPUs are checked.
    pub check_interval: Duration,
    /// XIDs that are not faults.
    pub ignored_xids: BTreeSet<u64>,
    /// Refuse time-sliced containers asking for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Time-slicing, one entry per shared resource.
    pub replication: Vec<Replication>,
    /// Where the node-feature-discovery feature file is written (none: no file).
    pub feature_file: Option<PathBuf>,
    /// `host:port` of the metrics server (none: no server).
    pub metrics_address: Option<String>,
    /// Advertise `gpusched.io/gpu-milli` (GPU shares).
    pub shares: bool,
    /// The Node this agent runs on (enables the Kubernetes side).
    pub node_name: Option<String>,
    /// Refuse `Allocate` calls that match no scheduler decision.
    pub require_decision: bool,
    /// The kubelet's PodResources socket.
    pub pod_resources_socket: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            plugin_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            kubelet_socket: "kubelet.sock".into(),
            device_id_strategy: DeviceIdStrategy::Uuid,
            pass_device_specs: false,
            cdi_enabled: false,
            mig_strategy: MigStrategy::None,
            backend: BackendKind::Nvml,
            node_file: None,
            control_file: None,
            health_disabled: false,
            recover: true,
            quiet_period: DEFAULT_QUIET_PERIOD,
            check_interval: DEFAULT_CHECK_INTERVAL,
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            fail_requests_greater_than_one: false,
            replication: Vec::new(),
            feature_file: Some(PathBuf::from(
                "/etc/kubernetes/node-feature-discovery/features.d/gpusched",
            )),
            metrics_address: Some("0.0.0.0:9400".into()),
            shares: false,
            node_name: None,
            require_decision: true,
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
        }
    }
}

/// Parses a duration in gpusched's one grammar ([`gpusched_model::duration`]:
/// `250ms`, `30s`, `5m`, `1h`, `1h30m`, `1.5s`). A bare whole number means
/// seconds, as earlier agent configurations wrote it.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let n: u64 = t
            .parse()
            .map_err(|_| format!("{s:?} is out of range for a duration"))?;
        return Ok(Duration::from_secs(n));
    }
    gpusched_model::duration::parse_duration_ms(t)
        .map(Duration::from_millis)
        .map_err(|e| e.to_string())
}

/// Why a quiet period under [`MIN_QUIET_PERIOD`] is refused.
pub fn quiet_period_too_short(given: &str) -> String {
    format!(
        "{given:?} is under the minimum of 1s: a shorter quiet period lets a fault \
         come and go before the kubelet reads the device list that shows it"
    )
}

/// Checks that a resource name is one this agent may advertise.
fn valid_resource(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    domain == "nvidia.com"
        && !rest.is_empty()
        && rest.len() <= 63
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

impl ConfigFile {
    /// Reads and parses a config file; errors name the file and, from the
    /// YAML parser, the line and field.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses config file text; `path` names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, ConfigError> {
        let f: ConfigFile = parse_yaml(text).map_err(|e| match e.field {
            Some(field) => ConfigError::Field {
                path: path.to_path_buf(),
                field,
                message: e.message,
            },
            None => ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.message,
            },
        })?;
        match f.version.as_deref() {
            Some("v1") => {}
            Some(v) => {
                return Err(value_err(
                    &path.display().to_string(),
                    "version",
                    format!("unsupported version {v:?} (expected \"v1\")"),
                ));
            }
            None => {
                return Err(value_err(
                    &path.display().to_string(),
                    "version",
                    "missing (expected \"v1\")",
                ));
            }
        }
        Ok(f)
    }

    /// Applies the file on top of `s`. `origin` names the file in errors.
    pub fn apply(&self, s: &mut Settings, origin: &str) -> Result<(), ConfigError> {
        let p = &self.plugin;
        if let Some(d) = &p.dir {
            s.plugin_dir = d.clone();
        }
        if let Some(k) = &p.kubelet_socket {
            s.kubelet_socket = k.clone();
        }
        if let Some(v) = p.device_id_strategy {
            s.device_id_strategy = v;
        }
        if let Some(v) = p.pass_device_specs {
            s.pass_device_specs = v;
        }
        if let Some(v) = p.cdi_enabled {
            s.cdi_enabled = v;
        }
        if let Some(v) = p.mig_strategy {
            s.mig_strategy = v;
        }
        let b = &self.backend;
        if let Some(k) = b.kind {
            s.backend = k;
        }
        if b.node_file.is_some() {
            s.node_file = b.node_file.clone();
        }
        if b.control_file.is_some() {
            s.control_file = b.control_file.clone();
        }
        let h = &self.health;
        if let Some(v) = h.disabled {
            s.health_disabled = v;
        }
        if let Some(v) = h.recover {
            s.recover = v;
        }
        if let Some(q) = &h.quiet_period {
            s.quiet_period =
                parse_duration(q).map_err(|w| value_err(origin, "health.quietPeriod", w))?;
            if s.quiet_period < MIN_QUIET_PERIOD {
                return Err(value_err(
                    origin,
                    "health.quietPeriod",
                    quiet_period_too_short(q),
                ));
            }
        }
        if let Some(q) = &h.check_interval {
            let d = parse_duration(q).map_err(|w| value_err(origin, "health.checkInterval", w))?;
            if d < MIN_CHECK_INTERVAL {
                return Err(value_err(
                    origin,
                    "health.checkInterval",
                    format!("must be at least {MIN_CHECK_INTERVAL:?}"),
                ));
            }
            s.check_interval = d;
        }
        if let Some(x) = &h.ignored_xids {
            s.ignored_xids = x.iter().copied().collect();
        }
        if let Some(ts) = &self.sharing.time_slicing {
            s.fail_requests_greater_than_one = ts.fail_requests_greater_than_one;
            s.replication.clear();
            let mut seen = BTreeSet::new();
            for (i, r) in ts.resources.iter().enumerate() {
                let field = format!("sharing.timeSlicing.resources[{i}]");
                if !valid_resource(&r.name) {
                    return Err(value_err(
                        origin,
                        &format!("{field}.name"),
                        format!(
                            "{:?} is not an nvidia.com resource (e.g. nvidia.com/gpu)",
                            r.name
                        ),
                    ));
                }
                if !seen.insert(r.name.clone()) {
                    return Err(value_err(
                        origin,
                        &format!("{field}.name"),
                        format!("duplicate resource {:?}", r.name),
                    ));
                }
                if r.replicas < 1 {
                    return Err(value_err(
                        origin,
                        &format!("{field}.replicas"),
                        "must be at least 1",
                    ));
                }
                let max = crate::plan::MAX_DEVICES_PER_RESOURCE;
                if r.replicas as usize > max {
                    return Err(value_err(
                        origin,
                        &format!("{field}.replicas"),
                        format!(
                            "{} is more than {max}, the most devices one resource may advertise \
                             (a kubelet refuses device lists over 4 MiB)",
                            r.replicas
                        ),
                    ));
                }
                let advertised = match &r.rename {
                    Some(n) if !valid_resource(n) => {
                        return Err(value_err(
                            origin,
                            &format!("{field}.rename"),
                            format!("{n:?} is not an nvidia.com resource"),
                        ));
                    }
                    Some(n) => n.clone(),
                    None if ts.rename_by_default => format!("{}.shared", r.name),
                    None => r.name.clone(),
                };
                s.replication.push(Replication {
                    name: r.name.clone(),
                    replicas: r.replicas,
                    advertised,
                });
            }
        }
        if self.labels.disabled == Some(true) {
            s.feature_file = None;
        } else if let Some(f) = &self.labels.feature_file {
            s.feature_file = Some(f.clone());
        }
        if let Some(a) = &self.metrics.address {
            s.metrics_address = if a.is_empty() {
                None
            } else {
                if a.parse::<std::net::SocketAddr>().is_err() {
                    return Err(value_err(
                        origin,
                        "metrics.address",
                        format!("{a:?} is not host:port (e.g. 0.0.0.0:9400)"),
                    ));
                }
                Some(a.clone())
            };
        }
        Ok(())
    }
}

impl Settings {
    /// Final cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let o = "settings";
        if self.backend == BackendKind::Fake && self.node_file.is_none() {
            return Err(value_err(
                o,
                "backend.nodeFile (--node-file)",
                "the fake backend needs a node file",
            ));
        }
        if self.kubelet_socket.is_empty() || self.kubelet_socket.contains('/') {
            return Err(value_err(
                o,
                "plugin.kubeletSocket (--kubelet-socket)",
                "must be a file name inside the plugin directory",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Result<Settings, ConfigError> {
        let p = Path::new("test.yaml");
        let f = ConfigFile::parse(t, p)?;
        let mut s = Settings::default();
        f.apply(&mut s, "test.yaml")?;
        Ok(s)
    }

    #[test]
    fn full_file() {
        let s = parse(
            "version: v1\nplugin:\n  dir: /tmp/dp\n  deviceIdStrategy: index\n  migStrategy: mixed\n  cdiEnabled: true\nhealth:\n  quietPeriod: 90s\n  ignoredXids: [13]\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\nmetrics:\n  address: \"\"\n",
        )
        .unwrap();
        assert_eq!(s.plugin_dir, PathBuf::from("/tmp/dp"));
        assert_eq!(s.device_id_strategy, DeviceIdStrategy::Index);
        assert_eq!(s.mig_strategy, MigStrategy::Mixed);
        assert!(s.cdi_enabled);
        assert_eq!(s.quiet_period, Duration::from_secs(90));
        assert_eq!(s.ignored_xids, [13].into_iter().collect());
        assert_eq!(s.replication[0].advertised, "nvidia.com/gpu.shared");
        assert_eq!(s.replication[0].replicas, 4);
        assert!(s.fail_requests_greater_than_one);
        assert_eq!(s.metrics_address, None);
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse("version: v2\n").unwrap_err().to_string();
        assert!(e.contains("`version`"), "{e}");
        let e = parse("version: v1\nplugin:\n  bogus: 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sharing.timeSlicing.resources[0].replicas"),
            "{e}"
        );
        let e = parse("version: v1\nhealth:\n  quietPeriod: 5 parsecs\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("health.quietPeriod"), "{e}");
        let e = parse("version: v1\nplugin:\n  migStrategy: sometimes\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sometimes") || e.contains("migStrategy"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("x").is_err());
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("3x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999").is_err());
    }
}
