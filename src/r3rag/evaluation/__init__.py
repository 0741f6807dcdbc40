"""Evaluation: `systems` (what eval runs), `predictions` (rows and summaries), `tables` (per data set,
paired comparisons), `resume`, `judge` (LLM answer judge), `report` and `browser` (the table, chart
and HTML viewer, and its headless-Chromium check).

May import training/, generation/, core/ and util/.
"""
