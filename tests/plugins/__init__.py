"""Mechanisms defined outside the library, for tests that plug them into the registry."""
