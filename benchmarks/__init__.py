"""The benchmarks of docs/benchmarks.md: one module per section, and the runner (`python -m benchmarks.run`).

They live in the checkout, not in the installed package: `pip install .` ships the library only.
"""
