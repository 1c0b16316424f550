//! Scheduling policies of gpusched, registered explicitly from typed config.

pub mod packing;
