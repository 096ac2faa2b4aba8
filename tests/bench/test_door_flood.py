"""bench.door_flood: bad arguments are clear errors; a short run puts gRPC core's cap and
the door (remembering who proved a token, and not) side by side."""

from __future__ import annotations

import pytest

from bench.door_flood import main
from bench.floods import flood_address

pytestmark = pytest.mark.timeout(120)


BAD = [
    ["--rates", "x"], ["--rates", "-5"], ["--addresses", "0"], ["--seconds", "1"],
    ["--networks", "151"], ["--networks", "-1"],
]  # fmt: skip


@pytest.mark.parametrize("argv", BAD)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_short_flood_is_measured_at_both_ports(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rates", "50", "--addresses", "8", "--seconds", "4", "--networks", "2"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()]
    rows = [row for row in rows if len(row) > 3 and row[1].strip().startswith("50 (")]
    assert [row[2].strip() for row in rows] == ["grpc-cap", "door", "door-new"]
    for row in rows[1:]:
        door = row[3].strip().split(" of ")
        assert door[0] == door[1] != "0"  # 50 a second is below the cap: every new peer in


@pytest.mark.parametrize(("addresses", "networks", "sixteens"), [(2000, 0, 8), (25_000, 150, 150)])
def test_the_floods_addresses_are_distinct_and_spread_as_asked(
    addresses: int, networks: int, sixteens: int
) -> None:
    used = [flood_address(n, addresses, networks) for n in range(addresses)]
    assert len(set(used)) == addresses  # each its own address
    assert len({a.rsplit(".", 2)[0] for a in used}) == sixteens
    assert all(0 <= int(octet) < 256 for a in used for octet in a.split("."))
    assert flood_address(addresses, addresses, networks) == used[0]  # round robin
