//! The names gpusched's DRA driver publishes and its scheduler reads
//! (`resource.k8s.io/v1`).
//!
//! The node agent in DRA mode publishes one ResourceSlice pool per node
//! (pool name = node name) under [`DRIVER`]. Each whole GPU is one device
//! named `gpu-<index>` ([`gpu_device_name`]). The scheduler turns those
//! devices back into the core's GPUs, so the attribute names below are the
//! contract between the two sides: change them on both or not at all.
//!
//! Attribute names without a domain belong to the driver's domain, as DRA
//! defines (a CEL selector reads them as
//! `device.attributes["gpu.gpusched.io"].productName`).

/// The DRA driver name of gpusched's node agent.
pub const DRIVER: &str = "gpu.gpusched.io";

/// The DeviceClass the chart ships for whole GPUs of this driver.
pub const DEVICE_CLASS: &str = "gpu.gpusched.io";

/// Device attribute: the GPU's UUID (string).
pub const ATTR_UUID: &str = "uuid";
/// Device attribute: the GPU's index on its node (int).
pub const ATTR_INDEX: &str = "index";
/// Device attribute: the product name, e.g. `NVIDIA H100 80GB HBM3` (string).
pub const ATTR_PRODUCT_NAME: &str = "productName";
/// Device attribute: the GPU model as gpusched names it, e.g. `H100` (string).
pub const ATTR_MODEL: &str = "model";
/// Device attribute: the architecture, e.g. `Hopper` (string).
pub const ATTR_ARCHITECTURE: &str = "architecture";
/// Device attribute: the NUMA node the GPU sits on (int).
pub const ATTR_NUMA_NODE: &str = "numaNode";
/// Device attribute: the NVLink domain (string); GPUs sharing it are NVLink-connected.
pub const ATTR_NVLINK_DOMAIN: &str = "nvlinkDomain";
/// Device attribute, Kubernetes' standard name: the PCIe root complex (string).
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Device capacity: the GPU's memory (quantity, bytes, e.g. `80Gi`).
pub const CAPACITY_MEMORY: &str = "memory";

/// The device name of the whole GPU with this index.
pub fn gpu_device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The index of a whole-GPU device name, `None` when it is not one.
pub fn gpu_device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_round_trip_and_refuse_others() {
        for i in [0, 7, 15, 1023] {
            assert_eq!(gpu_device_index(&gpu_device_name(i)), Some(i));
        }
        for bad in [
            "gpu-",
            "gpu-01",
            "gpu--1",
            "gpu-x",
            "mig-0",
            "gpu-99999999999",
        ] {
            assert_eq!(gpu_device_index(bad), None, "{bad}");
        }
    }
}
