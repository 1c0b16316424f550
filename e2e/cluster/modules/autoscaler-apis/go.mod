// A config-only component (no binary): e2e/cluster/build copies this
// module's config/ (the ProvisioningRequest CRD of autoscaling.x-k8s.io/v1)
// into the cache for crates/k8s/tests/provreq_e2e.rs. The version is the
// pseudo-version Kueue v0.14.0 pins; the module proxy here answers 403 for
// the tagged releases (v1.32.0 to v1.34.0) and for every version of
// k8s.io/autoscaler/cluster-autoscaler itself.
module gpusched.io/e2e/cluster/modules/autoscaler-apis

go 1.26.0

require k8s.io/autoscaler/cluster-autoscaler/apis v0.0.0-20240830133931-adfbe7e45277
