"""Command-line verbs: each module is a thin wrapper over a public library function."""
