//! gpusched-sim
