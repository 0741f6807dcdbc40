"""Teacher trajectories for the SFT cold start: `teachers` (oracle, LLM endpoint, local model) and
`attempts` (R3-RAG's attempt loop and its verdicts).

May import training/, generation/, core/ and util/.
"""
