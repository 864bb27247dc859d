#!/usr/bin/env bash
# A throw-away Slurm cluster on this machine, for the tests (Debian slurm-wlm + munge, as root).
#
#   tests/slurm/cluster.sh up            one node on 127.0.0.1; clients run as usual
#   tests/slurm/cluster.sh up-two-node   a head and nodes n1, n2, each in a network namespace;
#                                        clients run in the head's: tests/slurm/cluster.sh exec CMD
#   tests/slurm/cluster.sh exec CMD...   run a Slurm client (sbatch, snakemake) against the cluster
#   tests/slurm/cluster.sh status        prints "up <nodes> accounting|no-accounting" or "down"
#                                        (exit 0 only when up)
#   tests/slurm/cluster.sh down          stops what `up` started (by recorded PIDs), removes the namespaces
#   tests/slurm/cluster.sh install       only the packages (`up` installs them too; WITH_DBD=1: accounting's)
#
# Environment: SCALESTUDY_SLURM_STATE (state/log folder, default /tmp/scalestudy-slurm),
# CPUS_PER_NODE (advertised CPUs per node, may exceed the real cores; default 4),
# FAKE_GPUS_PER_NODE (a GRES "gpu" count without devices, so that GPU requests can be scheduled
# and checked; default 4; 0 = none),
# WITH_DBD=1 (accounting: mariadb + slurmdbd, so that sacct answers; account "studyacct" exists
# for root; association and QOS limits are enforced, as on real sites (sacctmgr ... maxsubmitjobs);
# default 0: no accounting, and sacct answers "Slurm accounting storage is disabled").
#
# `up` and `down` hold a lock (flock on $SCALESTUDY_SLURM_STATE.cluster.lock): a second bring-up
# waits for the first, then uses the cluster it finds, and refuses (exit 1) to replace a running
# cluster of another kind (nodes, accounting): run `down` first. `up` never stops a working cluster.
# Exit status 77: this machine cannot run the cluster (not root, no apt-get, a real Slurm
# configuration present); the message says why. Measured: packages ~16 s (+ ~10 s with WITH_DBD),
# daemons up ~5 s (+ ~10 s for mariadb and slurmdbd).
set -euo pipefail

STATE=${SCALESTUDY_SLURM_STATE:-/tmp/scalestudy-slurm}
CPN=${CPUS_PER_NODE:-4}
GPN=${FAKE_GPUS_PER_NODE:-4}
DBD=${WITH_DBD:-0}
CONF=/etc/slurm/slurm.conf   # must be the default path: the jobstep plugin strips SLURM_CONF
DBD_CONF=/etc/slurm/slurmdbd.conf
ACCOUNT=studyacct
MARK="# scalestudy test cluster"
NET=10.77.0
NS_HEAD=ss-head
HOSTS_BEGIN="# scalestudy-slurm-test begin"
HOSTS_END="# scalestudy-slurm-test end"

say() { echo "[cluster] $*" >&2; }
cannot() { say "cannot run a test cluster here: $*"; exit 77; }

nodes_up() { cat "$STATE/nodes" 2>/dev/null || echo 0; }
accounting_up() {
  if [ "$(cat "$STATE/accounting" 2>/dev/null || echo 0)" = 1 ]; then echo accounting; else echo no-accounting; fi
}

lock() {  # serialises up/down of every caller on this machine (released when the script exits)
  mkdir -p "$(dirname "$STATE")"
  exec 9>"$STATE.cluster.lock"
  flock -w 900 9 || { say "waited 15 minutes for $STATE.cluster.lock"; exit 1; }
}

client() {  # fd 9 (the lock) closed: a daemon started here must not hold it
  if [ "$(nodes_up)" = 2 ]; then nsenter --net=/run/netns/$NS_HEAD "$@" 9>&-; else "$@" 9>&-; fi
}

install_packages() {
  local packages="slurm-wlm slurmctld slurmd slurm-client munge"
  [ "$DBD" = 1 ] && packages="$packages slurmdbd mariadb-server"
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null; then
    [ "$DBD" = 1 ] || return 0
    command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return 0
  fi
  [ "$(id -u)" = 0 ] || cannot "not root (needed to install slurm-wlm and munge)"
  command -v apt-get >/dev/null || cannot "no apt-get to install slurm-wlm and munge"
  say "installing $packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq >"$STATE/apt.log" 2>&1 || cannot "apt-get update failed (see $STATE/apt.log)"
  # shellcheck disable=SC2086  # a list of package names
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $packages \
    >>"$STATE/apt.log" 2>&1 || cannot "apt-get install failed (see $STATE/apt.log)"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge /etc/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
  chown munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged 9>&-
  touch "$STATE/started-munge"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  cannot "munged did not start"
}

write_conf() {  # $1: node count
  local nodes=$1 host mem ctl
  host=$(hostname -s)
  mem=$(( $(slurmd -C | grep -o 'RealMemory=[0-9]*' | cut -d= -f2) / nodes - 1024 ))
  if [ "$nodes" = 1 ]; then ctl=127.0.0.1; else ctl=$NET.1; fi
  mkdir -p "$STATE/ctld" "$STATE/d" "$STATE/log" "$STATE/run"
  local gres_types="" gres="" accounting
  if [ "$GPN" -gt 0 ]; then gres_types="GresTypes=gpu"; gres="Gres=gpu:$GPN"; fi
  if [ "$DBD" = 1 ]; then
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageEnforce=associations,limits,qos
JobAcctGatherType=jobacct_gather/linux"
  else
    accounting="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
  fi
  cat >"$CONF" <<EOF
$MARK (tests/slurm/cluster.sh); removed by 'cluster.sh down'
ClusterName=scalestudy
SlurmctldHost=$host($ctl)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$accounting
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
# Finished jobs stay visible to squeue and scontrol for an hour: the profiles' job status
# (slurm-status-command: squeue) and the tests' scontrol checks, with or without accounting.
MinJobAge=3600
KillWait=5
$gres_types
EOF
  if [ "$nodes" = 1 ]; then
    echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPN RealMemory=$mem $gres State=UNKNOWN" >>"$CONF"
  else
    for i in $(seq 1 "$nodes"); do
      echo "NodeName=n$i NodeAddr=$NET.$((10 + i)) NodeHostname=n$i CPUs=$CPN RealMemory=$mem $gres State=UNKNOWN" >>"$CONF"
    done
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
  # Fake GPUs: character devices like /dev/null (slurmd wants one device file per GPU).
  if [ "$GPN" -gt 0 ]; then
    echo "Name=gpu File=$STATE/dev/gpu[0-$((GPN - 1))]" >/etc/slurm/gres.conf
  else
    rm -f /etc/slurm/gres.conf
  fi
}

make_fake_gpus() {
  [ "$GPN" -gt 0 ] || return 0
  mkdir -p "$STATE/dev"
  for i in $(seq 0 $((GPN - 1))); do
    [ -c "$STATE/dev/gpu$i" ] || mknod "$STATE/dev/gpu$i" c 1 3 2>/dev/null || {
      say "mknod failed: no fake GPUs"; GPN=0; return 0; }
  done
}

make_namespaces() {  # $1: node count; a bridge in the head's namespace, one veth per node
  ip netns add $NS_HEAD
  ip -n $NS_HEAD link set lo up
  ip -n $NS_HEAD link add br0 type bridge
  ip -n $NS_HEAD addr add $NET.1/24 dev br0
  ip -n $NS_HEAD link set br0 up
  for i in $(seq 1 "$1"); do
    ip netns add ss-n$i
    ip -n ss-n$i link set lo up
    ip -n $NS_HEAD link add vh$i type veth peer name e0 netns ss-n$i
    ip -n $NS_HEAD link set vh$i master br0
    ip -n $NS_HEAD link set vh$i up
    ip -n ss-n$i addr add $NET.$((10 + i))/24 dev e0
    ip -n ss-n$i link set e0 up
  done
  # Node names resolve as on a real cluster (the trainer's rendezvous and gloo use them).
  { echo "$HOSTS_BEGIN"; for i in $(seq 1 "$1"); do echo "$NET.$((10 + i)) n$i"; done; echo "$HOSTS_END"; } >>/etc/hosts
}

start_dbd() {  # mariadb + slurmdbd where slurmctld runs (the head's namespace), before slurmctld
  [ "$DBD" = 1 ] || return 0
  local db="$STATE/mysql" socket="$STATE/run/mysqld.sock"
  rm -rf "$db"
  mkdir -p "$db"
  mariadb-install-db --no-defaults --datadir="$db" --user=root --auth-root-authentication-method=normal \
    --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1 || { say "mariadb-install-db failed"; exit 1; }
  # setsid -f: no waiting background subshell (it would hold the lock's descriptor as long as mariadbd runs)
  client setsid -f mariadbd --no-defaults --datadir="$db" --socket="$socket" --port=3306 \
    --bind-address=127.0.0.1 --user=root --pid-file="$STATE/run/mysqld.pid" \
    --log-error="$STATE/log/mysqld.err" </dev/null >/dev/null 2>&1
  for _ in $(seq 150); do mariadb-admin --socket="$socket" -uroot ping >/dev/null 2>&1 && break; sleep 0.2; done
  mariadb --socket="$socket" -uroot -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY
    'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || { say "mariadb did not start"; exit 1; }
  {
    echo "$MARK (tests/slurm/cluster.sh); removed by 'cluster.sh down'"
    echo "AuthType=auth/munge"
    echo "DbdHost=localhost"
    echo "DbdAddr=127.0.0.1"
    echo "DbdPort=6819"
    echo "SlurmUser=root"
    echo "LogFile=$STATE/log/slurmdbd.log"
    echo "PidFile=$STATE/run/slurmdbd.pid"
    echo "StorageType=accounting_storage/mysql"
    echo "StorageHost=127.0.0.1"
    echo "StoragePort=3306"
    echo "StorageUser=slurm"
    echo "StoragePass=slurmpw"
    echo "StorageLoc=slurm_acct_db"
  } >"$DBD_CONF"
  chmod 600 "$DBD_CONF"
  client slurmdbd
  for _ in $(seq 150); do client sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  client sacctmgr -i add cluster scalestudy >/dev/null
  client sacctmgr -i add account "$ACCOUNT" Cluster=scalestudy >/dev/null
  client sacctmgr -i add user root Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null
}

start_daemons() {  # $1: node count
  start_dbd
  if [ "$1" = 1 ]; then
    slurmctld 9>&-
    slurmd -N "$(hostname -s)" 9>&-
  else
    # nsenter, not `ip netns exec` (which remounts /sys and hides /sys/fs/cgroup from slurmd)
    nsenter --net=/run/netns/$NS_HEAD slurmctld
    for i in $(seq 1 "$1"); do
      nsenter --net=/run/netns/ss-n$i unshare --uts sh -c "hostname n$i; exec slurmd -N n$i" 9>&-
    done
  fi
  for _ in $(seq 120); do
    [ "$(client sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && return 0
    sleep 0.5
  done
  client sinfo -N >&2 || true
  say "nodes did not become idle; see $STATE/log"
  exit 1
}

up() {  # $1: node count
  local nodes=$1 t0 kind
  t0=$(date +%s)
  if [ "$DBD" = 1 ]; then kind=accounting; else kind=no-accounting; fi
  [ "$(id -u)" = 0 ] || cannot "not root"
  lock
  if [ "$(nodes_up)" != 0 ] && client sinfo -h -o %T 2>/dev/null | grep -q .; then
    if [ "$(nodes_up) $(accounting_up)" = "$nodes $kind" ]; then
      say "already up with $nodes node(s), $kind"
      return 0
    fi
    say "a cluster with $(nodes_up) node(s), $(accounting_up), is up (another user's?): not replacing" \
      "it; run '$0 down' first"
    exit 1
  fi
  if [ -e "$CONF" ] && ! grep -q "^$MARK" "$CONF"; then
    cannot "$CONF exists and is not this script's (a real Slurm installation?)"
  fi
  down quiet
  mkdir -p "$STATE"
  install_packages
  if [ "$nodes" = 2 ]; then
    command -v ip >/dev/null || apt-get install -y -qq --no-install-recommends iproute2 >>"$STATE/apt.log" 2>&1 || true
    command -v ip >/dev/null && command -v nsenter >/dev/null && command -v unshare >/dev/null \
      || cannot "ip, nsenter and unshare are needed for the two-node cluster (network namespaces)"
    ip netns add ss-probe 2>/dev/null && ip netns del ss-probe || cannot "cannot create network namespaces"
  fi
  start_munge
  make_fake_gpus
  write_conf "$nodes"
  echo "$nodes" >"$STATE/nodes"
  echo "$DBD" >"$STATE/accounting"
  [ "$nodes" = 2 ] && make_namespaces "$nodes"
  start_daemons "$nodes"
  client sinfo -N >&2
  say "up with $nodes node(s), $kind, after $(( $(date +%s) - t0 )) s"
}

down() {
  [ "${1:-}" = quiet ] || lock  # (`up` holds it already when it calls `down quiet`)
  [ "$(nodes_up)" != 0 ] && client scancel --user="$(id -un)" >/dev/null 2>&1 && sleep 1
  for pidfile in "$STATE"/run/slurmd-*.pid "$STATE"/run/slurmctld.pid "$STATE"/run/slurmdbd.pid \
    "$STATE"/run/mysqld.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  sleep 1
  if [ -f "$STATE/started-munge" ] && [ -f /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    rm -f "$STATE/started-munge"
  fi
  for ns in $(ip netns list 2>/dev/null | awk '/^ss-(head|n[0-9]+)/{print $1}'); do ip netns del "$ns"; done
  if grep -q "^$HOSTS_BEGIN" /etc/hosts 2>/dev/null; then
    # /etc/hosts may be a bind mount: rewrite it in place rather than replace it.
    sed "/^$HOSTS_BEGIN/,/^$HOSTS_END/d" /etc/hosts >"$STATE/hosts.new" && cat "$STATE/hosts.new" >/etc/hosts
  fi
  if [ -e "$CONF" ] && grep -q "^$MARK" "$CONF"; then rm -f "$CONF" /etc/slurm/gres.conf; fi
  if [ -e "$DBD_CONF" ] && grep -q "^$MARK" "$DBD_CONF"; then rm -f "$DBD_CONF"; fi
  rm -rf "$STATE/ctld" "$STATE/d" "$STATE/nodes" "$STATE/accounting" "$STATE/mysql"
  [ "${1:-}" = quiet ] || say "down"
}

status() {
  local nodes
  nodes=$(nodes_up)
  if [ "$nodes" != 0 ] && client sinfo -h -o %T 2>/dev/null | grep -q .; then
    echo "up $nodes $(accounting_up)"
  else
    echo down
    return 1
  fi
}

case "${1:-}" in
  up) up 1 ;;
  up-two-node) up 2 ;;
  down) down ;;
  status) status ;;
  exec) shift; client "$@" ;;
  install) lock; mkdir -p "$STATE"; install_packages ;;
  *) echo "usage: $0 up|up-two-node|down|status|exec CMD...|install" >&2; exit 2 ;;
esac
