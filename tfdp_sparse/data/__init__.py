"""Data: Criteo schema (``criteo_schema``), TSV reader (``criteo``: lines in ``criteo_lines``,
vocabulary files in ``criteo_vocabularies``), synthetic generator (``synthetic``: ``synthetic_config``,
``zipf``, ``synthetic_model``, ``auc``, ``synthetic_batches``) and MovieLens (``movielens``:
``movielens_ratings``, ``movielens_catalogue``, ``movielens_vocabulary``, ``movielens_examples``,
``movielens_synthetic``).  The facade modules re-export every public name of their parts."""
