"""The distribution's version, in one place: pyproject.toml reads it (``dynamic``), ``fsm
--version`` prints it, ``fsm.__version__`` is it.  CHANGELOG.md has a section per version."""

__version__ = "0.1.0"
