"""The HTTP API's endpoints, one router per concern: query, knowledge (create, upload, runs), ops (health,
metrics). Each reads the server's objects from `request.app.state` (set by `lazyhippo.serve.app.create_app`)."""

from __future__ import annotations

from fastapi import HTTPException, Request

from lazyhippo.serve.middleware import Grant
from lazyhippo.settings import check_namespace


def allowed_namespace(request: Request, namespace: str) -> str:
    """The namespace when it is valid and the caller's key covers it; a 400 or 403 otherwise."""
    try:
        check_namespace(namespace)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if not grant_of(request).covers(namespace):
        raise HTTPException(403, f"this key may not use namespace {namespace!r}")
    return namespace


def grant_of(request: Request) -> Grant:
    return request.scope["state"]["grant"]


def visible(request: Request, namespaces: list[str]) -> list[str]:
    grant = grant_of(request)
    return [ns for ns in namespaces if grant.covers(ns)]
