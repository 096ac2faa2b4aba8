"""Globs of prewarm, pin and evict requests: the matcher selects exactly what fnmatch's rule
selects, and what one request may make the daemon hold or do is bounded (issue 39's tenth
probe: 8 MB of globs kept with every pin, fnmatch's cache grown to 2.3 GiB, 79 s of matching
on the event loop)."""

from __future__ import annotations

import fnmatch
import random

import pytest

from protocol.hub.v1 import hub_pb2
from spoke.catalog.selection import (
    MAX_GLOB_TOTAL_CHARS,
    MAX_MATCH_WORK,
    MAX_WILDCARD_GLOBS,
    PREVIEW_CHARS,
    GlobMatcher,
    describe,
    preview,
    select,
    validate_globs,
)
from spoke.errors import InvalidRequest


def _fnmatch_rule(path: str, globs: list[str]) -> bool:
    """The rule as first written: the glob, or everything under the directory it names."""
    return any(
        fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(path, g.rstrip("/") + "/*")
        for g in globs
    )


def test_the_matcher_selects_what_fnmatchs_rule_selects() -> None:
    rnd = random.Random(39)
    paths = ["a", "a/b", "a/b/c.txt", "ab/c", "a-c", "dir/", "a//b", "[x]", "q?", "d[1]/f"]
    paths += ["".join(rnd.choice("ab/.") for _ in range(rnd.randint(1, 6))) for _ in range(300)]
    cases = [["a"], ["a/"], ["a/b/"], ["a//"], ["*"], ["[[]x]"], ["d[1]/f"], ["?/b", "a-c"]]
    cases += [
        ["".join(rnd.choice("ab/*?.[") for _ in range(rnd.randint(1, 5))) for _ in range(3)]
        for _ in range(2000)
    ]
    checked = 0
    for globs in cases:
        matcher = GlobMatcher(globs)
        for path in paths:
            assert matcher.match(path) == _fnmatch_rule(path, globs), (globs, path)
            checked += 1
    assert checked == len(cases) * len(paths)


def test_select_keeps_regular_files_in_manifest_order() -> None:
    entries = [
        hub_pb2.ManifestEntry(path="d", type=hub_pb2.ENTRY_TYPE_DIRECTORY),
        hub_pb2.ManifestEntry(path="d/x.bin", type=hub_pb2.ENTRY_TYPE_FILE),
        hub_pb2.ManifestEntry(path="d/link", type=hub_pb2.ENTRY_TYPE_SYMLINK),
        hub_pb2.ManifestEntry(path="e/y.bin", type=hub_pb2.ENTRY_TYPE_FILE),
        hub_pb2.ManifestEntry(path="d/z.txt", type=hub_pb2.ENTRY_TYPE_FILE),
    ]
    assert [e.path for e in select(entries, ["d"])] == ["d/x.bin", "d/z.txt"]
    assert [e.path for e in select(entries, ["*.bin"])] == ["d/x.bin", "e/y.bin"]
    assert [e.path for e in select(entries, ["*"])] == ["d/x.bin", "e/y.bin", "d/z.txt"]
    assert select(entries, ["nothing"]) == []


def test_a_request_holds_at_most_its_characters_of_globs() -> None:
    many = ["f" * 4000] * (MAX_GLOB_TOTAL_CHARS // 4000)
    assert validate_globs(many) == many
    with pytest.raises(InvalidRequest, match="characters in all"):
        validate_globs([*many, "f" * 4000])  # the probe: 2,000 globs of 4,000 characters


def test_at_most_so_many_wildcard_globs_and_any_number_of_exact_ones() -> None:
    GlobMatcher([f"d{i}/*" for i in range(MAX_WILDCARD_GLOBS)])
    with pytest.raises(InvalidRequest, match="with a wildcard"):
        GlobMatcher([f"d{i}/*" for i in range(MAX_WILDCARD_GLOBS + 1)])
    exact = GlobMatcher([f"d/f{i}.bin" for i in range(5000)])
    assert exact.wildcards == 0
    exact.check_work(10**9, "ds@v1")  # a set lookup a level, whatever their number
    assert exact.match("d/f4999.bin") and not exact.match("d/f5000.bin")


def test_matching_more_than_the_work_cap_is_refused_before_it_starts() -> None:
    matcher = GlobMatcher(["a*", "b*"])
    matcher.check_work(MAX_MATCH_WORK // 2, "ds@v1")
    with pytest.raises(InvalidRequest, match="too much to match"):
        matcher.check_work(MAX_MATCH_WORK // 2 + 1, "ds@v1")
    everything = GlobMatcher(["a*", "*"])  # "*" takes every file without a match
    assert everything.wildcards == 0
    everything.check_work(10**9, "ds@v1")


def test_matching_leaves_fnmatchs_process_wide_cache_as_it_was() -> None:
    cache = fnmatch._compile_pattern  # type: ignore[attr-defined]
    before = cache.cache_info().currsize
    for i in range(200):  # distinct globs, as the probe sent
        matcher = GlobMatcher([f"x{i}-*{'q' * 100}"])
        assert not matcher.match("d/file.bin")
    assert cache.cache_info().currsize == before


def test_a_pin_or_job_keeps_a_preview_of_its_globs() -> None:
    globs = [f"train/shard-{i:05d}.tar" for i in range(10_000)]
    kept = preview(globs)
    assert kept == globs[: len(kept)] and sum(map(len, kept)) <= PREVIEW_CHARS
    assert len(kept) == PREVIEW_CHARS // len(globs[0])
    assert preview(["f" * 4000]) == ["f" * (PREVIEW_CHARS - 1) + "…"]  # the first, cut
    assert preview(["a", "b"]) == ["a", "b"]
    assert describe(globs) == "['train/shard-00000.tar', 'train/shard-00001.tar', " \
        "'train/shard-00002.tar', … 9997 more]"  # fmt: skip


def test_matching_that_takes_longer_than_its_budget_is_refused() -> None:
    """The eleventh probe: ``*`` and 26 character classes cost 40 µs a path, 100× what
    the work cap assumed; a budget in seconds bounds the time whatever the glob."""
    glob = "*" + "[a-z0-9]" * 26 + "Q"
    entries = [
        hub_pb2.ManifestEntry(path=f"d/{'x' * 120}{i:08d}", type=hub_pb2.ENTRY_TYPE_FILE)
        for i in range(20_000)
    ]
    with pytest.raises(InvalidRequest, match=r"took more than 0\.01 s"):
        select(entries, [glob], budget_s=0.01, what="ds@v1")
    assert select(entries[:10], [glob], budget_s=60) == []  # within it: an answer
    assert len(select(entries, ["d"], budget_s=60)) == 20_000
