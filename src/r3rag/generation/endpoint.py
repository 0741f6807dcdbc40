"""The settings of an OpenAI-compatible endpoint, one typed class for the settings that name one.

`EndpointSettings` holds the keys a user writes for an endpoint: `endpoint` (base URL), `model`
and `api_key_env`. The LLM judge's `JudgeSpec` (eval's `judge`, rl's `reward.judge`) and eval's
`SystemSpec` (`models.<name>`) extend it: a base class keeps the keys flat where users write them
(`judge.model`, `models.api.endpoint`), so configs and artifact hashes stay as they were.
`synthesize` keeps its own keys (`base_url`, `model`, `api_key_env`, `judge_base_url`, ...): one
stage config holds two endpoints there, and renaming them would break every config that sets them.

Usage:
    spec = JudgeSpec(endpoint="http://127.0.0.1:8000/v1", model="qwen")
    client = spec.client("eval.judge", concurrency=spec.concurrency)   # a ChatClient, or one-line UserError
"""

from __future__ import annotations

from dataclasses import dataclass

from r3rag.util.errors import UserError


@dataclass
class EndpointSettings:
    endpoint: str = ""  # OpenAI-compatible base URL ("" = no endpoint)
    model: str = ""  # the endpoint's model name (required with an endpoint)
    api_key_env: str = ""  # name of the environment variable holding the key ("" = none; the key is never stored)

    def client(self, where: str, purpose: str = "", **options):
        """A ChatClient for this endpoint (`options`: its concurrency, timeout, ...). Without an endpoint or
        model: one line naming `where` (the settings' place, e.g. "rl.reward.judge") and `purpose`."""
        if not self.endpoint or not self.model:
            raise UserError(
                f"{where}: set endpoint and model (an OpenAI-compatible server){f' {purpose}' if purpose else ''}"
            )
        from r3rag.generation.openai_client import ChatClient  # the openai SDK: only once an endpoint is used

        return ChatClient(self.endpoint, self.model, api_key_env=self.api_key_env, **options)
