"""TTS engines that dock into ttsdock.

Import rule (DESIGN.md): ``engines`` imports ``protocol`` and never ``ttsdock``;
each engine package imports ``engines.runtime`` and never another engine.
"""
