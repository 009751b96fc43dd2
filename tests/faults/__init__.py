"""Fault tests: real worker processes killed, stopped and crashed against a real server."""
