"""Sequence lengths without data: real-shaped length distributions and requests synthesized from them.

``datasets`` samples the bundled ``distributions/*.json`` (percentile tables of real traces, mixtures of
published shapes) into requests; reading lengths from real SFT data is ``skrull.corpus``'s job.
"""
