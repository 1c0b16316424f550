//! gpusched-core
