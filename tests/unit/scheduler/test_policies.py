"""Policies by name: each preset's configuration, the factory's errors, the admission rules'
registry."""

from __future__ import annotations

import dataclasses

import pytest

from thunder_sgl.config import AdmissionConfig, SchedulerConfig
from thunder_sgl.errors import ConfigError
from thunder_sgl.launch_router import VARIANTS
from thunder_sgl.scheduler import POLICIES, ThunderScheduler, make_policy
from thunder_sgl.scheduler.admission_rules import ADMISSION_RULES, admission_rule
from thunder_sgl.scheduler.goodput import AdmissionState
from thunder_sgl.scheduler.occupancy import OccupancyState

BASE = SchedulerConfig(lambda_max=1.2, lambda_min=1.1)


def _adm(**kw) -> AdmissionConfig:
    return dataclasses.replace(BASE.admission, **kw)


# The configuration each policy runs with, written out (what the presets' data must give).
EXPECTED = {
    "thunder": BASE,
    "thunder-occupancy": dataclasses.replace(BASE, admission=_adm(mode="occupancy", max_overcommit=1.0)),
    "thunder-fixed": dataclasses.replace(BASE, admission=_adm(mode="fixed"), session_refs=False),
    "thunder-paper": dataclasses.replace(BASE, tier_aware=False, lambda_max=1.0, lambda_min=1.0,
                                         admission=_adm(mode="fixed"), session_refs=False, groups=False),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_policy_runs_the_thunder_tick_with_its_preset_over_the_configured_values(name):
    pol = make_policy(name, BASE, 7.0)
    assert isinstance(pol, ThunderScheduler)
    assert pol.cfg == EXPECTED[name] and pol.stale_after == 7.0


def test_the_registry_lists_every_policy_the_router_offers():
    assert sorted(POLICIES) == sorted(EXPECTED) == sorted(VARIANTS.values())


def test_an_unknown_policy_fails_with_the_valid_names():
    with pytest.raises(ConfigError, match="valid: .*thunder-paper"):
        make_policy("thunder-nope", BASE)


def test_every_admission_mode_has_a_rule_and_fixed_has_none():
    assert sorted(ADMISSION_RULES) == sorted(AdmissionConfig.MODES)
    assert admission_rule("fixed") is None
    assert admission_rule("goodput").state is AdmissionState  # type: ignore[union-attr]
    assert admission_rule("occupancy").state is OccupancyState  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="valid: .*occupancy"):
        admission_rule("cost")
