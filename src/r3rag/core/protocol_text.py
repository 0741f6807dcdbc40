"""The protocols' fixed text: tags, stop strings and prompt templates. r3rag.core.protocol is the
only reader (it builds every prompt and parses every turn); the strings live here so that the
format's words can be read, and changed, in one place apart from the logic.

Usage:
    from r3rag.core.protocol_text import SEARCH_OPEN, SEARCH_CLOSE, STOP_STRINGS
"""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)
# A `qa` reader's answer counts up to its first line (see `_open_answer`): generating past that
# newline is wasted (an instruct model explains itself until the token limit).
QA_STOP_STRINGS = (ANSWER_CLOSE, "\n")

# Search-R1's instruction (reworded), for instruct or base models that have not seen the protocol.
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as you want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
MINIMAL_TEMPLATE = "Question : {question}\n"

# Reader prompts for prompted baselines: closed-book, and single-shot RAG with the documents first.
QA_SHORT = (
    "with a short phrase (a name, date, number or yes/no) inside <answer> and </answer>, without "
    "explanation. For example, <answer> Beijing </answer>."
)
QA_INSTRUCTION = "Answer the question " + QA_SHORT + "\nQuestion: {question}\n"
QA_DOCS_INSTRUCTION = (
    "Answer the question using the documents below, " + QA_SHORT + "\nDocuments:\n{docs}\n\nQuestion: {question}\n"
)

# IRCoT: one reasoning sentence per turn; each sentence is the next retrieval query.
IRCOT_ANSWER = "So the answer is:"
IRCOT_INSTRUCTION = (
    "Answer the question by reasoning step by step, one sentence at a time. Documents retrieved for the "
    "question and for each of your sentences appear between <information> and </information>. Write only the "
    "next sentence of your reasoning: one short factual sentence based on the documents. When you know the "
    f'answer, write "{IRCOT_ANSWER} <short answer>." where the short answer is a name, date, number or yes/no.\n'
    # IRCoT prompts with demonstrations: one shows the sentence-per-turn shape.
    "Example:\nQuestion: Where was the director of the film Titanic born?\nThe film Titanic was directed by "
    f"James Cameron.\nJames Cameron was born in Kapuskasing, Ontario.\n{IRCOT_ANSWER} Kapuskasing, Ontario.\n\n"
    "Question: {question}\n"
)
# A sentence ends at ". " or ".\n". In a BPE vocabulary ". " is not one token, so the generator's
# decoded-tail check stops one token late; `trim_turn` cuts that token off (and cuts at a newline
# after the sentence's text). A bare "\n" stop is not used: instruct models (SmolLM2) often start
# a turn after the documents with a newline, which would end the turn empty.
IRCOT_STOP_STRINGS = (". ", ".\n")

# R3-RAG's step format.
R3_QUESTION = "The question: {question}\n"
R3_STEP, R3_ANALYSIS, R3_QUERY = "Step {k}:", "The problem analysis:", "The retrieval query:"
R3_ANSWER, R3_DOCS = "The final answer:", "The retrieval documents:"
R3_STOP_STRINGS = (R3_DOCS, "\nStep ")
R3RAG_TEACHER_INSTRUCTION = (
    "You are an expert at answering complex questions by breaking them down into simple steps and searching "
    "a document collection. Work one step at a time. In each step, first write a short problem analysis: what "
    "the question and the documents retrieved so far establish, and what is still missing. Then write exactly "
    "one of:\n- a retrieval query for the one missing fact you need next (a short search query, not the whole "
    "question), or\n- the final answer, as a short phrase (a name, date, number or yes/no), once the documents "
    "are enough.\nIf the documents do not contain what you need, rephrase the query or decompose the problem "
    "differently.\n\nWrite only the next step, in exactly this format:\n"
    "Step {k}:\nThe problem analysis: <analysis>\nThe retrieval query: <query>\n"
    "or\nStep {k}:\nThe problem analysis: <analysis>\nThe final answer: <answer>\n\n{context}"
)
