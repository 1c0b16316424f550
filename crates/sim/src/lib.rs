//! Trace-driven discrete-event simulator of gpusched.

pub mod fgd_method;
pub mod openb;
