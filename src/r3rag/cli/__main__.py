"""`python -m r3rag.cli` (what `accelerate launch -m r3rag.cli` starts): the `r3rag` command."""

import sys

from r3rag.cli.app import main

sys.exit(main())
