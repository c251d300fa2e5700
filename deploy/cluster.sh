#!/usr/bin/env bash
# A Dask cluster on this machine from the dpsub image (podman, run as root), and dpsub
# commands run against it from the same image. deploy/README.md, "A cluster on one
# machine", walks through it; tests/deploy/test_deploy_containers.py runs those commands.
#
#   deploy/cluster.sh up --data DIR --out DIR --state DIR --jobs DIR [--workers 2]
#                        [--threads 1] [--memory-limit 2GiB] [--env-file FILE]
#   deploy/cluster.sh submit DPSUB-ARGS...   # dpsub in a container; estimate, cluster, run
#                                            # and stream append get --scheduler <this cluster>
#   deploy/cluster.sh status                 # address, dashboard, folders, containers
#   deploy/cluster.sh address                # tcp://127.0.0.1:PORT
#   deploy/cluster.sh kill-worker I          # podman kill worker I (1..N), e.g. mid-run
#   deploy/cluster.sh down                   # removes every container of the cluster
#
# Every container uses the host network and listens on 127.0.0.1 only (Dask's comms are
# unauthenticated); ports are picked free at `up`. The host folders are mounted where
# pipelines/events-basis.yaml and docs/running-daily.md expect them, so job files and
# commands name container paths: --data at /data (read-only in the workers, read-write in
# dpsub's container, e.g. for `dpsub synth`), --out at /results and --state at /state
# (outputs, a SQLite ledger and the operator's diagnostics files in /state/diagnostics;
# dpsub's container only), --jobs at /etc/dpsub (read-only, dpsub's container). The image runs as uid 1000: `up` creates missing folders and hands
# --out, --state (and a --data it created) to uid 1000:1000.
# --env-file FILE (podman's format, NAME=value lines) sets variables in the workers and in
# dpsub's containers, e.g. object-storage credentials (AWS_ACCESS_KEY_ID=…): they stay out
# of command lines and labels (`podman inspect` of a container still shows them).
# Environment: DPSUB_CLUSTER (name, default dpsub; several clusters can run side by side),
# IMAGE (for `up`, default localhost/dpsub:<version of pyproject.toml>; `submit` runs the
# image the cluster runs), PODMAN_RUNTIME (default runc).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -1)
IMAGE=${IMAGE:-localhost/dpsub:$VERSION}
NAME=${DPSUB_CLUSTER:-dpsub}
PODMAN=(podman --runtime "${PODMAN_RUNTIME:-runc}")
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
LABEL=dpsub.cluster=$NAME
SCHEDULER=$NAME-scheduler
USER_ID=1000:1000

die() {
  echo "deploy/cluster.sh: error: $*" >&2
  exit 2
}

label() {  # label NAME: a label of the scheduler container (the cluster's record)
  "${PODMAN[@]}" container inspect --format "{{index .Config.Labels \"dpsub.$1\"}}" "$SCHEDULER"
}

running() {
  local state
  state=$("${PODMAN[@]}" container inspect --format '{{.State.Running}}' "$SCHEDULER" 2>/dev/null) ||
    return 1
  [[ $state == true ]]
}

require_cluster() {
  running || die "no cluster '$NAME' is running: start it with deploy/cluster.sh up"
}

TAKEN=()  # ports handed out by this `up` (free_port runs in a subshell: callers add them)
free_port() {  # a port nothing listens on at 127.0.0.1 and not in TAKEN
  local port
  for _ in $(seq 200); do
    port=$((20000 + RANDOM % 30000))
    [[ " ${TAKEN[*]} " == *" $port "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  die "no free port found on 127.0.0.1"
}

absolute() { # absolute DIR: the folder's absolute path (created when missing)
  mkdir -p "$1"
  (cd "$1" && pwd -P)
}

up() {
  local workers=2 threads=1 memory=2GiB data="" out="" state="" jobs="" env_file=""
  while (($#)); do
    (($# >= 2)) || die "$1 needs a value"
    case $1 in
      --workers) workers=$2 ;;
      --threads) threads=$2 ;;
      --memory-limit) memory=$2 ;;
      --data) data=$2 ;;
      --out) out=$2 ;;
      --state) state=$2 ;;
      --jobs) jobs=$2 ;;
      --env-file) env_file=$2 ;;
      *) die "unknown option $1 for up (see the top of deploy/cluster.sh)" ;;
    esac
    shift 2
  done
  [[ $workers =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer (got $workers)"
  for option in data out state jobs; do
    [[ -n ${!option} ]] || die "up needs --$option DIR"
  done
  [[ $EUID -eq 0 ]] || die "run as root (the image and its containers are root's podman's)"
  "${PODMAN[@]}" image exists "$IMAGE" || die "no image $IMAGE: build it with deploy/build-image.sh"
  running && die "cluster '$NAME' is already running: deploy/cluster.sh down first"
  local env=()
  if [[ -n $env_file ]]; then
    [[ -f $env_file ]] || die "--env-file $env_file: no such file"
    env_file=$(cd "$(dirname "$env_file")" && pwd -P)/$(basename "$env_file")
    env=(--env-file "$env_file")
  fi
  [[ -d $data ]] || { absolute "$data" >/dev/null && chown "$USER_ID" "$data"; }
  data=$(absolute "$data") out=$(absolute "$out") state=$(absolute "$state")
  jobs=$(absolute "$jobs")
  chown "$USER_ID" "$out" "$state"
  down >/dev/null  # leftovers of a cluster of this name that stopped on its own

  local port dashboard address
  port=$(free_port) dashboard=$(free_port)
  TAKEN+=("$port" "$dashboard")
  address=tcp://127.0.0.1:$port
  local common=(run -d "${LIMITS[@]}" --network host --label "$LABEL" --entrypoint dask)
  "${PODMAN[@]}" "${common[@]}" --name "$SCHEDULER" --env "DPSUB_HEALTH_PORT=$dashboard" \
    --label "dpsub.address=$address" --label "dpsub.dashboard=http://127.0.0.1:$dashboard/status" \
    --label "dpsub.data=$data" --label "dpsub.out=$out" --label "dpsub.state=$state" \
    --label "dpsub.jobs=$jobs" --label "dpsub.workers=$workers" --label "dpsub.env-file=$env_file" \
    --label "dpsub.image=$IMAGE" \
    "$IMAGE" scheduler --host 127.0.0.1 --port "$port" \
    --dashboard-address "127.0.0.1:$dashboard" >/dev/null
  local i worker_dashboard
  for i in $(seq "$workers"); do
    worker_dashboard=$(free_port)
    TAKEN+=("$worker_dashboard")
    "${PODMAN[@]}" "${common[@]}" --name "$NAME-w$i" --env "DPSUB_HEALTH_PORT=$worker_dashboard" \
      "${env[@]}" --volume "$data:/data:ro" \
      "$IMAGE" worker "$address" --name "w$i" --host 127.0.0.1 --nthreads "$threads" \
      --memory-limit "$memory" --dashboard-address "127.0.0.1:$worker_dashboard" >/dev/null
  done
  # Ready when every worker has joined (the scheduler's own Python waits for them).
  if ! "${PODMAN[@]}" exec "$SCHEDULER" python -c "
from distributed import Client
with Client('$address', timeout='120s') as client:
    client.wait_for_workers($workers, timeout=180)" >/dev/null 2>&1; then
    "${PODMAN[@]}" logs --tail 20 "$SCHEDULER" >&2 || true
    die "the workers did not join the scheduler within 3 minutes (logs above); deploy/cluster.sh down"
  fi
  status
}

submit() {
  (($#)) || die "submit needs dpsub's arguments, e.g. submit run JOB.yaml --run-id ID"
  require_cluster
  local args=("$@")
  case "$1 ${2:-}" in
    estimate\ * | cluster\ * | run\ * | "stream append")
      [[ " $* " == *" --scheduler"* ]] || args+=(--scheduler "$(label address)") ;;
  esac
  local data out state jobs env_file env=()
  data=$(label data) out=$(label out) state=$(label state) jobs=$(label jobs)
  env_file=$(label env-file)
  [[ -z $env_file ]] || env=(--env-file "$env_file")
  exec "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network host --no-healthcheck \
    --env DPSUB_DIAGNOSTICS_DIR=/state/diagnostics "${env[@]}" \
    --label "$LABEL" --name "$NAME-run-$(date +%s)-$$" \
    --volume "$data:/data" --volume "$out:/results" --volume "$state:/state" \
    --volume "$jobs:/etc/dpsub:ro" "$(label image)" "${args[@]}"
}

status() {
  require_cluster
  echo "cluster $NAME: scheduler $(label address), dashboard $(label dashboard)"
  echo "folders: $(label data) at /data, $(label out) at /results, $(label state) at /state," \
    "$(label jobs) at /etc/dpsub"
  "${PODMAN[@]}" ps --filter "label=$LABEL" --format '{{.Names}}  {{.Status}}'
}

kill_worker() {
  [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || die "kill-worker needs a worker number (1, 2, ...)"
  require_cluster
  "${PODMAN[@]}" kill "$NAME-w$1" >/dev/null
  echo "killed worker w$1 ($NAME-w$1)"
}

down() {
  local ids
  ids=$("${PODMAN[@]}" ps -aq --filter "label=$LABEL")
  if [[ -n $ids ]]; then
    # shellcheck disable=SC2086  # one id per word
    "${PODMAN[@]}" rm -f -t 5 $ids >/dev/null
  fi
  echo "cluster $NAME: no containers left"
}

command=${1:-}
shift || true
case $command in
  up) up "$@" ;;
  submit) submit "$@" ;;
  status) status ;;
  address) require_cluster && label address ;;
  kill-worker) kill_worker "$@" ;;
  down) down ;;
  *) die "usage: deploy/cluster.sh up|submit|status|address|kill-worker|down (see its top)" ;;
esac
