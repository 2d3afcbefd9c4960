"""``sepa-gateway bench parallel``: the engine's parallel mode measured against its sequential mode."""
