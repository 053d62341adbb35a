"""How the cluster token travels on a gRPC call: one metadata entry, the same
on the HA stream a slave opens and on every broker RPC a client makes.

It lives in ha/ because the slave sends it; the token's file handling and
the server's check (cluster/node/auth.py) build on it from the layer above."""

from __future__ import annotations

TOKEN_METADATA_KEY = "x-dlab-token"


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((TOKEN_METADATA_KEY, token),)
