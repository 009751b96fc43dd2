"""``fairlane demo``: a noisy-neighbor workload run with fairness on, then as plain FIFO.

This package owns the demo and nothing else: :mod:`~fairlane.demo.app` (the app its
worker processes serve, configured from environment variables), :mod:`~fairlane.demo.workload`
(the seeded arrivals), :mod:`~fairlane.demo.submit` (sending them through admission on
time), :mod:`~fairlane.demo.fleet` (the server and worker processes, and
their cleanup), :mod:`~fairlane.demo.stats` (what is measured), :mod:`~fairlane.demo.view`
(the live view and the tables), :mod:`~fairlane.demo.report` (the JSON and SVG files)
and :mod:`~fairlane.demo.runner` (the control flow). The command line is
:mod:`fairlane.cli.demo`.

Nothing is imported here, so that the worker processes, which import
``fairlane.demo.app``, load neither Rich's live view nor the chart library.
"""
