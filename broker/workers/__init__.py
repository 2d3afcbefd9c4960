"""Query workers: processes holding replicas of the store, where a time limit stops an evaluation."""
