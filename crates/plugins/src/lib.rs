//! gpusched-plugins
