//! gpusched-testkit
