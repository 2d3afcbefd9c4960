"""`sepa-gateway bench mqtt`: readings through Mosquitto into observations, with subscribers on the latest view."""
