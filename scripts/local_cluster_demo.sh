#!/usr/bin/env bash
# `ray up` / `ray submit` / `ray down` for real, on this machine: a one-node Ray cluster whose head
# the cluster launcher reaches over ssh at root@127.0.0.1 (scripts/cluster-local.yaml).
#
#   scripts/local_cluster_demo.sh          # caption side of the sample job (ray submit: 1-5 min)
#   scripts/local_cluster_demo.sh --run    # the whole sample job with stand-in models (longer)
#
# Run it as root from anywhere; it needs openssh-server and rsync (Debian/Ubuntu:
# apt-get install -y openssh-server rsync) and the project's venv (<repo>/.venv, or T2I_VENV).
# Steps, each printed with its commands and its time:
#   1. sshd: start it if nothing listens on 127.0.0.1:22 (containers have no systemd);
#      the key ~/.ssh/t2i_local_cluster, and the head's environment (below);
#   2. ray up -y scripts/cluster-local.yaml;
#   3. ray submit scripts/cluster-local.yaml pipelines/amplification.py -- captions ... (or run ...);
#   4. where the results landed, and the metrics.json the job wrote;
#   5. ray down -y scripts/cluster-local.yaml, from an EXIT trap, so also when a step fails.
#
# The "head" is this machine, but it gets a node of its own under $STATE (/tmp/t2i-local-cluster):
# the key's authorized_keys entry forces every ssh session of the key into $STATE/node-shell, which
# sets HOME=$STATE/home. So `~` on the head (file mounts, ~/ray_bootstrap_config.yaml, the copy of
# the script `ray submit` makes) is there, not in /root, and the head's ~/.bashrc, which the launcher
# sources before each command, gives the head its environment without touching root's dotfiles:
#   - the project's venv (`python` and `ray`; root's own login shell would find pyenv's python);
#   - PYTHONPATH=~/t2i-bias-audit, the copy of the repository that file_mounts made;
#   - RAY_TMPDIR=$STATE: this head's sessions, logs and ray_current_cluster (which the submitted
#     driver's ray.init reads to find the cluster) never mix with other Ray instances on the machine;
#   - RAY_AUTH_MODE=token with a token of the head's own in ~/.ray/auth_token;
#   - ~/bin/ray first on PATH: the venv's ray, except that `ray start` runs in a session of its own
#     and `ray stop` stops only that session's processes. A plain `ray stop` (in the head's start
#     commands, and hard-coded in `ray down`) kills every Ray process on the machine, test sessions
#     and other users' jobs included.
# On exit the key's authorized_keys entry is removed and sshd stopped if this script started it;
# the key, the results ($STATE/results) and the head's Ray logs ($STATE/ray/session_*) stay.
#
# Environment: T2I_VENV (default <repo>/.venv), T2I_LOCAL_CLUSTER_DIR (default /tmp/t2i-local-cluster),
# T2I_DEMO_OUTPUT (results directory on the head; default $STATE/results/<mode>-<time>),
# T2I_DEMO_MODE=captions|run (same as --run), T2I_DEMO_SCRIPT (the script to submit; default
# pipelines/amplification.py, e.g. a patched copy to try a change), T2I_KEEP_CLUSTER=1 (skip `ray down`; stop the head
# later with `RAY_TMPDIR=$STATE .venv/bin/ray down -y scripts/cluster-local.yaml` from the repo).
set -euo pipefail

MODE=${T2I_DEMO_MODE:-captions}
for arg in "$@"; do
  case "$arg" in
    --run) MODE=run ;;
    --captions) MODE=captions ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument: $arg (use --run or --captions)" >&2; exit 2 ;;
  esac
done
case "$MODE" in captions|run) ;; *) echo "T2I_DEMO_MODE must be captions or run" >&2; exit 2 ;; esac

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${T2I_VENV:-$REPO/.venv}
STATE=${T2I_LOCAL_CLUSTER_DIR:-/tmp/t2i-local-cluster}
NODE_HOME=$STATE/home
CONFIG=scripts/cluster-local.yaml
KEY=$HOME/.ssh/t2i_local_cluster        # = auth.ssh_private_key of $CONFIG
KEY_TAG=t2i-local-cluster               # marks the key's line in authorized_keys
OUTPUT=${T2I_DEMO_OUTPUT:-$STATE/results/$MODE-$(date +%Y%m%d-%H%M%S)}
RAY=$VENV/bin/ray                       # the launcher runs with the venv's ray
SCRIPT=${T2I_DEMO_SCRIPT:-pipelines/amplification.py}
SSH_OPTS=(-i "$KEY" -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no
          -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=10)

T0=$(date +%s)
step() { printf '\n==> [%ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
run() { printf '+ %s\n' "$*"; "$@"; }
timed() {  # timed LABEL CMD...: run CMD, print how long it took
  local label=$1 s rc=0 ms; shift
  s=$(date +%s%N)
  run "$@" || rc=$?
  ms=$(( ($(date +%s%N) - s) / 1000000 ))
  printf '    %s: %d.%d s (exit %s)\n' "$label" $((ms / 1000)) $((ms % 1000 / 100)) "$rc"
  return "$rc"
}
die() { echo "error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: $CONFIG logs in as root@127.0.0.1"
[ -x "$RAY" ] || die "no Ray in $VENV (python3.11 -m venv .venv && .venv/bin/pip install -e .; or set T2I_VENV)"
for tool in ssh ssh-keygen rsync; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install -y openssh-server openssh-client rsync)"
done
[ -x /usr/sbin/sshd ] || die "/usr/sbin/sshd is missing (apt-get install -y openssh-server)"
cd "$REPO"

# ------------------------------------------------------------------------------------ clean-up
STARTED_SSHD=""
CLUSTER_UP=""
cleanup() {
  local rc=$?
  set +e
  if [ -n "$CLUSTER_UP" ] && [ -z "${T2I_KEEP_CLUSTER:-}" ]; then
    step "5. ray down (exit trap; exit status so far: $rc)"
    local sid
    sid=$(cat "$STATE/head.sid" 2>/dev/null || true)
    timed "ray down" env RAY_TMPDIR="$STATE" "$RAY" down -y "$CONFIG"
    if [ -f "$STATE/head.sid" ]; then
      echo "    head session $(cat "$STATE/head.sid") is still recorded; stopping it directly"
      HOME=$NODE_HOME RAY_TMPDIR=$STATE PATH="$VENV/bin:$PATH" "$NODE_HOME/bin/ray" stop
    fi
    step "Ray processes of this head left (none expected)"
    local pid left=()
    while read -r pid; do  # processes started with this head's RAY_TMPDIR (ssh clients aside)...
      case "$(cat "/proc/$pid/comm" 2>/dev/null)" in ssh|bash|""|sleep|timeout) ;; *) left+=("$pid") ;; esac
    done < <(grep -lsz "^RAY_TMPDIR=$STATE\$" /proc/[0-9]*/environ | cut -d/ -f3)
    if [ -n "$sid" ]; then  # ...and the head's session (Ray workers overwrite their environ)
      while read -r pid; do left+=("$pid"); done < <(pgrep -s "$sid")
    fi
    if [ "${#left[@]}" -gt 0 ]; then
      ps -o pid,sid,etime,cmd -p "$(printf '%s\n' "${left[@]}" | sort -u | paste -sd,)" | cut -c1-160
      [ "$rc" != 0 ] || rc=1
    else
      echo "    none (head session ${sid:-?})"
    fi
  elif [ -n "$CLUSTER_UP" ]; then
    step "T2I_KEEP_CLUSTER is set: the head keeps running; stop it with: (cd $REPO && RAY_TMPDIR=$STATE $RAY down -y $CONFIG)"
    exit "$rc"
  fi
  step "clean-up: the key's authorized_keys entry${STARTED_SSHD:+, sshd (pid $STARTED_SSHD)}"
  if [ -f "$HOME/.ssh/authorized_keys" ]; then
    grep -v " $KEY_TAG\$" "$HOME/.ssh/authorized_keys" > "$HOME/.ssh/authorized_keys.t2i" || true
    cat "$HOME/.ssh/authorized_keys.t2i" > "$HOME/.ssh/authorized_keys"; rm -f "$HOME/.ssh/authorized_keys.t2i"
  fi
  if [ -n "$STARTED_SSHD" ]; then run kill "$STARTED_SSHD"; fi
  printf '\n==> done in %s s, exit status %s\n' "$(( $(date +%s) - T0 ))" "$rc"
  exit "$rc"
}
trap cleanup EXIT

# --------------------------------------------------------------------- 1. sshd, key, head node
step "1. sshd on 127.0.0.1:22"
if timeout 2 bash -c '</dev/tcp/127.0.0.1/22' 2>/dev/null; then
  echo "    something already listens on 127.0.0.1:22; using it"
else
  run mkdir -p /run/sshd && run chmod 0755 /run/sshd
  ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1 || run ssh-keygen -A
  run /usr/sbin/sshd -o PidFile=/run/sshd.t2i.pid
  for _ in $(seq 50); do [ -s /run/sshd.t2i.pid ] && break; sleep 0.1; done
  STARTED_SSHD=$(cat /run/sshd.t2i.pid)
  echo "    sshd started, pid $STARTED_SSHD"
fi

step "1. key $KEY and the head's node directory $STATE"
run mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
[ -f "$KEY" ] || run ssh-keygen -q -t ed25519 -N '' -C "$KEY_TAG" -f "$KEY"
run mkdir -p "$NODE_HOME/bin" && chmod 700 "$STATE"

cat > "$STATE/node-shell" <<EOF
#!/bin/bash
# Forced command of the $KEY_TAG key (scripts/local_cluster_demo.sh): every ssh session of the
# key (Ray's commands, rsync) runs as the head node, whose home is $NODE_HOME.
export HOME=$NODE_HOME
cd "\$HOME" || exit 1
if [ -n "\${SSH_ORIGINAL_COMMAND:-}" ]; then exec /bin/bash -c "\$SSH_ORIGINAL_COMMAND"; fi
exec /bin/bash --login
EOF
cat > "$NODE_HOME/.bashrc" <<EOF
# ~/.bashrc of the t2i local head (written by scripts/local_cluster_demo.sh). Ray's launcher
# sources it before every command it runs here. It must print nothing (rsync runs through it).
. "$VENV/bin/activate"
export PATH="\$HOME/bin:\$PATH"              # ~/bin/ray: \`ray stop\` stops only this head
export PYTHONPATH="\$HOME/t2i-bias-audit"    # the repository as file_mounts copied it
export RAY_TMPDIR=$STATE                     # this head's Ray sessions and ray_current_cluster
export RAY_AUTH_MODE=token                   # token authentication, with the token in ~/.ray/auth_token
EOF
cat > "$NODE_HOME/bin/ray" <<'EOF'
#!/bin/bash
# `ray` on the t2i local head (written by scripts/local_cluster_demo.sh): the venv's ray, except
#   ray start ...  runs in a session of its own, whose id goes to $RAY_TMPDIR/head.sid;
#   ray stop       stops only the processes of that session (SIGTERM, then SIGKILL after 15 s).
#                  A plain `ray stop` would stop every Ray process on the machine.
set -u
REAL=$(dirname "$(command -v python)")/ray
SIDFILE=$RAY_TMPDIR/head.sid
head_pids() {  # the processes of session $1, if it is the session of this head's Ray
  # (Ray names the session directory after the pid of `ray start`, the session leader)
  compgen -G "$RAY_TMPDIR/ray/session_*_$1" >/dev/null && pgrep -s "$1"
}
case "${1:-}" in
  start)
    setsid "$REAL" "$@" &   # a background job of a script is no group leader: its pid is the session id
    pid=$!
    echo "$pid" > "$SIDFILE"
    wait "$pid"
    ;;
  stop)
    if [ ! -f "$SIDFILE" ]; then echo "t2i local head: no Ray session recorded, nothing to stop"; exit 0; fi
    sid=$(cat "$SIDFILE")
    pids=$(head_pids "$sid")
    echo "t2i local head: stopping session $sid:" $(echo $pids | wc -w) "processes"
    [ -z "$pids" ] || kill -TERM $pids 2>/dev/null
    for _ in $(seq 30); do pids=$(head_pids "$sid"); [ -z "$pids" ] && break; sleep 0.5; done
    if [ -n "$pids" ]; then echo "t2i local head: SIGKILL to" $pids; kill -KILL $pids 2>/dev/null; sleep 1; fi
    rm -f "$SIDFILE" "$RAY_TMPDIR/ray/ray_current_cluster"
    echo "t2i local head: stopped"
    ;;
  *) exec "$REAL" "$@" ;;
esac
EOF
chmod 755 "$STATE/node-shell" "$NODE_HOME/bin/ray"
echo "    wrote $STATE/node-shell, $NODE_HOME/.bashrc, $NODE_HOME/bin/ray"

step "1. authorize the key for root@127.0.0.1 (forced command $STATE/node-shell)"
touch "$HOME/.ssh/authorized_keys" && chmod 600 "$HOME/.ssh/authorized_keys"
grep -v " $KEY_TAG\$" "$HOME/.ssh/authorized_keys" > "$HOME/.ssh/authorized_keys.t2i" || true
printf 'command="%s" %s\n' "$STATE/node-shell" "$(cat "$KEY.pub")" >> "$HOME/.ssh/authorized_keys.t2i"
cat "$HOME/.ssh/authorized_keys.t2i" > "$HOME/.ssh/authorized_keys"; rm -f "$HOME/.ssh/authorized_keys.t2i"
run ssh "${SSH_OPTS[@]}" root@127.0.0.1 'source ~/.bashrc; echo "    head: HOME=$HOME python=$(command -v python) ray=$(command -v ray) RAY_TMPDIR=$RAY_TMPDIR"'

step "1. Ray token authentication on the head: a token of its own in ~/.ray/auth_token"
[ -s "$NODE_HOME/.ray/auth_token" ] || HOME=$NODE_HOME run "$RAY" get-auth-token --generate >/dev/null
echo "    $NODE_HOME/.ray/auth_token"

# -------------------------------------------------------------------------------- 2. ray up
step "2. ray up"
export RAY_TMPDIR=$STATE   # the launcher's lock and state files (cluster-t2i-local.*) go here, not /tmp/ray
CLUSTER_UP=1
timed "ray up" "$RAY" up -y --disable-usage-stats "$CONFIG"
run "$RAY" exec "$CONFIG" 'ray status'

# ---------------------------------------------------------------------------- 3. ray submit
# `ray submit` copies only the script, to ~/amplification.py on the head: the project comes from
# the file mount (PYTHONPATH), and --captions names the bundled sample in it explicitly.
# shellcheck disable=SC2088  # the head's shell expands this ~ (the head's home), not this one
ARGS=(--captions '~/t2i-bias-audit/data/synthetic/laion_synthetic_sample.parquet' --output "$OUTPUT" --sample-size 10 --nn-k 10)
if [ "$MODE" = run ]; then
  ARGS=(run "${ARGS[@]}" --standin-models --images-per-prompt 2 --caption-images 1 --steps 5)
else
  ARGS=(captions "${ARGS[@]}")
fi
step "3. ray submit ($MODE)"
timed "ray submit" "$RAY" submit "$CONFIG" "$SCRIPT" -- "${ARGS[@]}"

# ------------------------------------------------------------------------------- 4. results
step "4. results under $OUTPUT"
run ls -la "$OUTPUT"
mapfile -t METRICS < <(find "$OUTPUT" -name metrics.json | sort)
[ "${#METRICS[@]}" -gt 0 ] || die "no metrics.json under $OUTPUT"
for m in "${METRICS[@]}"; do
  run ls -la "$(dirname "$m")"
  echo "    $m:"
  "$VENV/bin/python" - "$m" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
def short(v):
    s = json.dumps(v, default=str)
    return s if len(s) <= 160 else s[:157] + "..."
for k, v in m.items():
    print(f"      {k}: {short(v)}")
EOF
done
