"""Text from a language model: the generation backends behind one small interface (see
`r3rag.core.env.Generator`), and the OpenAI-compatible client with its settings.

- `HFGenerator`: a local transformers model, batched, left-padded, stopping per row on
  the protocol's stop strings.
- `ScriptedGenerator`: replays fixed texts (tests) or follows a script function (the oracle teacher).
- `ChatGenerator` (openai_chat): an OpenAI-compatible chat endpoint, as a policy or a teacher.
- `openai_client.ChatClient`: any `/v1/chat/completions` endpoint (DeepSeek, vLLM, SGLang...), many
  requests in flight, retries; `endpoint.EndpointSettings`: the keys that name one. The LLM judge
  and API teachers reach their endpoints through them too: one package for every call to a model.
- `LLMGenerator` (vllm): vLLM in-process; `prefix_cache`: the KV cache kept between turns.

May import core/ and util/.
"""
