//! gpusched on Kubernetes: the only crate that knows Kubernetes types.
//!
//! Watches (reflectors) feed a [`world::World`] of translated objects
//! ([`translate`], pure and fixture-tested); each cycle builds the core's
//! snapshot from it, runs `Scheduler::cycle`, and the executor turns the
//! decisions into bindings, evictions, events and status updates.

pub mod client;
pub mod controller;
pub mod crd;
pub mod debug;
pub mod decision;
pub mod dra;
pub mod exec;
pub mod kwok;
pub mod limiter;
pub mod metrics;
pub mod podapi;
pub mod provreq;
pub mod rbac;
pub mod sharing;
pub mod tls;
pub mod tools;
pub mod translate;
pub mod volumes;
pub mod watch;
pub mod workloads;
pub mod world;
