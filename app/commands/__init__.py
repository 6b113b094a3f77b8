"""Sub-commands of the ``fedrec`` CLI; each module exposes ``register(subparsers)``."""
