"""The fingerprint the plugin's shims keep of the fairseq code they replace or mirror: a test compares it with the
installed fairseq's, so that a change there is reviewed before the shim runs over it."""
import hashlib
import inspect


def source_sha256(*code) -> str:
    """sha256 of the source of ``code`` (functions, methods, classes), joined in order."""
    return hashlib.sha256("".join(inspect.getsource(c) for c in code).encode()).hexdigest()
