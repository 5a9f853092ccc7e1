"""Suffix-array datastores: record formats, building, the on-disk format and search."""
