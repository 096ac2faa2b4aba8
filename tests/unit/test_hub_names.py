"""Naming rules: datasets, tags, versions, references and block digests."""

from __future__ import annotations

import pytest

from hub.errors import InvalidDigest, InvalidName
from hub.snapshot.names import (
    is_version,
    validate_dataset,
    validate_digest,
    validate_ref,
    validate_tag,
    version_name,
    version_number,
)

VALID_NAMES = ["f3", "a", "0", "seismic-2024", "f3.v2_raw", "a" * 64, "9lives", "a..b"]
INVALID_NAMES = [
    "",
    ".",
    "..",
    ".hidden",
    "-dash",
    "_under",
    "a/b",
    "../etc",
    "a\0b",
    "F3",
    "a" * 65,
    "a b",
    "a\n",
    "ñ",
    "a:b",
]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_dataset_names(name: str) -> None:
    assert validate_dataset(name) == name


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_dataset_names(name: str) -> None:
    with pytest.raises(InvalidName, match="invalid dataset name"):
        validate_dataset(name)


@pytest.mark.parametrize("name", [*VALID_NAMES, "latest", "stable", "v", "vx", "v1a", "version"])
def test_valid_tags(name: str) -> None:
    assert validate_tag(name) == name


@pytest.mark.parametrize("name", [*INVALID_NAMES, "v1", "v0", "v01", "v123"])
def test_invalid_tags(name: str) -> None:
    with pytest.raises(InvalidName, match="invalid tag name"):
        validate_tag(name)


@pytest.mark.parametrize(
    ("name", "number"), [("v1", 1), ("v9", 9), ("v10", 10), ("v4294967295", 2**32 - 1)]
)
def test_versions_round_trip(name: str, number: int) -> None:
    assert is_version(name)
    assert version_number(name) == number
    assert version_name(number) == name


@pytest.mark.parametrize(
    "name", ["v0", "v01", "V1", "1", "v", "v-1", "v1.0", "v4294967296", "latest"]
)
def test_malformed_versions(name: str) -> None:
    assert not is_version(name)
    with pytest.raises(InvalidName, match="invalid version"):
        version_number(name)


@pytest.mark.parametrize("number", [0, -1, 2**32])
def test_version_number_out_of_range(number: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        version_name(number)


@pytest.mark.parametrize("ref", ["v1", "v42", "latest", "stable.2"])
def test_valid_refs(ref: str) -> None:
    assert validate_ref(ref) == ref


@pytest.mark.parametrize("ref", ["", "v0", "v01", "..", "a/b", "Latest", "x" * 65])
def test_invalid_refs(ref: str) -> None:
    with pytest.raises(InvalidName, match="invalid reference"):
        validate_ref(ref)


def test_valid_digest() -> None:
    digest = "0123456789abcdef" * 2
    assert validate_digest(digest) == digest


@pytest.mark.parametrize(
    "digest",
    ["", "0" * 31, "0" * 33, "0123456789ABCDEF" * 2, "g" * 32, "../" + "0" * 29, "0" * 31 + "\n"],
)
def test_malformed_digests(digest: str) -> None:
    with pytest.raises(InvalidDigest, match="malformed block digest"):
        validate_digest(digest)


def test_error_messages_bound_long_input() -> None:
    with pytest.raises(InvalidName) as caught:
        validate_dataset("X" * 10_000)
    assert len(str(caught.value)) < 300
