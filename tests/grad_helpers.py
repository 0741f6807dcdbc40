"""Catching the gradient on a model's hidden states (shared by the GRPO masking tests).

Usage:
    captured = keep_final_hidden(model)   # before trainer.train()
    (hidden,) = captured                  # the one forward pass that took gradients
    hidden.grad                           # [batch, seq, hidden]: position t's state predicts token t+1
"""


def keep_final_hidden(model) -> list:
    """Hook the final norm of a Llama-style `model`: every output that takes part in the backward pass keeps
    its .grad and is appended to the returned list (no-grad passes, e.g. TRL's old logprobs, are skipped)."""
    captured = []

    def keep_hidden(module, inputs, output):
        if output.requires_grad:
            output.retain_grad()
            captured.append(output)

    model.model.norm.register_forward_hook(keep_hidden)
    return captured
