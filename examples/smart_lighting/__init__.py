"""The smart lighting of seed 001 §II-D (event negation with a delayed update): see README.md and smart_lighting.py."""
