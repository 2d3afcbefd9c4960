"""The ontologies the gateway loads at start-up (Turtle files shipped with the package)."""
