# Shared helpers for e2e/cluster scripts (sourced, not executed).
# shellcheck shell=bash

E2E_CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_REPO_ROOT="$(cd "$E2E_CLUSTER_DIR/../.." && pwd)"
# Binaries are cached outside the clone, keyed by component and version, so
# any clone on the same machine reuses them.
E2E_CACHE="${GPUSCHED_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched-e2e}"

# All components, in build order. kube-controller-manager, jobset, lws,
# kuberay, mpi-operator, training-operator and trainer are for the workload e2e tests
# (crates/k8s/tests/workloads_e2e.rs, operators_e2e.rs), which start them; `cluster up` does not. kubelet and fakecri are for the
# real-kubelet suite (crates/node-agent/tests/kubelet_e2e.rs, started by
# e2e/cluster/kubelet); fakecri is our own program (fakecri/), versioned by
# a hash of its sources. autoscaler-apis is config only (no binary): the
# ProvisioningRequest CRD for crates/k8s/tests/provreq_e2e.rs (cluster-autoscaler
# itself cannot be built here: the module proxy answers 403 for every
# k8s.io/autoscaler/cluster-autoscaler version).
E2E_COMPONENTS=(etcd kube-apiserver kwok kube-scheduler autoscaler-apis kube-controller-manager jobset lws kuberay mpi-operator training-operator trainer kubelet fakecri)

# component_config_only <component>: nothing is built; `build` copies the
# module's config/ into the cache and `component_path` names that folder.
component_config_only() {
  [[ "$1" == autoscaler-apis ]]
}

# component_module <component>: the wrapper module directory name.
component_module() {
  case "$1" in
    etcd) echo etcd ;;
    kube-apiserver|kube-scheduler|kube-controller-manager|kubelet) echo kubernetes ;;
    kwok) echo kwok ;;
    jobset) echo jobset ;;
    lws) echo lws ;;
    kuberay|mpi-operator|training-operator|trainer|autoscaler-apis) echo "$1" ;;
    fakecri) echo ../fakecri ;;
    *) echo "unknown component: $1" >&2; return 2 ;;
  esac
}

# component_upstream <component>: the upstream module whose version keys the cache.
component_upstream() {
  case "$1" in
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    kube-apiserver|kube-scheduler|kube-controller-manager|kubelet) echo k8s.io/kubernetes ;;
    kwok) echo sigs.k8s.io/kwok ;;
    jobset) echo sigs.k8s.io/jobset ;;
    lws) echo sigs.k8s.io/lws ;;
    kuberay) echo github.com/ray-project/kuberay/ray-operator ;;
    mpi-operator) echo github.com/kubeflow/mpi-operator ;;
    training-operator) echo github.com/kubeflow/training-operator ;;
    trainer) echo github.com/kubeflow/trainer/v2 ;;
    autoscaler-apis) echo k8s.io/autoscaler/cluster-autoscaler/apis ;;
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
    kubelet) echo k8s.io/kubernetes/cmd/kubelet ;;
    kwok) echo sigs.k8s.io/kwok/cmd/kwok ;;
    jobset) echo sigs.k8s.io/jobset ;;
    lws) echo sigs.k8s.io/lws/cmd ;;
    kuberay) echo github.com/ray-project/kuberay/ray-operator ;;
    mpi-operator) echo github.com/kubeflow/mpi-operator/cmd/mpi-operator ;;
    training-operator) echo github.com/kubeflow/training-operator/cmd/training-operator.v1 ;;
    trainer) echo github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager ;;
    fakecri) echo . ;;
    *) echo "unknown component: $1" >&2; return 2 ;;
  esac
}

# component_version <component>: the version pinned in the wrapper module's go.mod.
component_version() {
  local mod upstream v
  if [[ "$1" == fakecri ]]; then
    # Our own source: the version is a hash of what the binary is built from.
    v="$(cd "$E2E_CLUSTER_DIR/fakecri" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-12)"
    echo "src-$v"
    return 0
  fi
  mod="$E2E_CLUSTER_DIR/modules/$(component_module "$1")/go.mod"
  upstream="$(component_upstream "$1")"
  v="$(awk -v m="$upstream" '($1 == m && $2 ~ /^v/) { print $2; exit } ($1 == "require" && $2 == m) { print $3; exit }' "$mod")"
  [[ -n "$v" ]] || { echo "no version of $upstream in $mod" >&2; return 1; }
  echo "$v"
}

# component_path <component>: where the binary lives (whether built or not);
# for a config-only component, its config/ folder in the cache.
# GPUSCHED_E2E_BIN_DIR, when set, overrides the cache for every binary.
component_path() {
  if component_config_only "$1"; then
    echo "$E2E_CACHE/$1-$(component_version "$1")/config"
  elif [[ -n "${GPUSCHED_E2E_BIN_DIR:-}" ]]; then
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
    kuberay) echo GPUSCHED_E2E_KUBERAY_BIN ;;
    mpi-operator) echo GPUSCHED_E2E_MPI_OPERATOR_BIN ;;
    training-operator) echo GPUSCHED_E2E_TRAINING_OPERATOR_BIN ;;
    trainer) echo GPUSCHED_E2E_TRAINER_BIN ;;
    kubelet) echo GPUSCHED_E2E_KUBELET_BIN ;;
    fakecri) echo GPUSCHED_E2E_FAKECRI_BIN ;;
    autoscaler-apis) echo GPUSCHED_E2E_AUTOSCALER_APIS_CONFIG ;;
  esac
}

now_ms() { date +%s%3N; }

# Process helpers shared by `cluster` and `kubelet`. The sourcing script
# defines log, die, cmd_down DIR, STOP_TIMEOUT and UP_TIMEOUT.

# proc_state PID: the one-letter state of PID (R, S, D, Z, ...); fails if gone.
proc_state() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$stat" ]] || return 1
  stat="${stat##*) }" # the command name in parentheses may hold spaces
  echo "${stat%% *}"
}

# alive PID: PID exists and is not a zombie (exited, not yet reaped).
alive() {
  local state
  state="$(proc_state "$1")" || return 1
  [[ "$state" != Z && "$state" != X ]]
}

# is_ours DIR NAME: the pid in DIR/NAME.pid is alive (not a zombie) and runs
# NAME.  An empty command line counts as ours: the kernel shows one while an
# exec is under way (between replacing the image and laying out the new
# argv), which on a loaded machine lasted long enough for a probe to take
# kube-apiserver, in state D, for exited.  The pid comes from our own pid
# file, so a stranger could only be there after ours exited and the pid was
# reused, and that stranger would have a command line.
is_ours() {
  local pidfile="$1/$2.pid" pid cmd
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  alive "$pid" || return 1
  # no pipe into grep -q here: under pipefail an early grep exit can fail the
  # pipeline with SIGPIPE in tr
  cmd="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
  [[ -z "$cmd" || "$cmd" == *"$2"* ]]
}

proc_line() { # proc_line DIR NAME: what the pid file's process is now, for an error
  local pid
  pid="$(cat "$1/$2.pid" 2>/dev/null)" || { echo "no pid file"; return; }
  if [[ -r "/proc/$pid/cmdline" ]]; then
    echo "pid $pid is state $(proc_state "$pid" || echo '?'): $(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-120)"
  else
    echo "pid $pid is gone"
  fi
}

stop_one() { # stop_one DIR NAME
  local dir="$1" name="$2" pid deadline t0
  if ! is_ours "$dir" "$name"; then
    rm -f "$dir/$name.pid"
    return 0
  fi
  pid="$(cat "$dir/$name.pid")"
  t0=$(now_ms)
  # STOP_TIMEOUT 0: no graceful stop (a test's throwaway cluster), SIGKILL.
  [[ "$STOP_TIMEOUT" == 0 ]] || kill -TERM "$pid" 2>/dev/null || true
  deadline=$(( $(date +%s) + STOP_TIMEOUT ))
  while kill -0 "$pid" 2>/dev/null && [[ $(date +%s) -lt $deadline ]]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    [[ "$STOP_TIMEOUT" == 0 ]] || log "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$(( $(date +%s) + 5 ))
    while kill -0 "$pid" 2>/dev/null && [[ $(date +%s) -lt $deadline ]]; do sleep 0.1; done
  fi
  rm -f "$dir/$name.pid"
  log "stopped $name (pid $pid) in $(( $(now_ms) - t0 )) ms"
}

# port_in_use PORT: something listens on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

TAKEN=" "
# free_port VAR: sets VAR to a random free port in 20000-32767 (below Linux's
# ephemeral range, so no outgoing connection holds it) not handed out before.
free_port() {
  local p i
  for (( i=0; i<500; i++ )); do
    p=$(( 20000 + RANDOM % 12768 ))
    [[ "$TAKEN" == *" $p "* ]] && continue
    port_in_use "$p" && continue
    TAKEN+="$p "
    printf -v "$1" '%s' "$p"; return 0
  done
  die "no free port found"
}

fail_up() { # fail_up DIR NAME MESSAGE
  log "$3"
  if [[ -f "$1/$2.log" ]]; then
    log "---- last 40 lines of $1/$2.log ----"
    tail -n 40 "$1/$2.log" >&2 || true
    log "----"
  fi
  cmd_down "$1"
  exit 1
}

start() { # start DIR NAME BINARY ARGS...: background, own session, logs to DIR/NAME.log
  local dir="$1" name="$2"; shift 2
  [[ -x "$1" ]] || die "$name binary $1 not found; run e2e/cluster/build"
  local runner=()
  command -v setsid >/dev/null && runner=(setsid)
  "${runner[@]}" "$@" </dev/null >"$dir/$name.log" 2>&1 9>&- &
  local pid=$! i
  echo "$pid" >"$dir/$name.pid"
  # until the forked shell has exec'd the binary, /proc/PID/cmdline is this
  # script's; through setsid it is then setsid's, which names the binary too
  # but is one exec short.  Wait (up to 30 s: on a loaded 2-core machine one
  # exec took over 2 s) until argv[0] is the binary itself or the process is
  # gone; is_ours also tolerates the empty command line of an exec under way.
  # START_ARGV0: the binary the process ends up as, when "$1" is a
  # launcher that execs it (unshare).
  local bin="${START_ARGV0:-$1}" argv0
  for ((i = 0; i < 3000; i++)); do
    alive "$pid" || break
    argv0="$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | head -n 1)" || true
    [[ "$argv0" == "$bin" ]] && break
    sleep 0.01
  done
  log "started $name (pid $pid)"
}

# wait_for DIR NAME DESCRIPTION COMMAND...: retry COMMAND until it succeeds,
# the process dies, or UP_TIMEOUT passes.
wait_for() {
  local dir="$1" name="$2" what="$3"; shift 3
  local start_s deadline
  start_s=$(now_ms)
  deadline=$(( $(date +%s) + UP_TIMEOUT ))
  while ! "$@" >/dev/null 2>&1; do
    is_ours "$dir" "$name" || fail_up "$dir" "$name" "$name exited before $what ($(proc_line "$dir" "$name"))"
    [[ $(date +%s) -lt $deadline ]] || fail_up "$dir" "$name" "$name: no $what within ${UP_TIMEOUT}s"
    sleep 0.25
  done
  log "$name: $what after $(( $(now_ms) - start_s )) ms"
}

