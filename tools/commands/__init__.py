"""``sepa-gateway bench ...``: the benchmark commands, a plug-in of the command line.

They live with the benchmarks they run (tools/), not in the appliance: the appliance's CLI finds
them through the ``sepa_gateway.commands`` entry point (pyproject.toml), so gateway/ never imports
tools/ and an installation without the tools still has a working ``sepa-gateway``.
"""
