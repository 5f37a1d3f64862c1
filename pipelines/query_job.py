"""The `query` job, apart from the asset graph: `lazyhippo query` builds it alone (runner.job_def), without
importing every asset, check and sensor it does not run."""

from typing import Optional, get_args

import dagster as dg
from pydantic import Field, create_model

from lazyhippo.query.config import option_fields

from lazyhippo_dagster.assets._partitions import namespaces
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource, LLMResource


class Turn(dg.Config):
    role: str  # "user" or "assistant"
    content: str


# the query options (lazyhippo.query.QueryOptions) as typed run config: one field each, unset by default
QueryOptionsConfig = create_model("QueryOptionsConfig", __base__=dg.Config, **{
    name: (Optional[get_args(kind)[0]], Field(None, description=text)) for name, kind, text in option_fields()})


class QueryConfig(dg.Config):
    question: str
    route: str = "auto"
    top_k: int = 8
    budget: int = 32000
    history: list[Turn] = []      # earlier turns of a conversation, oldest first
    history_budget: int = 2000    # tokens of history sent along (the newest turns that fit)
    options: QueryOptionsConfig = QueryOptionsConfig()  # over the `lazyhippo` resource's settings


@dg.op(description="Retrieve, assemble a cited context within the token budget, and answer.")
def answer_question(context: dg.OpExecutionContext, config: QueryConfig, lazyhippo: LazyhippoResource,
                    graph_store: GraphStoreResource, llm: LLMResource) -> dict:
    from lazyhippo.query import QueryOptions
    from lazyhippo.query import answer_question as answer
    from lazyhippo.stores.usage import record_answer_usage
    from lazyhippo.stores.warehouse import index_notice
    from lazyhippo_dagster.assets.metadata import llm_usage, table

    options = QueryOptions.from_mapping(config.options.model_dump())
    settings = options.settings(lazyhippo.settings())
    notice = index_notice(settings)  # raises when nothing complete exists; else says what is unfinished
    if notice:
        context.log.warning(notice)
    result = answer(settings, config.question, route=config.route, top_k=config.top_k, budget=config.budget,
                    config=options.config(),
                    ppr=graph_store.store.ppr_backend(settings.namespace), llm=llm.client(settings),
                    history=[t.model_dump() for t in config.history], history_budget=config.history_budget)
    data = result.to_dict()
    record_answer_usage(settings.home, settings.namespace, context.run_id, data["usage"])
    # the answer heads the run page (run tags), not only the step's output event
    context.instance.add_run_tags(context.run_id, {"lazyhippo/question": config.question[:500],
                                                   "lazyhippo/answer": data["answer"][:500],
                                                   "lazyhippo/answerable": str(data["answerable"]).lower(),
                                                   "lazyhippo/route": data["route"]})
    context.add_output_metadata({
        "answer": dg.MetadataValue.md(answer_markdown(config.question, data)), "question": config.question, "route": data["route"],
        "options": dg.MetadataValue.json(options.chosen()),
        "answerable": data["answerable"], "support": data["diagnostics"]["support"]["score"],
        "index_notice": notice or "complete",
        "context_tokens": data["context_tokens"], "budget": config.budget, "chunks": len(data["context"]),
        "chosen_chunks": table([(i + 1, c["title"], c["chunk_id"], round(c["score"], 4), c["tokens"])
                                for i, c in enumerate(data["context"])], ["#", "title", "chunk", "score", "tokens"]),
        **{f"timing_{k}": round(v, 2) for k, v in data.get("timings", {}).items()},
        "history_turns": len(data["history"]), **llm_usage(data["usage"]),
        **({"citations_removed": data["diagnostics"]["citations_removed"]} if "citations_removed" in data["diagnostics"] else {}),
    })
    return data


def answer_markdown(question: str, data: dict) -> str:
    """The question, the whole answer and its numbered citations, as the Markdown the run page shows."""
    cites = [f"{c['n']}. **{c['title']}** ({c['source']}, `{c['chunk_id']}`)" for c in data["citations"] or data["closest"]]
    return "\n\n".join([f"**Question:** {question}", f"**Answer:** {data['answer']}",
                         ("**Citations:**" if data["answerable"] else "**Not answerable; the closest passages:**")
                         + "\n\n" + ("\n".join(cites) or "none")])


@dg.job(partitions_def=namespaces, executor_def=dg.in_process_executor,
        description="Answer one question over a namespace (its partition); launched by `lazyhippo query`.")
def query():
    answer_question()
