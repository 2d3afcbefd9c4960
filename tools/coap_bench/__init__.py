"""``sepa-gateway bench coap``: confirmable CoAP readings into observations, beside the MQTT figure."""
