"""Metrics over generated text."""
