"""The CSI plugin's tenancy policy (csi.tenancy): namespace and service-account entries,
deny by default, the one-line single-tenant policy, and files that do not parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from csi.tenancy import PolicyError, Tenancy, parse


def test_entries_by_namespace_service_account_and_every_namespace(tmp_path: Path) -> None:
    path = tmp_path / "tenancy.yaml"
    path.write_text('tenant-a: [team-a, "team-a-*"]\ntenant-b/trainer: [team-b]\n')
    policy = Tenancy(path)
    assert policy.decide("tenant-a", "default", "team-a-2024").allowed
    assert not policy.decide("tenant-a", "default", "team-b").allowed
    assert policy.decide("tenant-b", "trainer", "team-b").allowed
    assert not policy.decide("tenant-b", "default", "team-b").allowed
    refused = policy.decide("tenant-z", "default", "team-a")
    assert not refused.allowed and "'tenant-z'" in refused.reason


def test_no_policy_allows_nothing_and_one_line_allows_everything(tmp_path: Path) -> None:
    assert not Tenancy(None).decide("ns", "sa", "ds").allowed
    assert not Tenancy(tmp_path / "missing.yaml").decide("ns", "sa", "ds").allowed
    single = tmp_path / "single.yaml"
    single.write_text('"*": ["*"]\n')
    assert Tenancy(single).decide("any", "", "anything").allowed


@pytest.mark.parametrize(
    "text",
    ["[a, b]", "ns: team-a", "ns: [1]", "a/b/c: [x]", "ns: [unclosed"],
    ids=["a-list", "not-a-list", "not-strings", "two-slashes", "not-yaml"],
)
def test_a_policy_that_does_not_parse_is_refused(text: str) -> None:
    with pytest.raises(PolicyError):
        parse(text)
