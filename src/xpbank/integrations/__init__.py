"""Bridges to other libraries' formats and APIs (each an optional extra, imported lazily)."""
