"""Configuration: settings and where each value came from (``settings``), and what a
deployment declares in TOML besides them: lanes and their classes (``lanes``), admission
pools, estimation and retry (``pools``)."""
