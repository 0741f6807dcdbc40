"""Generation backends behind one small interface (see `r3rag.core.env.Generator`).

- `HFGenerator`: a local transformers model, batched, left-padded, stopping per row on
  the protocol's stop strings.
- `ScriptedGenerator`: replays fixed texts (tests) or follows a script function (the oracle teacher).
- `ChatGenerator` (openai_chat): an OpenAI-compatible chat endpoint, as a policy or a teacher.
"""
