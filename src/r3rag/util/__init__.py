"""Utilities with no knowledge of the method: `config` (typed settings from YAML), `errors`, `jsonl`,
`durable` (fsync), `journal` (resumable loops), `progress`, `quiet` (library noise off) and `extras`
(optional dependencies).

The ground floor: imports nothing of r3rag outside util/.
"""
