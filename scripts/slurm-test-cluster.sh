#!/usr/bin/env bash
# A single-host Slurm for Arbiter's backend tests: NODES fake nodes x 8 fake H100 on this host.
#
#   scripts/slurm-test-cluster.sh [start]   # idempotent: starts what is not running, applies a
#                                           # changed config, waits for idle
#   scripts/slurm-test-cluster.sh stop      # stops the Slurm daemons (and munged if we started it)
#   scripts/slurm-test-cluster.sh env       # prints `export SLURM_CONF=...` for a shell
#
# Needs the Debian packages slurm-wlm and munge already installed, and root (slurmd runs jobs as
# their submitter, and the fake GPUs are character devices made with mknod). Everything lives
# under $SLURM_TEST_DIR (default /tmp/slurmtest); nothing under /etc is changed.
set -euo pipefail

DIR=${SLURM_TEST_DIR:-/tmp/slurmtest}
NODES=${SLURM_TEST_NODES:-2}
CONF=$DIR/etc/slurm.conf
HOST=$(hostname -s)
export SLURM_CONF=$CONF

log() { echo "slurm-test-cluster: $*" >&2; }

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
    mkdir -p "$DIR"/{etc,state,log,dev}
    for i in $(seq 1 "$NODES"); do mkdir -p "$DIR/spool/node$i"; done
    for g in 0 1 2 3 4 5 6 7; do
        [[ -c $DIR/dev/nvidia$g ]] || { rm -f "$DIR/dev/nvidia$g"; mknod "$DIR/dev/nvidia$g" c 195 "$g"; }
    done
    local tmp=$CONF.tmp
    cat >"$tmp" <<CONF
ClusterName=arbitertest
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
DefMemPerCPU=1000
ReturnToService=2
MpiDefault=none
KillWait=30
MinJobAge=300
# A node whose slurmd is lost goes down within about half a minute instead of the default 300 s,
# so the lost-slurmd test is short; a slurmd that answers never comes near it.
SlurmdTimeout=10
SlurmdParameters=config_overrides
NodeName=node[1-$NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=8 RealMemory=16000 Gres=gpu:h100:8 State=UNKNOWN
PartitionName=gpu Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    cat >"$DIR/etc/gres.conf" <<GRES
AutoDetect=off
NodeName=node[1-$NODES] Name=gpu Type=h100 File=$DIR/dev/nvidia[0-7]
GRES
    # A daemon already running reads a changed config only when told to.
    if [[ -f $CONF ]] && ! cmp -s "$tmp" "$CONF" && alive "$DIR/slurmctld.pid"; then
        mv "$tmp" "$CONF"
        scontrol reconfigure || log "scontrol reconfigure failed"
    else
        mv "$tmp" "$CONF"
    fi
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    [[ -f /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- munged
    touch "$DIR/munged.ours"
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    log "munged did not come up"; exit 1
}

start() {
    write_config
    start_munge
    if ! alive "$DIR/slurmctld.pid"; then
        setsid slurmctld -D -i >>"$DIR/log/slurmctld.out" 2>&1 </dev/null &
        echo $! >"$DIR/slurmctld.pid"
    fi
    for i in $(seq 1 "$NODES"); do
        if ! alive "$DIR/slurmd-node$i.pid"; then
            setsid slurmd -D -N "node$i" >>"$DIR/log/slurmd-node$i.out" 2>&1 </dev/null &
            echo $! >"$DIR/slurmd-node$i.pid"
        fi
    done
    for _ in $(seq 120); do
        states=$(sinfo -N -h -o '%N %T' 2>/dev/null | sort -u || true)
        idle=$(grep -cE ' (idle|mixed|allocated)$' <<<"$states" || true)
        if [[ $idle -ge $NODES ]]; then log "up: $NODES nodes (SLURM_CONF=$CONF)"; return; fi
        # A node left drained by an earlier test run is returned to service.
        if grep -qE ' (drained|draining|down)' <<<"$states"; then
            scontrol update nodename="node[1-$NODES]" state=resume >/dev/null 2>&1 || true
        fi
        sleep 0.5
    done
    log "nodes did not become idle:"; sinfo -N >&2 || true; exit 1
}

stop() {
    for pidfile in "$DIR"/slurmd-node*.pid "$DIR/slurmctld.pid"; do
        [[ -f $pidfile ]] || continue
        alive "$pidfile" && kill "$(cat "$pidfile")" || true
        rm -f "$pidfile"
    done
    if [[ -f $DIR/munged.ours ]]; then
        [[ -f /run/munge/munged.pid ]] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
        rm -f "$DIR/munged.ours"
    fi
    log "stopped"
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 [start|stop|env]" >&2; exit 2 ;;
esac
