"""CoAP tools shared by the tests and `sepa-gateway bench coap`: libcoap's client, a lossy relay."""
