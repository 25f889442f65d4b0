"""Benchmarks of tritonsoftmax against its peers (run from the repository root: python -m bench.<name>)."""
