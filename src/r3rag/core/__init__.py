"""What every layer shares: `protocol` and `protocol_text` (the only place that builds prompts and
parses model output), `env` (the rollout loop), `artifacts` and `build_lock` (versioned artifacts),
`metrics` (answer metrics) and `gold_docs` (which documents are gold).

May import util/ only.
"""
