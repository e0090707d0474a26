"""``ttsdock kokoro-convert``: a Kokoro torch checkpoint -> every file the engine loads.

Rule 1: this package needs torch and the official ``kokoro`` package (hexgrad)
for the model code, ``coremltools`` only for ``--coreml``; the engine never
imports it (it reads what this package writes through ``engines.kokoro.converted``).
Rule 2: nothing here downloads anything: the checkpoint, config and voices are
the user's files, and ``KModel`` is always built from them.
"""
