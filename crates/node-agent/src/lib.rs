//! gpusched node agent: a kubelet device plugin (API v1beta1) for NVIDIA
//! GPUs, or a DRA kubelet plugin ([`dra`], `--mode dra`).
//!
//! Layers, from the bottom: [`backend`] finds GPUs and reports health facts;
//! [`health`] turns facts into a recoverable health state; [`plan`] decides
//! which resources and device ids the node offers and answers allocation
//! questions (pure); [`agent`] ties them together and publishes device lists;
//! [`server`] speaks gRPC to the kubelet over unix sockets.

pub mod agent;
pub mod authority;
pub mod backend;
pub mod cli;
pub mod config;
pub mod coord;
pub mod decisions;
pub mod dra;
pub mod health;
pub mod http;
pub mod kube;
pub mod labels;
pub mod lock;
pub mod matching;
pub mod metrics;
pub mod plan;
pub mod podresources;
pub mod server;
pub mod text;

/// Generated code for the kubelet device plugin API (package `v1beta1`).
#[allow(clippy::all, missing_docs)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// Generated code for the kubelet PodResources API (package `v1`, `List`),
/// and the DRA resource-health API (also package `v1`; see [`dra_health_v1`]).
#[allow(clippy::all, missing_docs)]
pub mod podresources_api {
    tonic::include_proto!("v1");
}

/// Generated code for the kubelet DRA plugin API, version v1.
#[allow(clippy::all, missing_docs)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Generated code for the kubelet DRA plugin API, version v1beta1.
#[allow(clippy::all, missing_docs)]
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Generated code for the kubelet plugin registration API
/// (`pluginregistration`, used by DRA plugins).
#[allow(clippy::all, missing_docs)]
pub mod registration_api {
    tonic::include_proto!("pluginregistration");
}

/// The DRA resource-health API (`v1.DRAResourceHealth`), generated into
/// [`podresources_api`] because both are upstream's package `v1`.
pub mod dra_health_v1 {
    pub use crate::podresources_api::{
        DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
        NodeWatchResourcesResponse, dra_resource_health_client, dra_resource_health_server,
    };
}
