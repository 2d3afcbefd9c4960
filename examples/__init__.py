"""Example SEPA applications built on the gateway client API (run them from the repository root)."""
