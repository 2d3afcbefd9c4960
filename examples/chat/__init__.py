"""The chat of seed 000 §5.4: see README.md and chat.py."""
