"""Configuration: the settings, where each value came from, and what a deployment declares.

This package owns everything Fairlane reads from files and the environment, in one
system. ``settings`` is the settings model and its loading (``load_settings``,
``explain_settings`` behind ``fairlane config view``); its sections are ``sections``,
its sources (environment, ``fairlane.toml``, ``pyproject.toml``) ``sources``, and which
source set each value ``origins``. The declarations: ``lanes`` (lane names, a lanes
file's tables, the form of a limit) and ``pools`` (a config file's
admission pools, retry and estimation), whose lanes' classes are written in the one
shape that ``classes`` reads (``legacy`` reads a lanes file's deprecated array shape).
``frontdoor`` is the HTTP gateway's section, its bounds per tenant. ``files`` is the
one TOML reader and ``ConfigError``; ``units`` reads sizes. The package imports only
the policy core, which gives the tables their meaning.
"""
