#!/usr/bin/env bash
# Start a docker daemon and build the tiny sandbox image, so tests/docker runs for real.
# Idempotent: safe to run when docker is installed, running, or the image exists already.
# Fits a fresh Debian CI machine (root, no internet but apt, no bridge networking).
set -euo pipefail

IMAGE="${THUNDER_SANDBOX_IMAGE:-thunder-sandbox:latest}"
LOG="${THUNDER_DOCKERD_LOG:-/tmp/thunder-dockerd.log}"
WAIT_S="${THUNDER_DOCKERD_WAIT_S:-60}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. Packages.
if ! command -v dockerd >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker.io busybox-static >/dev/null
fi

# 2. Daemon, unless one answers already. Bridge networking and iptables are off: containers
#    get network "none" (or "host" when a spec asks and the config allows it).
if ! docker info >/dev/null 2>&1; then
  echo "docker-up: starting dockerd (log: $LOG)"
  # setsid: the daemon outlives this script and the job that ran it.
  as_root setsid nohup dockerd --storage-driver overlay2 --iptables=false --ip6tables=false \
    --bridge=none >"$LOG" 2>&1 &
  for _ in $(seq 1 "$WAIT_S"); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "docker-up: dockerd did not answer within ${WAIT_S}s; last log lines:" >&2
    tail -n 30 "$LOG" >&2 || true
    exit 1
  fi
fi

# 3. The sandbox image: a root filesystem holding only busybox, imported (nothing is pulled).
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "docker-up: building $IMAGE from busybox"
  BB="$(command -v busybox)"
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
