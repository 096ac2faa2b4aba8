"""``strata-hub token``: create, list, revoke and migrate the hub's bearer tokens.

```
strata-hub token create  --tokens FILE --dataset DS [--dataset DS2 ...] [--expires 30d]
strata-hub token list    --tokens FILE
strata-hub token revoke  --tokens FILE TOKEN_ID
strata-hub token migrate --tokens FILE        # a plain token file -> the managed format
```

``create`` prints the secret on stdout, once, and the token's id and expiry on stderr;
only its SHA-256 is stored (:mod:`hub.auth.tokenstore`). A serving hub uses the changed file
from its next call on, without a restart.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from hub.auth.tokenstore import create, entries, migrate, parse_duration, revoke
from hub.cli.options import say

token_app = typer.Typer(
    name="token",
    help="Bearer tokens of `strata-hub serve --tokens FILE` (only their hashes are stored).",
    no_args_is_help=True,
)

TokensOption = Annotated[
    Path,
    typer.Option(
        "--tokens",
        envvar="STRATA_HUB_TOKENS",
        help="The token file (the one `serve --tokens` reads).",
        show_default=False,
    ),
]


@token_app.command("create")
def create_command(
    tokens: TokensOption,
    dataset: Annotated[
        list[str],
        typer.Option("--dataset", help='Dataset (glob) the token may read; "*" for all.'),
    ],
    expires: Annotated[
        str | None,
        typer.Option("--expires", help="Lifetime, e.g. 30d, 12h, 1w (default: never)."),
    ] = None,
) -> None:
    """Create a token; prints its secret once (it cannot be shown again)."""
    lifetime = parse_duration(expires) if expires is not None else None
    token_id, secret = create(tokens, dataset, lifetime)
    print(secret, flush=True)
    until = (
        f"expires {datetime.datetime.now(datetime.UTC) + lifetime:%Y-%m-%d %H:%M} UTC"
        if lifetime is not None
        else "never expires"
    )
    say(f"token {token_id} may read {', '.join(dataset)}; {until}; store the secret now")


@token_app.command("list")
def list_command(tokens: TokensOption) -> None:
    """List tokens: id, datasets, created, expires, state (never a secret)."""
    now = datetime.datetime.now(datetime.UTC)
    print(f"{'ID':<14} {'STATE':<8} {'EXPIRES (UTC)':<17} {'CREATED (UTC)':<17} DATASETS")
    for info in entries(tokens):
        expires = f"{info.expires:%Y-%m-%d %H:%M}" if info.expires else "never"
        created = f"{info.created:%Y-%m-%d %H:%M}" if info.created else "-"
        print(
            f"{info.id:<14} {info.state(now):<8} {expires:<17} {created:<17} "
            f"{','.join(info.datasets)}"
        )


@token_app.command("revoke")
def revoke_command(
    tokens: TokensOption,
    token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID", help="The id `list` shows.")],
) -> None:
    """Revoke a token: a serving hub refuses it from its next call on."""
    revoke(tokens, token_id)
    say(f"token {token_id} revoked")


@token_app.command("migrate")
def migrate_command(tokens: TokensOption) -> None:
    """Rewrite a plain token file (token -> datasets) with hashes only; secrets keep working."""
    ids = migrate(tokens)
    say(f"{tokens}: {len(ids)} tokens now stored as hashes ({', '.join(ids)})")
