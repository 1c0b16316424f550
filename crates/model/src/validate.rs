//! The Kubernetes rules for GPU requests, applied to container resources as
//! they appear in a pod spec (quantity strings).
//!
//! - Extended resources (`nvidia.com/gpu`, MIG profiles, our share
//!   resources) are whole numbers and never overcommitted.
//! - A limit alone implies an equal request.
//! - When both are given, they must be equal.
//! - A request without a limit is refused for extended resources.
//!
//! gpusched's GPU shares are extended resources too:
//! `gpusched.io/gpu-milli` (thousandths of one GPU, 1–999) and
//! `gpusched.io/gpu-memory-mib` (MiB of one GPU's memory). They cannot be
//! combined with `nvidia.com/gpu`.

use crate::labels::{RESOURCE_GPU, RESOURCE_GPU_MEMORY_MIB, RESOURCE_GPU_MILLI};
use crate::pod::GpuRequest;
use crate::quantity::{QuantityError, parse_bytes, parse_cpu_milli, parse_integer};
use crate::resources::ResourceVec;
use std::collections::BTreeMap;

/// Resources of one container, as quantity strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// Container name.
    pub name: String,
    /// `resources.requests`, by resource name.
    pub requests: BTreeMap<String, String>,
    /// `resources.limits`, by resource name.
    pub limits: BTreeMap<String, String>,
}

/// A refused resource specification, naming container and resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A quantity could not be read.
    #[error("container {container:?}: resource {resource:?}: {source}")]
    Quantity {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Why the quantity was refused.
        source: QuantityError,
    },
    #[error(
        "container {container:?}: resource {resource:?}: request {request} must equal limit {limit} (extended resources cannot be overcommitted)"
    )]
    /// An extended resource's request differs from its limit.
    RequestNotEqualLimit {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The request as written.
        request: String,
        /// The limit as written.
        limit: String,
    },
    #[error(
        "container {container:?}: resource {resource:?}: a request without a limit is not allowed for extended resources; set limits (requests then default to them)"
    )]
    /// An extended resource requested without a limit.
    RequestWithoutLimit {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
    },
    /// Anything else wrong with the container.
    #[error("container {container:?}: {what}")]
    Invalid {
        /// Container name.
        container: String,
        /// What is wrong.
        what: String,
    },
}

fn is_extended(name: &str) -> bool {
    // Native resources: cpu, memory, ephemeral-storage, hugepages-*, and
    // anything in the kubernetes.io domain.
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.contains(".kubernetes.io/")
}

/// `sum + value`, or an error naming the container whose request made the
/// pod's total overflow (a wrapped sum would look small: #38).
pub fn add_checked(
    sum: u64,
    value: u64,
    container: &str,
    resource: &str,
) -> Result<u64, ResourceError> {
    sum.checked_add(value)
        .ok_or_else(|| ResourceError::Invalid {
            container: container.to_string(),
            what: format!(
                "resource {resource:?}: the pod's total request overflows (over {} in the resource's units)",
                u64::MAX
            ),
        })
}

/// Pod-level requests and GPU request from container resources.
pub fn pod_resources(
    containers: &[ContainerResources],
) -> Result<(ResourceVec, GpuRequest), ResourceError> {
    let mut total = ResourceVec::default();
    let mut whole: u64 = 0;
    let mut share_milli: u64 = 0;
    let mut share_mem: u64 = 0;
    for c in containers {
        let qerr = |resource: &str, source| ResourceError::Quantity {
            container: c.name.clone(),
            resource: resource.to_string(),
            source,
        };
        let mut names: Vec<&String> = c.requests.keys().chain(c.limits.keys()).collect();
        names.sort();
        names.dedup();
        for name in names {
            let req = c.requests.get(name);
            let lim = c.limits.get(name);
            if is_extended(name) {
                let value = match (req, lim) {
                    (Some(r), Some(l)) => {
                        let rv = parse_integer(r).map_err(|e| qerr(name, e))?;
                        let lv = parse_integer(l).map_err(|e| qerr(name, e))?;
                        if rv != lv {
                            return Err(ResourceError::RequestNotEqualLimit {
                                container: c.name.clone(),
                                resource: name.clone(),
                                request: r.clone(),
                                limit: l.clone(),
                            });
                        }
                        rv
                    }
                    (None, Some(l)) => parse_integer(l).map_err(|e| qerr(name, e))?,
                    (Some(_), None) => {
                        return Err(ResourceError::RequestWithoutLimit {
                            container: c.name.clone(),
                            resource: name.clone(),
                        });
                    }
                    (None, None) => 0,
                };
                let sum = match name.as_str() {
                    RESOURCE_GPU => &mut whole,
                    RESOURCE_GPU_MILLI => &mut share_milli,
                    RESOURCE_GPU_MEMORY_MIB => &mut share_mem,
                    _ => total.ext.entry(name.clone()).or_insert(0),
                };
                *sum = add_checked(*sum, value, &c.name, name)?;
            } else {
                // native resources: the request counts; a limit alone implies it.
                let Some(s) = req.or(lim) else { continue };
                match name.as_str() {
                    "cpu" => {
                        let v = parse_cpu_milli(s).map_err(|e| qerr(name, e))?;
                        total.cpu_milli = add_checked(total.cpu_milli, v, &c.name, name)?;
                    }
                    "memory" => {
                        let v = parse_bytes(s).map_err(|e| qerr(name, e))?;
                        total.memory = add_checked(total.memory, v, &c.name, name)?;
                    }
                    _ => {
                        // other native resources are not scheduled on by gpusched,
                        // but a malformed value is still an error.
                        parse_bytes(s).map_err(|e| qerr(name, e))?;
                    }
                }
            }
        }
    }
    let container = containers
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let gpu = if (share_milli > 0 || share_mem > 0) && whole > 0 {
        return Err(ResourceError::Invalid {
            container,
            what: format!(
                "{RESOURCE_GPU} cannot be combined with {RESOURCE_GPU_MILLI}/{RESOURCE_GPU_MEMORY_MIB}"
            ),
        });
    } else if share_milli >= 1000 {
        return Err(ResourceError::Invalid {
            container,
            what: format!(
                "{RESOURCE_GPU_MILLI} must be 1..999 (got {share_milli}); ask for whole GPUs with {RESOURCE_GPU}"
            ),
        });
    } else if share_milli > 0 || share_mem > 0 {
        GpuRequest::Share {
            milli: share_milli as u32,
            memory_mib: share_mem,
        }
    } else if whole > 0 {
        GpuRequest::Whole(u32::try_from(whole).map_err(|_| ResourceError::Invalid {
            container,
            what: format!("{RESOURCE_GPU}: {whole} GPUs is out of range"),
        })?)
    } else {
        GpuRequest::None
    };
    Ok((total, gpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(req: &[(&str, &str)], lim: &[(&str, &str)]) -> ContainerResources {
        ContainerResources {
            name: "main".into(),
            requests: req
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            limits: lim
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        }
    }

    #[test]
    fn limits_only_implies_requests() {
        let (r, g) = pod_resources(&[c(&[("cpu", "500m")], &[("nvidia.com/gpu", "2")])]).unwrap();
        assert_eq!(g, GpuRequest::Whole(2));
        assert_eq!(r.cpu_milli, 500);
    }

    #[test]
    fn requests_must_equal_limits() {
        let e = pod_resources(&[c(&[("nvidia.com/gpu", "1")], &[("nvidia.com/gpu", "2")])])
            .unwrap_err();
        assert!(e.to_string().contains("must equal limit"), "{e}");
        assert!(e.to_string().contains("\"main\""), "{e}");
        let ok =
            pod_resources(&[c(&[("nvidia.com/gpu", "2")], &[("nvidia.com/gpu", "2")])]).unwrap();
        assert_eq!(ok.1, GpuRequest::Whole(2));
    }

    #[test]
    fn gpus_are_integers() {
        let e = pod_resources(&[c(&[], &[("nvidia.com/gpu", "0.5")])]).unwrap_err();
        assert!(e.to_string().contains("whole number"), "{e}");
        let e = pod_resources(&[c(&[], &[("nvidia.com/gpu", "500m")])]).unwrap_err();
        assert!(matches!(e, ResourceError::Quantity { .. }));
        let e = pod_resources(&[c(&[], &[("nvidia.com/gpu", "-1")])]).unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
    }

    /// #38: 2^63-1 + 2^63-1 + 3 wrapped to 1 in release builds.
    #[test]
    fn summed_requests_that_overflow_are_refused_naming_the_container() {
        let big = "9223372036854775807";
        let mk = |name: &str, v: &str, res: &str| ContainerResources {
            name: name.into(),
            requests: BTreeMap::new(),
            limits: BTreeMap::from([(res.to_string(), v.to_string())]),
        };
        for res in ["nvidia.com/gpu", "example.com/thing", "memory"] {
            let e = pod_resources(&[mk("a", big, res), mk("b", big, res), mk("c", "3", res)])
                .unwrap_err();
            let m = e.to_string();
            assert!(m.contains("\"c\"") && m.contains("overflows"), "{res}: {m}");
        }
        let e = pod_resources(&[
            mk("a", "9223372036854775", "cpu"),
            mk("b", "9223372036854775", "cpu"),
            mk("c", "9223372036854775", "cpu"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }

    #[test]
    fn request_without_limit_refused() {
        let e = pod_resources(&[c(&[("nvidia.com/gpu", "1")], &[])]).unwrap_err();
        assert!(matches!(e, ResourceError::RequestWithoutLimit { .. }));
    }

    #[test]
    fn shares_and_sums() {
        let (_, g) = pod_resources(&[c(
            &[],
            &[
                ("gpusched.io/gpu-milli", "300"),
                ("gpusched.io/gpu-memory-mib", "8192"),
            ],
        )])
        .unwrap();
        assert_eq!(
            g,
            GpuRequest::Share {
                milli: 300,
                memory_mib: 8192
            }
        );
        let e = pod_resources(&[c(
            &[],
            &[("gpusched.io/gpu-milli", "300"), ("nvidia.com/gpu", "1")],
        )])
        .unwrap_err();
        assert!(matches!(e, ResourceError::Invalid { .. }));
        let (r, g) = pod_resources(&[
            c(
                &[("memory", "1Gi")],
                &[("nvidia.com/gpu", "1"), ("rdma/hca", "1")],
            ),
            c(&[("memory", "1Gi")], &[("nvidia.com/gpu", "1")]),
        ])
        .unwrap();
        assert_eq!(g, GpuRequest::Whole(2));
        assert_eq!(r.memory, 2 << 30);
        assert_eq!(r.ext_get("rdma/hca"), 1);
    }
}
