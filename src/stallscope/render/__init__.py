"""Renderers: read a Session and its Analysis, produce text or files. They never compute findings."""
