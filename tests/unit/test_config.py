from __future__ import annotations

import dataclasses

import pytest

from thunder_sgl.config import (
    CONFIG_DIR,
    RouterConfig,
    SchedulerConfig,
    load_config,
    resolve_config_path,
)
from thunder_sgl.errors import ConfigError


def test_shipped_thunder_yaml_equals_the_typed_defaults():
    # The YAML documents every parameter; it must not drift from the dataclass defaults.
    assert load_config(CONFIG_DIR / "thunder.yaml") == RouterConfig()


def test_every_config_field_is_documented_in_thunder_yaml():
    text = (CONFIG_DIR / "thunder.yaml").read_text()
    cfg = RouterConfig()
    for section in ("scheduler", "programs", "monitor", "gateway", "sandboxes", "windows"):
        for f in dataclasses.fields(getattr(cfg, section)):
            assert f"  {f.name}:" in text, f"{section}.{f.name} missing from thunder.yaml"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("scheduler:\n  tick_secs: 5\n", "unknown key(s) ['tick_secs']"),
        ("scheduler:\n  tick_seconds: -1\n", "tick_seconds must be > 0"),
        ("scheduler:\n  lambda_min: 1.5\n", "lambda_min <= lambda_max"),
        ("scheduler:\n  tier_aware: yes-please\n", "must be true or false"),
        ("gateway:\n  max_body_bytes: lots\n", "must be an integer"),
        ("sandboxes:\n  allowed_networks: [bridge]\n", "only none and host"),
        ("nonsense: 1\n", "unknown key(s) ['nonsense']"),
        ("- a list\n", "top level must be a mapping"),
    ],
)
def test_bad_config_fails_loudly_with_the_field_named(tmp_path, yaml_text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert message in str(e.value)


def test_time_scale_divides_policy_time_constants_only():
    cfg = RouterConfig().scaled(50.0)
    assert cfg.time_scale == 50.0
    assert cfg.scheduler.tick_seconds == pytest.approx(0.1)
    assert cfg.scheduler.reserve_after_seconds == pytest.approx(60.0 / 50)
    assert cfg.programs.idle_timeout_seconds == pytest.approx(1800.0 / 50)
    assert cfg.gateway.held_timeout_seconds == pytest.approx(1800.0 / 50)
    # Not time constants of the policy: unchanged.
    assert cfg.scheduler.decay_base == 2.0
    assert cfg.sandboxes.exec_timeout_seconds == 60.0
    assert cfg.monitor.request_timeout_seconds == 2.0 and cfg.monitor.stale_after_seconds == 10.0
    # The poll period follows the engines' clock (readings as fresh as on a real cluster), down
    # to a floor of 0.1 s.
    assert cfg.monitor.poll_interval_seconds == pytest.approx(0.1)
    assert RouterConfig().scaled(8.0).monitor.poll_interval_seconds == pytest.approx(0.125)


def test_overrides_are_validated():
    cfg = RouterConfig().with_overrides({"scheduler.tick_seconds": 2.0})
    assert cfg.scheduler.tick_seconds == 2.0
    with pytest.raises(ConfigError):
        RouterConfig().with_overrides({"scheduler.decay_base": 0.5})
    with pytest.raises(ConfigError):
        RouterConfig().with_overrides({"schedular.tick_seconds": 1})


def test_configs_resolve_by_bare_name():
    assert resolve_config_path("thunder") == CONFIG_DIR / "thunder.yaml"
    with pytest.raises(ConfigError, match="not found"):
        resolve_config_path("no-such-config")


def test_config_objects_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SchedulerConfig().tick_seconds = 1.0  # type: ignore[misc]
