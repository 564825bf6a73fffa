"""Benchmarks that print figures (``scheduler bench ...``) and need more than one part of the
scheduler (the client SDK and the router).
"""
