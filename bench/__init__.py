"""Benchmark commands (``python -m bench.<name>``); see docs/benchmarks.md.

Each writes ``bench/results/<name>.json`` and ``docs/img/<name>*.png``; the data they
generate is cached under ``bench/results/data/``.
"""
