"""Training: `helpers` (tokenising trajectories, LoRA, saving policies), `trainers` (TRL subclasses),
`modeling` (models and tokenizers), `model_import` (GGUF), `checkpoints` (resumable work dirs) and
`observe` (metrics, rollout samples and curves of a training run).

May import core/ and util/.
"""
