# Shared helpers for e2e/cluster scripts (sourced, not executed).
# shellcheck shell=bash

E2E_CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_REPO_ROOT="$(cd "$E2E_CLUSTER_DIR/../.." && pwd)"
# Binaries are cached outside the clone, keyed by component and version, so
# any clone on the same machine reuses them.
E2E_CACHE="${GPUSCHED_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched-e2e}"

# All components, in build order. kube-controller-manager, jobset and lws
# are for the workload e2e tests (crates/k8s/tests/workloads_e2e.rs), which
# start them; `cluster up` does not.
E2E_COMPONENTS=(etcd kube-apiserver kwok kube-scheduler kube-controller-manager jobset lws)

# component_module <component>: the wrapper module directory name.
component_module() {
  case "$1" in
    etcd) echo etcd ;;
    kube-apiserver|kube-scheduler|kube-controller-manager) echo kubernetes ;;
    kwok) echo kwok ;;
    jobset) echo jobset ;;
    lws) echo lws ;;
    *) echo "unknown component: $1" >&2; return 2 ;;
  esac
}

# component_upstream <component>: the upstream module whose version keys the cache.
component_upstream() {
  case "$1" in
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    kube-apiserver|kube-scheduler|kube-controller-manager) echo k8s.io/kubernetes ;;
    kwok) echo sigs.k8s.io/kwok ;;
    jobset) echo sigs.k8s.io/jobset ;;
    lws) echo sigs.k8s.io/lws ;;
    *) echo "unknown component: $1" >&2; return 2 ;;
  esac
}

# component_package <component>: the main package to build.
component_package() {
  case "$1" in
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    kube-apiserver) echo k8s.io/kubernetes/cmd/kube-apiserver ;;
    kube-scheduler) echo k8s.io/kubernetes/cmd/kube-scheduler ;;
    kube-controller-manager) echo k8s.io/kubernetes/cmd/kube-controller-manager ;;
    kwok) echo sigs.k8s.io/kwok/cmd/kwok ;;
    jobset) echo sigs.k8s.io/jobset ;;
    lws) echo sigs.k8s.io/lws/cmd ;;
    *) echo "unknown component: $1" >&2; return 2 ;;
  esac
}

# component_version <component>: the version pinned in the wrapper module's go.mod.
component_version() {
  local mod upstream v
  mod="$E2E_CLUSTER_DIR/modules/$(component_module "$1")/go.mod"
  upstream="$(component_upstream "$1")"
  v="$(awk -v m="$upstream" '($1 == m && $2 ~ /^v/) { print $2; exit } ($1 == "require" && $2 == m) { print $3; exit }' "$mod")"
  [[ -n "$v" ]] || { echo "no version of $upstream in $mod" >&2; return 1; }
  echo "$v"
}

# component_path <component>: where the binary lives (whether built or not).
# GPUSCHED_E2E_BIN_DIR, when set, overrides the cache for every component.
component_path() {
  if [[ -n "${GPUSCHED_E2E_BIN_DIR:-}" ]]; then
    echo "$GPUSCHED_E2E_BIN_DIR/$1"
  else
    echo "$E2E_CACHE/$1-$(component_version "$1")/$1"
  fi
}

# component_env_key <component>: its KEY in `paths` output.
component_env_key() {
  case "$1" in
    etcd) echo GPUSCHED_E2E_ETCD_BIN ;;
    kube-apiserver) echo GPUSCHED_E2E_KUBE_APISERVER_BIN ;;
    kube-scheduler) echo GPUSCHED_E2E_KUBE_SCHEDULER_BIN ;;
    kube-controller-manager) echo GPUSCHED_E2E_KUBE_CONTROLLER_MANAGER_BIN ;;
    kwok) echo GPUSCHED_E2E_KWOK_BIN ;;
    jobset) echo GPUSCHED_E2E_JOBSET_BIN ;;
    lws) echo GPUSCHED_E2E_LWS_BIN ;;
  esac
}

now_ms() { date +%s%3N; }
