"""Configuration of the program-owned tool sandboxes: the ``sandboxes`` section of
``configs/thunder.yaml`` (``RouterConfig.sandboxes``), read only by this package."""

from __future__ import annotations

from dataclasses import dataclass

from thunder_sgl.errors import check_config as _check


@dataclass(frozen=True)
class SandboxConfig:
    """Program-owned tool sandboxes."""

    provider: str = "auto"
    """docker | local | none | auto (docker when a daemon answers, else local)."""

    default_image: str = "thunder-sandbox:latest"
    """Image used when a spec names none."""

    default_memory_mb: int = 512
    """Memory limit when a spec names none."""

    max_memory_mb: int = 8192
    """Largest memory limit a spec may ask for."""

    default_cpus: float = 1.0
    """CPU limit when a spec names none."""

    max_cpus: float = 4.0
    """Largest CPU limit a spec may ask for."""

    default_pids: int = 256
    """pids limit when a spec names none."""

    max_pids: int = 4096
    """Largest pids limit a spec may ask for."""

    allowed_networks: tuple[str, ...] = ("none", "host")
    """Networks a spec may ask for; the default is the first."""

    port_range: tuple[int, int] = (42000, 43999)
    """Ports handed to sandboxes (inclusive)."""

    exec_timeout_seconds: float = 60.0
    """Default exec timeout (mini-swe-agent's tool timeout)."""

    max_exec_timeout_seconds: float = 3600.0
    """Largest exec timeout a client may ask for."""

    max_sandboxes_per_program: int = 16
    """Sandboxes one program may own."""

    prepare_ahead: bool = True
    """Prepare a waiting program's sandboxes while it waits for admission, and restart a paused
    program's stopped containers when it nears the head of the queue."""

    stop_paused_after_seconds: float = 0.0
    """Stop (not remove) a paused program's containers after this long paused; 0 never stops."""

    max_ports_per_sandbox: int = 16
    """Ports one sandbox spec may ask for."""

    local_root: str | None = None
    """Working directories of local-process sandboxes (default: $TMPDIR/thunder_sgl-sandboxes)."""

    docker_concurrency: int = 8
    """Docker create/start/stop/remove calls in flight at once (the daemon is the bottleneck)."""

    exec_concurrency: int = 64
    """Sandbox execs in flight at once."""

    max_output_bytes: int = 1_048_576
    """stdout and stderr of one exec are each cut at this size (the result says truncated)."""

    stop_timeout_seconds: int = 2
    """Grace period of a container stop before it is killed."""

    setup_timeout_seconds: float = 600.0
    """Timeout of each set-up command of a spec."""

    prepare_ahead_count: int = 8
    """How many programs at the head of the waiting queue get their sandboxes readied."""

    def __post_init__(self) -> None:
        _check(self.provider in ("docker", "local", "none", "auto"), "sandboxes.provider must be docker, local, none or auto")
        _check(0 < self.default_memory_mb <= self.max_memory_mb, "need 0 < default_memory_mb <= max_memory_mb")
        _check(0 < self.default_cpus <= self.max_cpus, "need 0 < default_cpus <= max_cpus")
        _check(0 < self.default_pids <= self.max_pids, "need 0 < default_pids <= max_pids")
        _check(len(self.allowed_networks) >= 1 and all(n in ("none", "host") for n in self.allowed_networks), "sandboxes.allowed_networks may hold only none and host")
        lo, hi = self.port_range
        _check(1024 <= lo <= hi <= 65535, "sandboxes.port_range must be within 1024..65535, low <= high")
        _check(0 < self.exec_timeout_seconds <= self.max_exec_timeout_seconds, "need 0 < exec_timeout <= max_exec_timeout")
        _check(self.max_sandboxes_per_program >= 1, "sandboxes.max_sandboxes_per_program must be >= 1")
        _check(self.max_ports_per_sandbox >= 0, "sandboxes.max_ports_per_sandbox must be >= 0")
        _check(self.docker_concurrency >= 1 and self.exec_concurrency >= 1, "sandbox concurrencies must be >= 1")
        _check(self.max_output_bytes >= 1024, "sandboxes.max_output_bytes must be >= 1024")
        _check(self.stop_timeout_seconds >= 0 and self.setup_timeout_seconds > 0, "sandbox timeouts must be positive")
        _check(self.prepare_ahead_count >= 0, "sandboxes.prepare_ahead_count must be >= 0")

    # Sandboxes run in real time even in front of a simulated cluster.
    _TIME_FIELDS = ()
