#!/usr/bin/env bash
# sdbox.sh -- a throwaway machine with a real systemd as PID 1, for testing the playbooks on a host
# whose own PID 1 is not systemd (CI VMs, containers).
#
# systemd runs in private pid/mount/cgroup/uts (and optionally net) namespaces, on an overlay whose
# lower layer is the host root: the host's files are visible read-only, every write lands in a RAM
# upper layer that vanishes on stop. Only the directories named in SDBOX_BINDS are shared read-write.
#
# usage: sdbox.sh start            boot the sandbox and wait until systemd is running
#        sdbox.sh exec CMD [ARG...] run a command inside (all namespaces; cwd kept when visible)
#        sdbox.sh shell            an interactive shell inside
#        sdbox.sh mainpid UNIT     the unit's MainPID (sandbox pid namespace); fails unless > 1
#        sdbox.sh status           "running <pid>" or "stopped" (exit 0 / 3)
#        sdbox.sh stop             power off and remove every trace (idempotent)
# env:   SDBOX_NAME    sandbox name, [A-Za-z0-9_.-]+ (default sdbox); several can run at once
#        SDBOX_BINDS   space-separated host dirs bound read-write at the same path (default: $PWD)
#        SDBOX_NET=1   private network namespace (only lo): ports inside never clash with the host's
#        SDBOX_SHM     size of the sandbox's own /dev/shm (default 1g)
#        SDBOX_UPPER   size cap of the RAM upper layer (default 4g)
#        SDBOX_UNIT    systemd default target (default basic.target: host services stay off)
#        SDBOX_BOOT_TIMEOUT  seconds to wait for systemd (default 60)
# needs: root, util-linux (unshare, nsenter), systemd installed (not running), overlayfs, cgroup2.
set -euo pipefail

NAME=${SDBOX_NAME:-sdbox}
[[ $NAME =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "sdbox: SDBOX_NAME='$NAME' must match [A-Za-z0-9_.-]+" >&2; exit 2; }
STATE=/run/sdbox/$NAME
if [ -d /sys/fs/cgroup/unified ]; then CG_ROOT=/sys/fs/cgroup/unified; else CG_ROOT=/sys/fs/cgroup; fi
CG=$CG_ROOT/sdbox-$NAME

die() { echo "sdbox[$NAME]: $*" >&2; exit 1; }

# PID (host view) of the sandbox's systemd: the child of unshare.
sd_pid() {
  local u
  u=$(cat "$STATE/unshare.pid" 2>/dev/null) || return 1
  kill -0 "$u" 2>/dev/null || return 1
  pgrep -P "$u" -x systemd
}

# The script that runs as the namespaces' first process: builds the root, then becomes systemd.
# It is quoted ('EOF'): every value arrives through the environment, nothing is spliced into code.
write_inner() {
  cat > "$STATE/inner.sh" <<'EOF'
set -eu
mount --make-rprivate /
W=$SDBOX_STATE/w
mkdir -p "$W"
mount -t tmpfs -o "size=$SDBOX_UPPER" sdbox-upper "$W"
mkdir -p "$W/u" "$W/wk" "$W/r"
R=$W/r
mount -t overlay overlay -o "lowerdir=/,upperdir=$W/u,workdir=$W/wk" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
umount -R "$R/sys/fs/cgroup"
mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"          # pure v2 view rooted at our cgroup (cgroupns)
mount -t tmpfs -o mode=755 sdbox-dev "$R/dev"
for d in null zero full random urandom tty; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=666 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o "mode=1777,size=$SDBOX_SHM" sdbox-shm "$R/dev/shm"
touch "$R/dev/console"                                 # a plain file: keeps systemd off the host console
mount -t tmpfs -o mode=755 sdbox-run "$R/run"
mount -t tmpfs -o mode=1777 sdbox-tmp "$R/tmp"
for b in $SDBOX_BINDS; do mkdir -p "$R$b"; mount --rbind "$b" "$R$b"; done
if [ -n "$SDBOX_NET" ]; then ip link set lo up; fi
cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
exec env -i container=sdbox PATH=/usr/sbin:/usr/bin:/sbin:/bin /lib/systemd/systemd --system --unit="$SDBOX_UNIT"
EOF
}

cmd_stop() {
  local p u
  if p=$(sd_pid 2>/dev/null); then
    nsenter -t "$p" -a systemctl poweroff --no-block >/dev/null 2>&1 || true
  fi
  if u=$(cat "$STATE/unshare.pid" 2>/dev/null); then
    for _ in $(seq 100); do kill -0 "$u" 2>/dev/null || break; sleep 0.1; done
  fi
  # Whatever survived the poweroff (or a sandbox whose systemd never came up): kill the whole cgroup.
  if [ -d "$CG" ]; then
    if [ -e "$CG/cgroup.kill" ]; then echo 1 > "$CG/cgroup.kill" 2>/dev/null || true
    else xargs -r kill -9 < "$CG/cgroup.procs" 2>/dev/null || true; fi
    # Processes in the sandbox's sub-cgroups take a moment to die after cgroup.kill: retry the removal.
    for _ in $(seq 100); do
      find "$CG" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
      rmdir "$CG" 2>/dev/null && break
      sleep 0.1
    done
  fi
  rm -rf "$STATE"
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  [ -x /lib/systemd/systemd ] || die "systemd is not installed (/lib/systemd/systemd)"
  if sd_pid >/dev/null 2>&1; then die "already running (SDBOX_NAME=$NAME); stop it first"; fi
  cmd_stop                                             # clear a stale state dir / cgroup of the same name
  local b binds=${SDBOX_BINDS-$PWD}
  for b in $binds; do
    [[ $b == /* && -d $b ]] || die "SDBOX_BINDS entry '$b' is not an absolute path to a directory"
  done
  mkdir -p "$STATE" "$CG"
  write_inner
  (
    echo "$BASHPID" > "$CG/cgroup.procs"
    export SDBOX_STATE=$STATE SDBOX_NAME=$NAME SDBOX_BINDS=$binds SDBOX_NET=${SDBOX_NET:-} \
      SDBOX_SHM=${SDBOX_SHM:-1g} SDBOX_UPPER=${SDBOX_UPPER:-4g} SDBOX_UNIT=${SDBOX_UNIT:-basic.target}
    exec unshare --pid --fork --mount --cgroup --uts ${SDBOX_NET:+--net} --kill-child bash "$STATE/inner.sh"
  ) > "$STATE/log" 2>&1 &
  echo $! > "$STATE/unshare.pid"
  local p="" state="" deadline=$((SECONDS + ${SDBOX_BOOT_TIMEOUT:-60}))
  while [ $SECONDS -lt $deadline ]; do
    if p=$(sd_pid 2>/dev/null) && [ -S "/proc/$p/root/run/systemd/private" ]; then break; fi
    kill -0 "$(cat "$STATE/unshare.pid")" 2>/dev/null || break
    p=""; sleep 0.1
  done
  if [ -n "$p" ]; then
    state=$(timeout $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)) \
      nsenter -t "$p" -a systemctl is-system-running --wait 2>/dev/null) || true
  fi
  if [[ $state != running && $state != degraded ]]; then
    echo "sdbox[$NAME]: systemd did not come up (state '${state:-none}'); log:" >&2
    cat "$STATE/log" >&2 || true
    cmd_stop
    exit 1
  fi
  echo "$state"
}

cmd_exec() {
  local p
  p=$(sd_pid) || die "not running (SDBOX_NAME=$NAME)"
  if [ -d "/proc/$p/root$PWD" ]; then exec nsenter -t "$p" -a --wdns="$PWD" "$@"; fi
  exec nsenter -t "$p" -a --wdns=/ "$@"
}

case ${1:-} in
start) cmd_start ;;
exec) shift; [ $# -gt 0 ] || die "exec needs a command"; cmd_exec "$@" ;;
shell) cmd_exec /bin/bash -l ;;
mainpid)
  [ -n "${2:-}" ] || die "mainpid needs a unit name"
  p=$(sd_pid) || die "not running (SDBOX_NAME=$NAME)"
  m=$(nsenter -t "$p" -a systemctl show -p MainPID --value "$2")
  [[ $m =~ ^[0-9]+$ && $m -gt 1 ]] || die "unit $2 has no main process (MainPID=$m)"
  echo "$m" ;;
status)
  if p=$(sd_pid 2>/dev/null); then echo "running $p"; else echo stopped; exit 3; fi ;;
stop) cmd_stop ;;
*) sed -n '9,21p' "$0" >&2; exit 2 ;;
esac
