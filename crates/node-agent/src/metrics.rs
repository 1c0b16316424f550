//! Prometheus metrics, named `gpusched_agent_…` (see docs/agent.md).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of per-GPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    /// The GPU UUID.
    pub gpu: String,
    /// The GPU index, as text.
    pub index: String,
    /// The GPU model.
    pub model: String,
}

/// Labels of per-resource series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The advertised resource name.
    pub resource: String,
}

/// Labels of request outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The advertised resource name.
    pub resource: String,
    /// The device plugin method (`Allocate`, …).
    pub method: String,
    /// The gRPC status code of the answer (`OK`, …).
    pub code: String,
}

type GaugeF = Gauge<f64, AtomicU64>;

/// Every metric the agent exports.
pub struct Metrics {
    /// The registry `/metrics` encodes.
    pub registry: Registry,
    /// `gpusched_agent_gpu_utilization_ratio`.
    pub utilization: Family<GpuLabels, GaugeF>,
    /// `gpusched_agent_gpu_memory_used_bytes`.
    pub memory_used: Family<GpuLabels, Gauge>,
    /// `gpusched_agent_gpu_memory_total_bytes`.
    pub memory_total: Family<GpuLabels, Gauge>,
    /// `gpusched_agent_gpu_power_watts`.
    pub power: Family<GpuLabels, GaugeF>,
    /// `gpusched_agent_gpu_temperature_celsius`.
    pub temperature: Family<GpuLabels, GaugeF>,
    /// `gpusched_agent_gpu_healthy`: 1 when offered as Healthy.
    pub healthy: Family<GpuLabels, Gauge>,
    /// `gpusched_agent_gpu_allocated`: 1 once handed to a container.
    pub allocated: Family<GpuLabels, Gauge>,
    /// `gpusched_agent_gpu_xid_errors`, ignored XIDs included.
    pub xid: Family<GpuLabels, Counter>,
    /// `gpusched_agent_gpu_health_transitions`.
    pub health_transitions: Family<GpuLabels, Counter>,
    /// `gpusched_agent_registrations` with the kubelet.
    pub registrations: Family<ResourceLabels, Counter>,
    /// `gpusched_agent_device_list_updates` after the first list.
    pub list_updates: Family<ResourceLabels, Counter>,
    /// `gpusched_agent_requests` by method and gRPC code.
    pub requests: Family<RequestLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every family, registered and empty.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            utilization: Family::default(),
            memory_used: Family::default(),
            memory_total: Family::default(),
            power: Family::default(),
            temperature: Family::default(),
            healthy: Family::default(),
            allocated: Family::default(),
            xid: Family::default(),
            health_transitions: Family::default(),
            registrations: Family::default(),
            list_updates: Family::default(),
            requests: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "gpusched_agent_gpu_utilization_ratio",
            "Fraction of time a kernel ran on the GPU over the last sample period",
            m.utilization.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_memory_used_bytes",
            "GPU memory in use",
            m.memory_used.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_memory_total_bytes",
            "GPU memory installed",
            m.memory_total.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_power_watts",
            "GPU power draw",
            m.power.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_temperature_celsius",
            "GPU core temperature",
            m.temperature.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_healthy",
            "1 when the GPU is offered as Healthy, 0 when withheld",
            m.healthy.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_allocated",
            "1 when the GPU was handed to a container by Allocate since the agent started",
            m.allocated.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_xid_errors",
            "XID errors seen, ignored ones included",
            m.xid.clone(),
        );
        registry.register(
            "gpusched_agent_gpu_health_transitions",
            "Changes between healthy and unhealthy",
            m.health_transitions.clone(),
        );
        registry.register(
            "gpusched_agent_registrations",
            "Successful registrations with the kubelet",
            m.registrations.clone(),
        );
        registry.register(
            "gpusched_agent_device_list_updates",
            "Device lists published to ListAndWatch streams after the first",
            m.list_updates.clone(),
        );
        registry.register(
            "gpusched_agent_requests",
            "Device plugin requests by method and gRPC code",
            m.requests.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
