"""The tenants file (spoke.cache.tenants): what parses, what is refused and why, and whose
a dataset is."""

from __future__ import annotations

from pathlib import Path

import pytest

from spoke.cache.tenants import TenantsError, TenantShares, parse


def test_a_tenant_names_its_datasets_and_shares() -> None:
    tenants = parse(
        "team-b: {datasets: [b], cache_share: 0.25}\n"
        "team-a: {datasets: [a, 'a-*'], cache_share: 0.5, link_share: 1}\n"
    )
    assert list(tenants) == ["team-a", "team-b"]  # name order: who owns a shared block
    a = tenants["team-a"]
    assert a.holds("a") and a.holds("a-7") and not a.holds("b")
    assert (a.cache_share, a.link_share) == (0.5, 1.0)
    assert tenants["team-b"].link_share == 0.0
    assert parse("") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[a, b]", "must map tenant names"),
        ("a: [x]", "must map to"),
        ("a: {datasets: []}", "must list its datasets"),
        ("a: {datasets: [x], cache_share: 1.5}", "outside [0, 1]"),
        ("a: {datasets: [x], cache_share: -0.1}", "outside [0, 1]"),
        ("a: {datasets: [x], link_share: yes}", "must be a number"),
        ("a: {datasets: [x], share: 0.1}", "unknown keys ['share']"),
        (
            "a: {datasets: [x], cache_share: 0.6}\nb: {datasets: [y], cache_share: 0.6}",
            "cache_shares sum to 1.2, above 1",
        ),
        ("a: {datasets: [x]\n", "is not YAML (line"),
    ],
)
def test_a_wrong_file_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(TenantsError, match=None) as err:
        parse(text)
    assert says in str(err.value)


def test_a_missing_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(TenantsError):
        TenantShares(tmp_path / "absent.yaml", 1 << 20)


def test_a_block_of_two_tenants_datasets_is_the_first_by_name(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("zeta: {datasets: [shared]}\nalpha: {datasets: ['sha*']}\n")
    shares = TenantShares(path, 100, lambda digests: {d: ["shared"] for d in digests})
    assert shares.attribute(["d1"]) == {"d1": "alpha"}
    assert shares.tenant_of_datasets(["nobody"]) is None
