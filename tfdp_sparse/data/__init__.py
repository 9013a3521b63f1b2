"""Data: Criteo schema (``criteo_schema``), TSV reader (``criteo``), synthetic generator (``synthetic``)."""
