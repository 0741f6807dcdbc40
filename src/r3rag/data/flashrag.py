"""FlashRAG's (and the Hugging Face `datasets`) layout of multi-hop QA rows, in the layout the importers read.

FlashRAG's files on the hub (RUC-NLPIR/FlashRAG_datasets) are `{"id", "question", "golden_answers",
"metadata"}` rows whose metadata keeps the source data set's fields as the `datasets` library
stores them, column by column:

    hotpotqa:         "context": {"title": [...], "sentences": [[...], ...]},
                      "supporting_facts": {"title": [...], "sent_id": [...]}, "type", "level"
    2wikimultihopqa:  "context": {"title": [...], "content": [[...], ...]}, "supporting_facts" as above
    musique:          "question_decomposition": [{"question", "answer", "paragraph_support_idx",
                      "support_paragraph": {"title", "paragraph_text", ...}}, ...] (each hop's gold
                      paragraph only; no distractors)

The importers read HotpotQA's original row layout (`context: [[title, [sentences]], ...]`,
`supporting_facts: [[title, sent_id], ...]`) and MuSiQue's `paragraphs`. `normalize_layout` turns
the column layout into those (at the top of a row, as `datasets` exports hotpot_qa, and inside
`metadata`, as FlashRAG keeps it), and each hop's `support_paragraph` into `paragraphs`; anything
else is left as it is, for the importers to accept or refuse. Lists of `{"title", "sentences"}`
objects (how newer `datasets` versions export the same columns) are read too.

Usage:
    row = normalize_layout(row)          # r3rag.data.importers.convert_record calls it on every row
"""

from __future__ import annotations


def normalize_layout(row: dict) -> dict:
    out = _fields(row)
    if isinstance(row.get("metadata"), dict):
        out["metadata"] = _fields(row["metadata"])
    return out


def _fields(d: dict) -> dict:
    out = dict(d)
    if (context := _pairs(d.get("context"), ("sentences", "content"))) is not None:
        out["context"] = context
    if (facts := _pairs(d.get("supporting_facts"), ("sent_id",))) is not None:
        out["supporting_facts"] = facts
    if "paragraphs" not in d and "context" not in d:
        paragraphs, steps = _hop_paragraphs(d.get("question_decomposition"))
        if paragraphs:
            out["paragraphs"], out["question_decomposition"] = paragraphs, steps
    return out


def _pairs(value, second: tuple[str, ...]) -> list | None:
    """{"title": [...], "<second>": [...]} or [{"title", "<second>"}, ...] -> [[title, second], ...];
    None when `value` is neither (the original layout, or something the importers will refuse)."""
    if isinstance(value, dict) and isinstance(value.get("title"), list):
        key = next((k for k in second if isinstance(value.get(k), list)), None)
        if key is not None and len(value[key]) == len(value["title"]):
            return [[t, s] for t, s in zip(value["title"], value[key], strict=True)]
    if isinstance(value, list) and value and all(isinstance(v, dict) and "title" in v for v in value):
        key = next((k for k in second if all(k in v for v in value)), None)
        if key is not None:
            return [[v["title"], v[key]] for v in value]
    return None


def _hop_paragraphs(steps) -> tuple[list[dict], list]:
    """MuSiQue hops that carry their gold paragraph -> (paragraphs, the hops without the copy)."""
    if not isinstance(steps, list) or not any(isinstance(s, dict) and "support_paragraph" in s for s in steps):
        return [], steps
    paragraphs, seen, slim = [], set(), []
    for step in steps:
        para = step.get("support_paragraph") if isinstance(step, dict) else None
        if isinstance(para, dict):
            title, text = para.get("title", ""), para.get("paragraph_text", para.get("text", ""))
            if (title, text) not in seen:  # two hops may rest on the same paragraph
                seen.add((title, text))
                idx = para.get("idx", step.get("paragraph_support_idx", len(paragraphs)))
                paragraphs.append({"idx": idx, "title": title, "text": text, "is_supporting": True})
            step = {k: v for k, v in step.items() if k != "support_paragraph"}
        slim.append(step)
    return paragraphs, slim
