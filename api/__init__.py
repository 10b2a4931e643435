"""The Skrull planning service: REST API, durable job store, solver processes and the worker-side client.

Imports the planning library (``solver``); the library never imports this package.
"""
