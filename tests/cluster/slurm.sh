#!/usr/bin/env bash
# A real Slurm 22.05 test cluster on this one machine: private munge, a private MariaDB,
# slurmdbd, slurmctld and four slurmd nodes n1..n4, each in its own UTS namespace with its own
# loopback address. Used by the Slurm integration tests (tests/fixtures/slurm_cluster.py) and CI.
#
#   bash tests/cluster/slurm.sh start    # idempotent; installs the Debian packages if missing
#   eval "$(bash tests/cluster/slurm.sh env)"   # sbatch/squeue/sacct/submitit now use it
#   bash tests/cluster/slurm.sh status   # exit 0 when all four nodes answer
#   bash tests/cluster/slurm.sh stop     # cancels jobs, ends only the daemons it started (by PID)
#   bash tests/cluster/slurm.sh preempt-mode user-signal|sigterm   # how preemption signals jobs
#
# Everything lives under ${PODIUM_SLURM_DIR:-/tmp/podium-slurm}; the only system file touched is
# /etc/hosts (four lines tagged with $HOSTS_TAG, removed on stop). No systemd: each daemon runs in
# the foreground under setsid, and its PID (with its start time, against PID reuse) is recorded in
# $STATE/pids. Needs root (jobs run as root; /etc/hosts; munged runs as user munge).
#
# Layout (one cluster per machine: node names and ports are fixed)
#   port         what
#   16806        MariaDB, private instance for slurmdbd (bound to 127.0.0.1)
#   16817        slurmctld
#   16819        slurmdbd
#   16821-16824  slurmd of n1..n4 (node addresses 127.0.0.11-14)
#   srun uses ephemeral ports (32768+), clear of the 20000-29999 block the Ray/HTTP tests use.
#
#   $STATE/etc/   slurm.conf, slurmdbd.conf, plugstack.conf (rendered from tests/cluster/*.in)
#   $STATE/munge/ key/ (700), run/ (755, socket), log, seed
#   $STATE/mariadb/data/   the database (kept across stop/start; remove $STATE to start fresh)
#   $STATE/slurm/ ctld state, spool/<node>
#   $STATE/log/   one log per daemon (*.log from the daemon, *.out its stdout/stderr)
#   $STATE/pids/  <daemon>.pid = "PID STARTTIME COMM"
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${PODIUM_SLURM_DIR:-/tmp/podium-slurm}
CONF=$STATE/etc/slurm.conf
MUNGE_SOCKET=$STATE/munge/run/munge.socket
DB_SOCKET=$STATE/mariadb/run/mysqld.sock

DB_PORT=16806
CTLD_PORT=16817
DBD_PORT=16819
NODES=(n1 n2 n3 n4)
NODE_PORTS=(16821 16822 16823 16824)
NODE_ADDRS=(127.0.0.11 127.0.0.12 127.0.0.13 127.0.0.14)
# A test-only database password for the private MariaDB (bound to 127.0.0.1, own port).
DB_PASS=podium-test
HOSTS_TAG="# podium-slurm-test-cluster"
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
# Seconds to wait for each daemon to become ready (first start creates the database tables).
READY_TIMEOUT=${PODIUM_SLURM_READY_TIMEOUT:-90}

log() { printf 'slurm.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Client commands below must talk to this cluster, whatever the caller's environment says.
export SLURM_CONF=$CONF

now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------------
# PIDs: record, check, end. A record is "PID STARTTIME COMM"; a PID whose start time or command
# differs is someone else's process (PID reuse) and is never signalled.

proc_starttime() {
    # Field 22 of /proc/PID/stat; strip "PID (comm) " first since comm may hold spaces.
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    # After the strip, field 22 of the full line is field 20 here.
    awk '{print $20}' <<<"$stat"
}

proc_comm() { cat "/proc/$1/comm" 2>/dev/null; }

# A zombie has ended; it only waits for its parent (often PID 1, which may reap slowly) to reap it.
proc_ended() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [[ ${stat%% *} == [ZX] ]]
}

# record_pid NAME PID COMM: wait until PID has exec'd COMM (setsid/unshare/sh exec in place, so
# the PID that bash started becomes the daemon), then write the record.
record_pid() {
    local name=$1 pid=$2 comm=$3 deadline
    deadline=$(( $(now_ms) + 10000 ))
    while [[ "$(proc_comm "$pid")" != "$comm" ]]; do
        if proc_ended "$pid" || (( $(now_ms) > deadline )); then
            # Not recorded yet, so stop would miss it; it is our unreaped child, so the PID is ours.
            proc_ended "$pid" || kill -KILL "$pid" 2>/dev/null || true
            show_log "$name"
            die "$name (PID $pid) did not become '$comm'"
        fi
        sleep 0.05
    done
    printf '%s %s %s\n' "$pid" "$(proc_starttime "$pid")" "$comm" >"$STATE/pids/$name.pid"
}

# recorded_pid NAME: print the PID if the recorded daemon is still that same process.
recorded_pid() {
    local file=$STATE/pids/$1.pid pid start comm
    [[ -f $file ]] || return 1
    read -r pid start comm <"$file" || return 1
    proc_ended "$pid" && return 1
    [[ "$(proc_comm "$pid")" == "$comm" ]] || return 1
    [[ "$(proc_starttime "$pid")" == "$start" ]] || return 1
    printf '%s\n' "$pid"
}

# end_recorded NAME: TERM, wait up to 15 s, then KILL; only the recorded process.
end_recorded() {
    local name=$1 pid t0 killed=0
    if pid=$(recorded_pid "$name"); then
        t0=$(now_ms)
        kill -TERM "$pid" 2>/dev/null || true
        while recorded_pid "$name" >/dev/null; do
            if (( ! killed && $(now_ms) - t0 > 15000 )); then
                log "$name (PID $pid) ignored SIGTERM for 15 s; sending SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
                killed=1
            elif (( $(now_ms) - t0 > 25000 )); then
                # Stuck in the kernel (D state); keep the record so a later stop tries again.
                log "error: $name (PID $pid) survives SIGKILL; leaving it recorded"
                return 1
            fi
            sleep 0.1
        done
        log "stopped $name (PID $pid) in $(( $(now_ms) - t0 )) ms"
    fi
    rm -f "$STATE/pids/$name.pid"
}

all_daemons() { printf '%s\n' munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; }

# launch NAME COMM CMD...: start CMD in its own session, detached from our stdin/stdout (a caller
# capturing our output, such as pytest, must not wait for the daemon) and from the lock on fd 9.
launch() {
    local name=$1 comm=$2
    shift 2
    setsid "$@" </dev/null >>"$STATE/log/$name.out" 2>&1 9>&- &
    record_pid "$name" "$!" "$comm"
}

# ---------------------------------------------------------------------------------------------
# Waiting by condition.

# show_log NAME: the tail of the daemon's log, and of its stdout/stderr (where exec errors and
# early failures land; for slurm daemons it repeats the log, so only a few lines).
show_log() {
    local name=$1 f n
    for f in "$STATE/log/$name.log" "$STATE/log/$name.out"; do
        if [[ -s $f ]]; then
            n=25
            [[ $f == *.out ]] && n=8
            log "--- last lines of $f ---"
            tail -n "$n" "$f" >&2
        fi
    done
}

# wait_for WHAT LOGNAME CMD...: poll CMD every 0.2 s until it succeeds; on timeout show the log.
wait_for() {
    local what=$1 logname=$2 deadline
    shift 2
    deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    until "$@" >/dev/null 2>&1; do
        if ! recorded_pid "$logname" >/dev/null; then
            show_log "$logname"
            if grep -qs 'Unable to resolve "(null)"' "$STATE/log/$logname.log"; then
                # Slurm resolves its listen address with AI_ADDRCONFIG, which ignores loopback.
                log "hint: Slurm daemons need a non-loopback IPv4 address on this machine"
            fi
            die "$logname exited while waiting for $what"
        fi
        if (( $(now_ms) > deadline )); then
            show_log "$logname"
            die "timed out after ${READY_TIMEOUT}s waiting for $what"
        fi
        sleep 0.2
    done
}

munge_works() { munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET"; }
db_answers() { mariadb-admin --no-defaults --socket="$DB_SOCKET" --user=root --connect-timeout=2 ping; }
dbd_answers() { timeout 5 sacctmgr -n -P list cluster; }
# Captured, not piped into grep -q: under pipefail an early grep exit can fail the pipeline.
ctld_answers() { [[ $(timeout 5 scontrol ping) == *"is UP"* ]]; }

# node_states: "n1 idle" lines; a '*' suffix means the node does not respond.
node_states() { timeout 10 sinfo -h -N -p low -o '%N %T'; }

# nodes_ok [STATES-REGEX]: all four nodes listed, responding, in a state matching the regex.
nodes_ok() {
    local want=${1:-'^(idle|mixed|allocated|completing)$'} states count=0 node state
    states=$(node_states) || return 1
    while read -r node state; do
        [[ $state =~ $want ]] && count=$((count + 1))
    done <<<"$states"
    (( count == ${#NODES[@]} ))
}

nodes_idle() { nodes_ok '^idle$'; }

# ---------------------------------------------------------------------------------------------
# Setup pieces.

require_root() {
    [[ $(id -u) == 0 ]] || die "must run as root (jobs run as root; /etc/hosts; munged as user munge)"
}

# Machine facts slurmd needs that are easy to miss in a container or a bare VM.
preflight() {
    # slurmd 22.05 initialises its cgroup plugin even with proctrack/linuxproc and task/none,
    # and fails ("No filesystem mounted on /sys/fs/cgroup") without one.
    mountpoint -q /sys/fs/cgroup \
        || die "no cgroup filesystem mounted at /sys/fs/cgroup; slurmd 22.05 refuses to start without one"
}

# Install the Debian packages when missing. policy-rc.d stops their postinst from starting the
# system munge/MariaDB/slurm daemons (there is no systemd; they would linger on default ports).
ensure_packages() {
    local missing=() pkg status
    for pkg in "${PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || missing+=("$pkg")
    done
    (( ${#missing[@]} == 0 )) && return 0
    log "installing ${missing[*]}"
    local policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# slurm.sh: no service starts during package install\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        # Never leave it behind, even when apt-get fails or is interrupted.
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${PACKAGES[@]}"; then
        # A fresh machine may have no package lists yet.
        apt-get update && apt-get install -y --no-install-recommends "${PACKAGES[@]}" || rc=$?
    fi
    if [[ $(trap -p EXIT) == *policy-rc.d* ]]; then
        rm -f "$policy"
        trap - EXIT
    fi
    (( rc == 0 )) || die "apt-get install ${PACKAGES[*]} failed (exit $rc)"
}

check_state_path() {
    # The path is written into slurm.conf and sed replacements; keep it plain.
    [[ $STATE == /* && $STATE =~ ^[A-Za-z0-9_./-]+$ ]] \
        || die "PODIUM_SLURM_DIR must be an absolute path of [A-Za-z0-9_./-], got '$STATE'"
}

make_dirs() {
    # A clean start begins with no jobs: state left by a cluster whose daemons were killed (not
    # stopped) would bring its jobs back as running on nodes that have none, and those nodes stay
    # "allocated" until slurmctld gives up on them.
    rm -rf "$STATE/slurm"
    mkdir -p "$STATE"/{etc,log,pids,run,slurm/ctld,mariadb/run}
    local node
    for node in "${NODES[@]}"; do mkdir -p "$STATE/slurm/spool/$node"; done
    # munged runs as user munge and refuses a socket dir that is not 755 or a key dir not 700.
    chmod 755 "$STATE"
    mkdir -p "$STATE"/munge/{key,run,lib}
    chown -R munge:munge "$STATE/munge"
    chmod 700 "$STATE/munge/key"
    chmod 755 "$STATE/munge/run"
    chown -R mysql:mysql "$STATE/mariadb"
    # Daemons that drop root write their logs as their own user.
    touch "$STATE/log/munged.log" "$STATE/log/mariadbd.log"
    chown munge:munge "$STATE/log/munged.log"
    chown mysql:mysql "$STATE/log/mariadbd.log"
}

render() {
    local template=$1 out=$2 node_mb
    # Four nodes share the machine; advertise three quarters of its memory, split four ways.
    node_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 3 / 4 / 4)}' /proc/meminfo)
    sed -e "s|@STATE@|$STATE|g" \
        -e "s|@MUNGE_SOCKET@|$MUNGE_SOCKET|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" \
        -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@DB_PASS@|$DB_PASS|g" \
        -e "s|@N1_PORT@|${NODE_PORTS[0]}|g" \
        -e "s|@N2_PORT@|${NODE_PORTS[1]}|g" \
        -e "s|@N3_PORT@|${NODE_PORTS[2]}|g" \
        -e "s|@N4_PORT@|${NODE_PORTS[3]}|g" \
        -e "s|@REAL_MEMORY@|$node_mb|g" \
        "$template" >"$out.tmp"
    if grep -q '@[A-Z0-9_]*@' "$out.tmp"; then
        die "unfilled placeholder in $out.tmp: $(grep -o '@[A-Z0-9_]*@' "$out.tmp" | head -n 1)"
    fi
    mv "$out.tmp" "$out"
}

write_configs() {
    render "$HERE/slurm.conf.in" "$CONF"
    chmod 644 "$CONF"
    # slurmdbd refuses a config (it holds the DB password) readable by others.
    render "$HERE/slurmdbd.conf.in" "$STATE/etc/slurmdbd.conf"
    chmod 600 "$STATE/etc/slurmdbd.conf"
    # Empty on purpose: keeps the system /etc/slurm/plugstack.conf (SPANK plugins) out of jobs.
    : >"$STATE/etc/plugstack.conf"
}

hosts_add() {
    local i node addr
    for i in "${!NODES[@]}"; do
        node=${NODES[i]} addr=${NODE_ADDRS[i]}
        # Refuse to shadow a name that someone else put in /etc/hosts.
        if grep -vF "$HOSTS_TAG" /etc/hosts | grep -E "^[^#]*[[:space:]]$node([[:space:]]|$)" >/dev/null; then
            die "/etc/hosts already names '$node' (not our line); cannot emulate node $node"
        fi
        grep -qxF "$addr $node $HOSTS_TAG" /etc/hosts || printf '%s %s %s\n' "$addr" "$node" "$HOSTS_TAG" >>/etc/hosts
    done
}

hosts_remove() {
    grep -qF "$HOSTS_TAG" /etc/hosts || return 0
    local kept
    kept=$(grep -vF "$HOSTS_TAG" /etc/hosts || true)
    # Rewrite in place (not rename): /etc/hosts is often a bind mount in containers.
    printf '%s\n' "$kept" >/etc/hosts
}

# ---------------------------------------------------------------------------------------------
# The daemons, in dependency order.

start_munge() {
    if [[ ! -s $STATE/munge/key/munge.key ]]; then
        mungekey --create --keyfile="$STATE/munge/key/munge.key"
        chown munge:munge "$STATE/munge/key/munge.key"
        chmod 600 "$STATE/munge/key/munge.key"
    fi
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    # setpriv execs in place, so the recorded PID is munged's own.
    launch munged munged setpriv --reuid=munge --regid=munge --init-groups \
        munged --foreground --key-file="$STATE/munge/key/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE/munge/run/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/lib/munged.seed"
    wait_for "munged on $MUNGE_SOCKET" munged munge_works
}

start_mariadb() {
    local data=$STATE/mariadb/data
    if [[ ! -d $data/mysql ]]; then
        log "initialising MariaDB in $data"
        rm -rf "$data"
        mariadb-install-db --no-defaults --user=mysql --datadir="$data" --skip-test-db \
            --auth-root-authentication-method=socket >"$STATE/log/mariadbd-install.log" 2>&1 \
            || { tail -n 25 "$STATE/log/mariadbd-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    # --no-defaults: nothing from /etc/mysql (the system instance's port, socket, datadir).
    # Durability is traded for speed: this database only lives as long as the test cluster.
    launch mariadbd mariadbd mariadbd --no-defaults --user=mysql --datadir="$data" \
        --socket="$DB_SOCKET" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$STATE/mariadb/run/mariadbd.pid" --log-error="$STATE/log/mariadbd.log" \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=64M \
        --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-lock-wait-timeout=900
    wait_for "MariaDB on $DB_SOCKET" mariadbd db_answers
    # Accounting starts empty too: job ids restart at 1 with the cleared slurmctld state, and an
    # old record under a reused id would count as an extra run of a new job (sacct --duplicates).
    mariadb --no-defaults --socket="$DB_SOCKET" --user=root <<SQL
DROP DATABASE IF EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
}

start_slurmdbd() {
    # slurmdbd reads slurmdbd.conf from the directory of $SLURM_CONF.
    launch slurmdbd slurmdbd slurmdbd -D
    # slurmctld exits on a first start ("no TRES") if slurmdbd does not answer yet.
    wait_for "slurmdbd (sacctmgr list cluster)" slurmdbd dbd_answers
}

start_slurmctld() {
    launch slurmctld slurmctld slurmctld -D -f "$CONF"
    wait_for "slurmctld (scontrol ping)" slurmctld ctld_answers
}

start_nodes() {
    local node
    for node in "${NODES[@]}"; do
        # unshare and sh exec in place: the PID is slurmd's; its hostname is the node's name.
        # shellcheck disable=SC2016  # $1/$2 are expanded by the inner sh, not here
        launch "slurmd-$node" slurmd unshare --uts \
            sh -c 'hostname "$1" && exec slurmd -D -f "$2" -N "$1"' sh "$node" "$CONF"
    done
    if ! wait_for_nodes; then
        for node in "${NODES[@]}"; do show_log "slurmd-$node"; done
        show_log slurmctld
        die "nodes did not all become idle within ${READY_TIMEOUT}s: $(node_states 2>&1 | tr '\n' ' ')"
    fi
}

wait_for_nodes() {
    local deadline node
    deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    until nodes_idle 2>/dev/null; do
        (( $(now_ms) > deadline )) && return 1
        for node in "${NODES[@]}"; do
            recorded_pid "slurmd-$node" >/dev/null || { show_log "slurmd-$node"; die "slurmd of $node exited"; }
        done
        sleep 0.2
    done
}

# ---------------------------------------------------------------------------------------------
# Commands.

all_recorded_alive() {
    local d
    while read -r d; do recorded_pid "$d" >/dev/null || return 1; done < <(all_daemons)
}

any_recorded_alive() {
    local d
    while read -r d; do recorded_pid "$d" >/dev/null && return 0; done < <(all_daemons)
    return 1
}

lock_state() {
    mkdir -p "$STATE"
    exec 9>"$STATE/.lock"
    flock -w 300 9 || die "another slurm.sh holds $STATE/.lock"
}

cmd_start() {
    local t0
    t0=$(now_ms)
    require_root
    check_state_path
    lock_state
    if all_recorded_alive && nodes_ok; then
        log "already running ($STATE); $(( $(now_ms) - t0 )) ms"
        return 0
    fi
    ensure_packages
    preflight
    if any_recorded_alive; then
        log "partly running; stopping what is left before a clean start"
        stop_all
    fi
    # From here on, a failure stops whatever this start brought up (logs stay in $STATE/log).
    trap 'rc=$?; if (( rc != 0 )); then log "start failed; stopping what it started (logs: $STATE/log)"; stop_all; fi' EXIT
    make_dirs
    write_configs
    hosts_add
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld
    start_nodes
    trap - EXIT
    log "cluster up: 4 nodes idle, SLURM_CONF=$CONF; $(( $(now_ms) - t0 )) ms"
}

# Cancel every job of this (private) cluster so no job process outlives it, then end the daemons.
cancel_jobs() {
    recorded_pid slurmctld >/dev/null || return 0
    local jobs deadline
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null) || return 0
    [[ -n $jobs ]] || return 0
    log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
    # shellcheck disable=SC2086  # one job id per word
    timeout 10 scancel $jobs || true
    # KillWait=5: steps get SIGTERM, then SIGKILL 5 s later; squeue lists a job until it is gone.
    deadline=$(( $(now_ms) + 30000 ))
    while [[ -n $(timeout 10 squeue -h -o %A 2>/dev/null || true) ]]; do
        if (( $(now_ms) > deadline )); then
            log "warning: jobs still ending after 30 s: $(timeout 10 squeue -h -o '%A %T' | tr '\n' ' ')"
            break
        fi
        sleep 0.2
    done
}

# stop_all: fails (after trying every daemon) if one of them could not be ended.
stop_all() {
    local name failed=0
    cancel_jobs
    for name in "${NODES[@]/#/slurmd-}" slurmctld slurmdbd mariadbd munged; do
        end_recorded "$name" || failed=1
    done
    hosts_remove
    return "$failed"
}

cmd_stop() {
    require_root
    if [[ ! -d $STATE ]]; then
        hosts_remove
        log "nothing to stop ($STATE absent)"
        return 0
    fi
    lock_state
    stop_all
    log "stopped"
}

cmd_status() {
    if [[ ! -f $CONF ]]; then
        log "not started ($CONF absent)"
        return 1
    fi
    local states
    # Without a live slurmctld of ours, sinfo would spend ~10 s retrying before it says so.
    if ! recorded_pid slurmctld >/dev/null; then
        log "not running (no slurmctld recorded in $STATE/pids)"
        return 1
    fi
    if ! states=$(node_states 2>&1); then
        log "cluster does not answer: $states"
        return 1
    fi
    printf '%s\n' "$states"
    nodes_ok || { log "not all of ${NODES[*]} are up and responding"; return 1; }
}

cmd_env() {
    # SLURM_CONF is all a client needs: munge's socket and every address are in slurm.conf.
    # Jobs see it too (sbatch exports the caller's environment, and slurmd sets SLURM_CONF to its
    # own config even under --export=NONE), so sbatch inside a job reaches this cluster.
    printf 'export SLURM_CONF=%q\n' "$CONF"
    printf 'export PODIUM_SLURM_DIR=%q\n' "$STATE"
}

cmd_preempt_mode() {
    # Preemption sends the job's --signal (user-signal: SlurmctldParameters=preempt_send_user_signal,
    # the default of this cluster) or Slurm's own SIGTERM, then SIGKILL after GraceTime (sigterm:
    # Slurm's default). A cluster-wide setting: rewritten in slurm.conf and applied with
    # `scontrol reconfigure`; `start` always renders user-signal again.
    local mode=$1 line
    case $mode in
        user-signal) line="SlurmctldParameters=preempt_send_user_signal" ;;
        sigterm) line="#SlurmctldParameters=preempt_send_user_signal" ;;
        *) die "preempt-mode takes user-signal or sigterm, got '$mode'" ;;
    esac
    [[ -f $CONF ]] || die "no cluster configured at $CONF (start it first)"
    sed -i -E "s|^#?SlurmctldParameters=preempt_send_user_signal\$|$line|" "$CONF"
    grep -qxF "$line" "$CONF" || die "could not set '$line' in $CONF"
    SLURM_CONF=$CONF scontrol reconfigure
    local now
    now=$(SLURM_CONF=$CONF scontrol show config | awk -F'= *' '/^SlurmctldParameters/ {print $2}')
    log "preemption mode $mode (SlurmctldParameters = $now)"
}

usage() {
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

main() {
    (( $# >= 1 )) || usage
    case $1 in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        env) cmd_env ;;
        preempt-mode) (( $# == 2 )) || usage; cmd_preempt_mode "$2" ;;
        *) usage ;;
    esac
}

main "$@"
