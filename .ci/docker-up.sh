#!/usr/bin/env bash
# Start a docker daemon and build the tiny sandbox image, so tests/docker runs for real.
# Idempotent: safe to run when docker is installed, running, or the image exists already.
# Fits a fresh Debian CI machine (root, no internet but apt, no bridge networking).
set -euo pipefail

IMAGE="${THUNDER_SANDBOX_IMAGE:-thunder-sandbox:latest}"
LOG="${THUNDER_DOCKERD_LOG:-/tmp/thunder-dockerd.log}"
WAIT_S="${THUNDER_DOCKERD_WAIT_S:-60}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. Packages. The busybox copied into the image must be static (the image has no libc).
static_busybox() {
  local bb
  bb="$(command -v busybox 2>/dev/null)" || return 1
  ! ldd "$bb" >/dev/null 2>&1
}
if ! command -v dockerd >/dev/null 2>&1 || ! static_busybox; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker.io busybox-static >/dev/null
fi

# 2. Daemon, unless one answers already. Bridge networking and iptables are off: containers
#    get network "none" (or "host" when a spec asks and the config allows it). overlay2 fails
#    where / is itself an overlay without support for nesting; then vfs (slow to copy a big
#    image, instant for our 2 MB busybox one).
wait_daemon() {
  for _ in $(seq 1 "$WAIT_S"); do
    docker info >/dev/null 2>&1 && return 0
    pgrep -x dockerd >/dev/null 2>&1 || return 1  # it died: no point waiting
    sleep 1
  done
  return 1
}

start_daemon() {
  echo "docker-up: starting dockerd --storage-driver $1 (log: $LOG)"
  # setsid: the daemon outlives this script and the job that ran it.
  as_root setsid nohup dockerd --storage-driver "$1" --iptables=false --ip6tables=false \
    --bridge=none >>"$LOG" 2>&1 &
  sleep 1
}

if ! docker info >/dev/null 2>&1; then
  if pgrep -x dockerd >/dev/null 2>&1; then
    echo "docker-up: dockerd is starting; waiting"
  else
    start_daemon overlay2
  fi
  if ! wait_daemon; then
    if ! pgrep -x dockerd >/dev/null 2>&1; then
      echo "docker-up: dockerd with overlay2 exited; retrying with vfs" >&2
      start_daemon vfs
    fi
    if ! wait_daemon; then
      echo "docker-up: dockerd did not answer within ${WAIT_S}s; last log lines:" >&2
      tail -n 30 "$LOG" >&2 || true
      exit 1
    fi
  fi
fi

# 3. The sandbox image: a root filesystem holding only busybox, imported (nothing is pulled).
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "docker-up: building $IMAGE from busybox"
  BB="$(command -v busybox)"
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 && BB=/bin/busybox
  ROOT="$(mktemp -d)"
  trap 'rm -rf "$ROOT"' EXIT
  mkdir -p "$ROOT"/{bin,tmp,work,proc,sys,dev,etc,root}
  cp "$BB" "$ROOT/bin/busybox"
  for app in $("$ROOT/bin/busybox" --list); do
    [ "$app" = busybox ] || ln -sf busybox "$ROOT/bin/$app"
  done
  chmod 1777 "$ROOT/tmp"
  echo 'root:x:0:0:root:/root:/bin/sh' >"$ROOT/etc/passwd"
  echo 'root:x:0:' >"$ROOT/etc/group"
  tar -C "$ROOT" -c . | docker import \
    -c 'ENV PATH=/bin' -c 'WORKDIR /work' -c 'CMD ["sh"]' - "$IMAGE" >/dev/null
fi

docker info --format 'docker-up: daemon {{.ServerVersion}} ready'
docker image inspect "$IMAGE" --format 'docker-up: image {{index .RepoTags 0}} {{.Size}} bytes'
