"""The retrieval server keeps freed memory (r3rag.util.heap): a large block freed and allocated again
in a worker thread, as a search does in the server's search thread, faults no pages back in."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

# 48 MB, above glibc's largest dynamic mmap threshold (32 MB): by default each one is mmapped afresh.
SCRIPT = """
import resource, sys, threading
import numpy as np
from r3rag.util.heap import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    sys.exit(3)  # no glibc mallopt here
faults = []
def search_like():
    for _ in range(3):
        block = np.empty(12_000_000, np.float32)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        block.fill(1.0)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        del block
thread = threading.Thread(target=search_like)
thread.start()
thread.join()
print(faults)
"""


def page_faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    if out.returncode == 3:
        pytest.skip("no glibc mallopt on this platform")
    assert out.returncode == 0, out.stderr[-2000:]
    return ast.literal_eval(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt only")
def test_freed_memory_is_reused_without_page_faults() -> None:
    kept, default = page_faults("keep"), page_faults("default")
    assert min(default[1:]) > 100, f"the default allocator should fault the block back in: {default}"
    assert max(kept[1:]) < 10, f"kept memory faulted again: {kept}"
