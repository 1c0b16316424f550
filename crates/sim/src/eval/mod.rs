//! The FGD paper's evaluation method and what is built on it — research
//! tooling, apart from the simulator's product modules (the scenario
//! simulator `engine`, `workload`, `load`, `metrics`, `report`, `table`,
//! `replay`).
//!
//! - [`fgd_method`]: the method behind the published numbers of Weng et
//!   al., USENIX ATC '23 (`gpusched simulate --openb`);
//! - [`consolidate_method`]: the same method with consolidation moves
//!   (`--move-budget`);
//! - [`variants`]: the trace variants of the paper (`--variants`);
//! - [`common`]: the run and result types the three share.
//!
//! Dependencies run one way: `fgd_method` → `consolidate_method` →
//! `common`; `variants` stands alone. The openb trace parser is
//! [`crate::openb`].

pub mod common;
pub mod consolidate_method;
pub mod fgd_method;
pub mod variants;

pub use common::{MethodResult, SeedRun, mean_stdev};
