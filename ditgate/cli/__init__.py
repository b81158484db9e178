"""The ``ditgate`` command line."""
