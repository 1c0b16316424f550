//! gpusched on Kubernetes: the only crate that knows Kubernetes types.
//!
//! Watches (reflectors) feed a [`world::World`] of translated objects
//! ([`translate`], pure and fixture-tested); each cycle builds the core's
//! snapshot from it, runs `Scheduler::cycle`, and the executor turns the
//! decisions into bindings, evictions, events and status updates.
//!
//! The running scheduler is everything but [`tools`]: `controller` (the
//! loop and the lease), `watch` and `world` (what it sees), `translate`,
//! `workloads`, `dra` and friends (pure translation), `exec` (every write),
//! `metrics` and `debug` (what it serves). [`tools`] holds the operator's
//! tools (doctor, snapshot capture, the debug endpoint's client); they read
//! the scheduler's modules and nothing in the scheduler imports them.

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
