"""Narwhal: an SLO-aware HTTP router for OpenAI-compatible LLM inference engines."""

__version__ = "0.1.0"
DISTRIBUTION = "narwhal-router"  # the name on the package index (`narwhal` is another's)


def installed_version() -> str:
    """The installed distribution's version (pyproject's), else the package's own: what
    `narwhal --version` prints and `narwhal_build_info{version}` carries."""
    # Imported here: importlib.metadata loads sockets and email parsing, which importing
    # the sans-IO protocol package (and so this one) must not.
    import importlib.metadata

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return __version__
