"""The smart-city lighting benchmark of seed 001 (§IV-V): knowledge base, profiles, runner, KPIs."""
