"""Reinforcement learning: `grpo` (TRL's GRPOTrainer with the multi-turn `rollout_func`), its
`settings` and `batch`, `rewards` (plain functions, combined with weights) and `relevance` (R3-RAG's
process reward).

May import evaluation/ (the LLM judge), training/, generation/, retrieval/, data/, core/, util/.
"""
