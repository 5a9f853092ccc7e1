"""Spec-Bench-style comparison of drafters against transformers' own generate."""
