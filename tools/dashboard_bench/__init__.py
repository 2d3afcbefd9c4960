"""The dashboard against a gateway started as the installed service starts it: the browser tests'
setup (`installed.py`) and the responsiveness benchmark (`runner.py`, `sepa-gateway bench dashboard`)."""
