"""The error raised when a cross-check's library cannot be imported."""


class CrossCheckUnavailable(ImportError):
    """A library a cross-check needs (TF Privacy, TFRS) is missing or fails to import.

    Example: ``load_tf_privacy()`` without ``tensorflow-privacy`` installed
    raises ``CrossCheckUnavailable("tensorflow-privacy is needed ...: pip
    install -r requirements.txt")``.
    """
