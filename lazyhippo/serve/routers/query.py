"""Queries over the warm indexes: any route, and the fixed global route."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, create_model, model_validator

from lazyhippo.query import ROUTES, QueryOptions, RerankUnavailable
from lazyhippo.query.config import option_fields
from lazyhippo.serve.limits import text_problem
from lazyhippo.serve.pool import UnknownNamespace
from lazyhippo.serve.routers import allowed_namespace, visible

log = logging.getLogger("lazyhippo.api")
router = APIRouter()


class Turn(BaseModel):
    role: Literal["user", "assistant"]
    content: str = Field(max_length=4000)


class OptionFields(create_model("QueryOptionFields", **{
        name: (kind, Field(None, description=text)) for name, kind, text in option_fields()})):
    """The query options (lazyhippo.query.QueryOptions), checked as a whole: a bad one is a 422 naming it."""

    @model_validator(mode="after")
    def _valid(self):
        QueryOptions.from_mapping(self.options())
        return self

    def options(self) -> dict:
        return self.model_dump(include={name for name, _, _ in option_fields()}, exclude_none=True)


class QueryRequest(OptionFields):
    question: str
    namespace: str = "default"
    route: str = "auto"
    top_k: int = Field(8, ge=1)
    budget: int = Field(32000, ge=1)
    history: list[Turn] = Field(default_factory=list, description="Earlier turns, oldest first: sent to the LLM with "
                                "the question (the newest that fit its budget) and used to make a follow-up standalone.")


class FixedRouteRequest(OptionFields):
    question: str
    namespace: str = "default"
    top_k: int = Field(8, ge=1)
    budget: int = Field(32000, ge=1)


def run_query(request: Request, question: str, namespace: str, route: str, top_k: int, budget: int,
              history: list[Turn] = (), choices: dict | None = None) -> JSONResponse:
    pool, limits = request.app.state.pool, request.app.state.limits
    if route != "auto" and route not in ROUTES:
        raise HTTPException(400, f"unknown route {route!r} (expected auto or one of {', '.join(ROUTES)})")
    request.state.route = route  # a metrics label: only known routes, so the label set stays bounded
    allowed_namespace(request, namespace)
    question = question.strip()
    if not question:
        raise HTTPException(400, "question is empty")
    if len(question) > limits.max_question_chars:
        raise HTTPException(413, f"question is {len(question)} characters; the limit is {limits.max_question_chars}")
    if top_k > limits.max_top_k:
        raise HTTPException(400, f"top_k {top_k} is over the limit {limits.max_top_k}")
    if budget > limits.max_budget:
        raise HTTPException(400, f"budget {budget} is over the limit {limits.max_budget} tokens")
    if len(history) > limits.max_history:
        raise HTTPException(400, f"history has {len(history)} turns; the limit is {limits.max_history}")
    if problem := text_problem("question", question):  # (a history turn's own validation refuses it)
        raise HTTPException(400, problem)
    try:
        result = pool.answer(namespace, question, route, top_k, budget, history=[t.model_dump() for t in history],
                             choices=choices)
    except UnknownNamespace:
        known = ", ".join(visible(request, pool.namespaces())) or "none"
        raise HTTPException(404, f"unknown namespace {namespace!r} (known: {known})") from None
    except RerankUnavailable as exc:  # a reranker this server has no endpoint or model for
        raise HTTPException(400, str(exc)) from None
    except Exception:  # noqa: BLE001 - the client gets a 503, the log gets the details
        log.exception("query failed in namespace %s", namespace)
        raise HTTPException(503, "query backend unavailable; retry later") from None
    data = result.to_dict()
    data["question"] = question
    notice = pool.notice(namespace)
    if notice:  # the latest index run is unfinished, failed or was killed: the answer is from an older index
        data["notice"] = notice
    request.state.route = data["route"]
    # LLM tokens of this answer (per operation and model in the body's `usage`)
    tokens = {"X-Token-Input": str(data["tokens"]["input"]), "X-Token-Output": str(data["tokens"]["output"])}
    return JSONResponse(data, headers=tokens)  # already plain JSON types: skips FastAPI's slower generic encoder


@router.get("/api/namespaces", tags=["knowledge graphs"])
def namespaces(request: Request) -> dict:
    return {"namespaces": visible(request, request.app.state.pool.namespaces())}


@router.post("/api/query", tags=["query"])
def query(body: QueryRequest, request: Request) -> JSONResponse:
    """Any route (auto, local, global) with any query option (docs/query-routes.md):
    the JSON of `lazyhippo query --json`."""
    return run_query(request, body.question, body.namespace, body.route, body.top_k, body.budget, body.history,
                     body.options())


@router.post("/api/kg/qa", tags=["query"])
def kg_qa(body: FixedRouteRequest, request: Request) -> JSONResponse:
    """The global route: an answer from community evidence."""
    return run_query(request, body.question, body.namespace, "global", body.top_k, body.budget,
                     choices=body.options())

