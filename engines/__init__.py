"""TTS engines that dock into ttsdock.

Import rule (README "Layout"; tests/test_protocol_layering.py checks it): ``engines``
imports ``protocol`` and never ``ttsdock``; each engine package imports
``engines.runtime`` and never another engine.
"""
