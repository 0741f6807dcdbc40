"""Clients for language models behind HTTP APIs.

- `openai_client.ChatClient`: any OpenAI-compatible `/v1/chat/completions` endpoint (DeepSeek,
  vLLM, SGLang, ...) through the official `openai` SDK, many requests in flight, retries with
  backoff; one failed request is a `ChatFailure` value, never an exception.
"""
