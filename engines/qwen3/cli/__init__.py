"""The four commands: ``ttsdock qwen3`` (``dock``), ``qwen3-synth`` (``synth``),
``qwen3-convert`` (``convert``) and ``qwen3-clone-prompt`` (``clone``)."""
